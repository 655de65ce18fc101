# Session 5, run D: the peaky-scores test per step (issue 12), 3 K/V stages for step 3b at d = 64, and the fp32 norm
# candidates (issue 14).
LOGS=/tmp/s5d; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step peaky 100 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=line tests/gpu/test_attention_steps_gpu.py -k peaky
step stages 100 python3 tools/gpu/try_fa3p_stages.py
step norms 150 python3 tools/gpu/try_norms.py --only "float32 4096x32768,float32 4096x1024" --variants pipe,2read
export OUT=$OUT_DIR
tar czf $OUT/s5d.tgz -C /tmp s5d
tail -6 $LOGS/peaky.log; tail -9 $LOGS/stages.log; tail -30 $LOGS/norms.log
