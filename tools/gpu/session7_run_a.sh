# Session 7, run A: issue 13's SGEMM candidates (cp3, lean) against the default and torch.mm, and issue 14's resident
# norm clusters: their GPU tests (with the 16-block cluster launch and max_active_clusters), then the table rows
# against the one-row-a-cluster plans they replace, torch eager and torch.compile.
LOGS=/tmp/s7a; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step tests 150 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short -s tests/gpu/test_memory_bound_gpu.py tests/gpu/test_tma_gpu.py -k "norm or cluster"
step sgemm 180 python3 tools/gpu/try_sgemm.py --only s7
step mb 230 python3 benchmarks/memory_bound.py --no-ladders --ops layernorm,rmsnorm --shapes 1024x262144,2048x131072,300x40000
export OUT=$OUT_DIR
tar czf $OUT/s7a.tgz -C /tmp s7a
grep -E "passed|failed|max active" $LOGS/tests.log | tail -4; tail -22 $LOGS/sgemm.log; tail -22 $LOGS/mb.log
