# Session 8, run J: one warp polls the exchange's mbarrier (the others wait at a block barrier) against every thread
# polling (try_exchange --baseline spin), the cluster GPU tests (compute-sanitizer), then tutorials 03 and 04 top to
# bottom with it.
LOGS=/tmp/s8j; WITH_KERNEL=1; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step tests 120 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short tests/gpu/test_memory_bound_gpu.py -k "cluster or 100003 or 20000"
step spin 150 python3 tools/gpu/try_exchange.py --baseline spin --shapes 1024x262144,3x100003 --no-compile
step nb03 150 python3 tools/gpu/run_notebooks.py $LOGS notebooks/03-reductions-softmax.py
step nb04 170 python3 tools/gpu/run_notebooks.py $LOGS notebooks/04-layernorm.py
export OUT=$OUT_DIR
cp $LOGS/*.ipynb $OUT/ 2>/dev/null
tar czf $OUT/s8j.tgz -C /tmp s8j
grep -E "passed|failed" $LOGS/tests.log | tail -3; sed -n '/^op /,$p' $LOGS/spin.log | grep -v "^$"; tail -2 $LOGS/nb03.log; tail -2 $LOGS/nb04.log
