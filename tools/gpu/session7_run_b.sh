# Session 7, run B (issue 13): tutorial 05 top to bottom with step 8 (sgemm_cp), the SGEMM GPU checks and sanitizer
# runs (every step and configuration on awkward shapes), the cluster tests (16-block clusters, max_active_clusters),
# and benchmarks/matmul.py's SGEMM table.
LOGS=/tmp/s7b; WITH_KERNEL=1; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step nb05 200 python3 tools/gpu/run_notebooks.py $LOGS notebooks/05-matmul.py
step tests 200 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short -s tests/gpu/test_matmul_gpu.py tests/gpu/test_tma_gpu.py -k "sgemm or cluster"
step bench 150 python3 benchmarks/matmul.py --only sgemm
export OUT=$OUT_DIR
cp $LOGS/*.ipynb $OUT/ 2>/dev/null
tar czf $OUT/s7b.tgz -C /tmp s7b
tail -3 $LOGS/nb05.log; grep -E "passed|failed|max active" $LOGS/tests.log | tail -3; tail -25 $LOGS/bench.log
