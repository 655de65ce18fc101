# Session 9, run F (issue 14): bf16 LayerNorm 1024 x 262144's cluster plans again with changes 1, 2 and 2' in the
# cell, then benchmarks/memory_bound.py's table with the final cells.
LOGS=/tmp/s9f; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step plans 100 python3 tools/gpu/try_norms.py --only "layernorm bfloat16 1024x262144" --variants "c4 x,c8 x,c16 x" --no-compile
step mb 200 python3 benchmarks/memory_bound.py --no-ladders
export OUT=$OUT_DIR
tar czf $OUT/s9f.tgz -C /tmp s9f
sed -n '/^op  /,$p' $LOGS/plans.log | grep -v '^$'; tail -45 $LOGS/mb.log
