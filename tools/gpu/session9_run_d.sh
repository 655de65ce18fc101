# Session 9, run D (issue 14): change 2' (RMSNorm's guard-free path only with 8 packs) against change 2's cells
# (tools/gpu/before2/, untracked), other plans for RMSNorm bf16 4096 x 1024, the memory-bound GPU tests, tutorial 04.
LOGS=/tmp/s9d; WITH_KERNEL=1; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step ch2b 100 python3 tools/gpu/try_exchange.py --baseline tools/gpu/before2 --no-compile --rep-ms 40 --ops rmsnorm --shapes 4096x1024,4096x4096,1024x262144
step plans 100 python3 tools/gpu/try_norms.py --only "rmsnorm bfloat16 4096x1024" --rep-ms 40
step tests 100 python3 -m pytest -p no:cacheprovider -m gpu -q -x -rf --tb=short tests/gpu/test_memory_bound_gpu.py
step nb04 170 python3 tools/gpu/run_notebooks.py $LOGS notebooks/04-layernorm.py
export OUT=$OUT_DIR
cp $LOGS/*.ipynb $OUT/ 2>/dev/null
tar czf $OUT/s9d.tgz -C /tmp s9d
sed -n '/^op /,$p' $LOGS/ch2b.log | grep -v "^$" | grep -v "torch eager"; sed -n '/^op  /,$p' $LOGS/plans.log | grep -v '^$'; tail -2 $LOGS/tests.log; tail -2 $LOGS/nb04.log
