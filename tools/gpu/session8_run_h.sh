# Session 8, run H (issue 14): benchmarks/memory_bound.py's table (no ladders: the notebooks have them), then what
# the L2 flush's dirty lines cost the small shapes (tools/gpu/flush_effect.py).
LOGS=/tmp/s8h; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step mb 330 python3 benchmarks/memory_bound.py --no-ladders
step flush 120 python3 tools/gpu/flush_effect.py
export OUT=$OUT_DIR
tar czf $OUT/s8h.tgz -C /tmp s8h
tail -45 $LOGS/mb.log; sed -n '/^dtype/,$p' $LOGS/flush.log
