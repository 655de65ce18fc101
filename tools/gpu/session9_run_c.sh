# Session 9, run C (issue 14): change 2 against change 1 again at 4096 x 4096 with longer timing (run B: LayerNorm
# +2 %, RMSNorm -2 %), then tutorials 03 and 04 top to bottom with changes 1 and 2, and benchmarks/memory_bound.py's
# table.
LOGS=/tmp/s9c; WITH_KERNEL=1; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step again 90 python3 tools/gpu/try_exchange.py --baseline tools/gpu/before1 --no-compile --rep-ms 40 --ops layernorm,rmsnorm --shapes 4096x4096
step nb03 150 python3 tools/gpu/run_notebooks.py $LOGS notebooks/03-reductions-softmax.py
step nb04 170 python3 tools/gpu/run_notebooks.py $LOGS notebooks/04-layernorm.py
step mb 170 python3 benchmarks/memory_bound.py --no-ladders
export OUT=$OUT_DIR
cp $LOGS/*.ipynb $OUT/ 2>/dev/null
tar czf $OUT/s9c.tgz -C /tmp s9c
sed -n '/^op /,$p' $LOGS/again.log | grep -v "^$" | grep -v "torch eager"; tail -2 $LOGS/nb03.log; tail -2 $LOGS/nb04.log; tail -45 $LOGS/mb.log
