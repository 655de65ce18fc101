# Session 5, run C (and E, after 3 K/V stages at d = 64): tutorial 07 with step 3b, its benchmark and GPU tests (issue 12).
LOGS=/tmp/s5c; WITH_KERNEL=1; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step bench 170 python3 benchmarks/attention.py --no-check
step tests 170 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short tests/gpu/test_attention_steps_gpu.py
step nb07 230 python3 tools/gpu/run_notebooks.py $LOGS notebooks/07-fused-attention.py
export OUT=$OUT_DIR
tar czf $OUT/s5c.tgz -C /tmp s5c
tail -45 $LOGS/bench.log | grep -v "^fa[0-9p]*_" ; tail -4 $LOGS/tests.log; tail -2 $LOGS/nb07.log
