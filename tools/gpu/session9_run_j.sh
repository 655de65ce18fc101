# Session 9, run J (issue 14): change 3 (bf16 cluster kernels prefetch w and b into L1) against the committed cells
# (tools/gpu/before3/, untracked), the memory-bound GPU tests, tutorial 04 top to bottom.
LOGS=/tmp/s9j; WITH_KERNEL=1; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step ch3 100 python3 tools/gpu/try_exchange.py --baseline tools/gpu/before3 --no-compile --ops layernorm,rmsnorm --shapes 1024x262144,48x65536,4096x32768
step tests 100 python3 -m pytest -p no:cacheprovider -m gpu -q -x -rf --tb=short tests/gpu/test_memory_bound_gpu.py
step nb04 170 python3 tools/gpu/run_notebooks.py $LOGS notebooks/04-layernorm.py
export OUT=$OUT_DIR
cp $LOGS/*.ipynb $OUT/ 2>/dev/null
tar czf $OUT/s9j.tgz -C /tmp s9j
sed -n '/^op /,$p' $LOGS/ch3.log | grep -v "^$" | grep -v "torch eager"; tail -2 $LOGS/tests.log; tail -2 $LOGS/nb04.log
