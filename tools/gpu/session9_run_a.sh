# Session 9, run A (issue 14): the cells with shifts for the divisions (change 1) against the committed cells
# (tools/gpu/before/, untracked: `git show HEAD~N:notebooks/...`), the 512-bound bf16 LayerNorm candidates
# (try_norms families wide, wideb, early), then the memory-bound GPU tests on the changed cells.
LOGS=/tmp/s9a; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step exchange 170 python3 tools/gpu/try_exchange.py --baseline tools/gpu/before --no-compile --shapes 4096x1024,4096x4096,4096x32768,1024x262144
step norms 170 python3 tools/gpu/try_norms.py --only "layernorm bfloat16" --variants wide,early --no-compile
step tests 200 python3 -m pytest -p no:cacheprovider -m gpu -q -x -rf --tb=short tests/gpu/test_memory_bound_gpu.py
export OUT=$OUT_DIR
tar czf $OUT/s9a.tgz -C /tmp s9a
sed -n '/^op /,$p' $LOGS/exchange.log | grep -v "^$" | grep -v "torch eager"; sed -n '/^op  /,$p' $LOGS/norms.log | grep -v '^$' | head -60; tail -3 $LOGS/tests.log
