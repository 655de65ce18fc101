# Session 6, run B (issue 14): tutorials 03 and 04 top to bottom (both sweeps now float32 too), their GPU tests.
LOGS=/tmp/s6b; WITH_KERNEL=1; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step tests 150 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short tests/gpu/test_memory_bound_gpu.py
step nb03 220 python3 tools/gpu/run_notebooks.py $LOGS notebooks/03-reductions-softmax.py
step nb04 220 python3 tools/gpu/run_notebooks.py $LOGS notebooks/04-layernorm.py
export OUT=$OUT_DIR
cp $LOGS/*.ipynb $OUT/ 2>/dev/null
tar czf $OUT/s6b.tgz -C /tmp s6b
tail -3 $LOGS/tests.log; tail -3 $LOGS/nb03.log; tail -3 $LOGS/nb04.log
