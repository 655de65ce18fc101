# Session 5, run F: tutorial 06 with the TMA-store epilogue (issue 13): the matmul GPU tests (never run before), the
# Hopper sweep of benchmarks/matmul.py, and the notebook top to bottom.
LOGS=/tmp/s5f; WITH_KERNEL=1; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step tests 200 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short tests/gpu/test_matmul_gpu.py
step bench 90 python3 benchmarks/matmul.py --quick --only hopper
step nb06 200 python3 tools/gpu/run_notebooks.py $LOGS notebooks/06-tensor-cores.py
export OUT=$OUT_DIR
tar czf $OUT/s5f.tgz -C /tmp s5f
tail -12 $LOGS/tests.log | grep -v "^  " ; tail -14 $LOGS/bench.log; tail -2 $LOGS/nb06.log
