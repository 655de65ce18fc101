# Session 9, run B (issue 14): change 2 (guard-free path for threads whose packs are all inside the row) against
# the cells with change 1 only (tools/gpu/before1/, untracked); change 1 + 2 against the committed cells at the small
# shapes again (run A's 4096 x 1024 was mixed), with longer timing; then Nsight Compute's instruction mix of bf16
# LayerNorm, and the memory-bound GPU tests.
LOGS=/tmp/s9b; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step ch2 150 python3 tools/gpu/try_exchange.py --baseline tools/gpu/before1 --no-compile --ops layernorm,rmsnorm --shapes 4096x1024,4096x4096,4096x32768,1024x262144,1000x1031,3x100003
step small 120 python3 tools/gpu/try_exchange.py --baseline tools/gpu/before --no-compile --rep-ms 40 --shapes 4096x1024,1000x1031
step ncu 150 python3 tools/gpu/norm_stalls.py $LOGS/ncu "layernorm bfloat16 4096x4096" "layernorm bfloat16 1024x262144" "rmsnorm bfloat16 4096x4096"
step tests 120 python3 -m pytest -p no:cacheprovider -m gpu -q -x -rf --tb=short tests/gpu/test_memory_bound_gpu.py
export OUT=$OUT_DIR
tar czf $OUT/s9b.tgz -C /tmp s9b
for f in ch2 small; do sed -n '/^op /,$p' $LOGS/$f.log | grep -v "^$" | grep -v "torch eager"; done; tail -3 $LOGS/tests.log; grep -E "rc=|Error" $LOGS/ncu.log | head
