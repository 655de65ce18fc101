# Session 8, run E (issue 14): the GPU tests of tutorials 03/04 and of compiled 16-block clusters, then both
# tutorials top to bottom (the st.async exchange, plain-sum LayerNorm statistics, 16-block clusters).
LOGS=/tmp/s8e; WITH_KERNEL=1; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step tests 200 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short tests/gpu/test_memory_bound_gpu.py tests/gpu/test_tma_gpu.py -k "not tma_tile and not profile"
step nb03 180 python3 tools/gpu/run_notebooks.py $LOGS notebooks/03-reductions-softmax.py
step nb04 200 python3 tools/gpu/run_notebooks.py $LOGS notebooks/04-layernorm.py
export OUT=$OUT_DIR
cp $LOGS/*.ipynb $OUT/ 2>/dev/null
tar czf $OUT/s8e.tgz -C /tmp s8e
grep -E "passed|failed" $LOGS/tests.log | tail -3; tail -3 $LOGS/nb03.log; tail -3 $LOGS/nb04.log
