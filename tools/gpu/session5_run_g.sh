# Session 5, run G: tutorial 06 with the mma.sync pipeline at BK = 64, 3 stages (issue 13), its GPU tests.
LOGS=/tmp/s5g; WITH_KERNEL=1; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step tests 150 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short tests/gpu/test_matmul_gpu.py -k "mma_pipe or tensor_core"
step bench 120 python3 benchmarks/matmul.py --only tc
step nb06 200 python3 tools/gpu/run_notebooks.py $LOGS notebooks/06-tensor-cores.py
export OUT=$OUT_DIR
tar czf $OUT/s5g.tgz -C /tmp s5g
tail -3 $LOGS/tests.log; grep -E "mma_pipe|^family" $LOGS/bench.log | tail -16; tail -2 $LOGS/nb06.log
