# Session 8, run C: tutorial 04's LayerNorm with plain-sum statistics: GPU tests, then against the cell with Chan's
# merge across threads (tools/gpu/try_exchange.py --baseline chan), then Nsight Compute on two cases.
LOGS=/tmp/s8c; source tools/gpu/common.sh
step tests 200 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short -x tests/gpu/test_memory_bound_gpu.py -k "layernorm or large_mean or cluster or norm"
step chan 260 python3 tools/gpu/try_exchange.py --baseline chan --ops layernorm --shapes 4096x1024,4096x4096,4096x32768,1024x262144,1000x1031,3x100003
step stalls 120 python3 tools/gpu/norm_stalls.py $LOGS/ncu "layernorm bfloat16 4096x4096" "layernorm float32 1024x262144" "layernorm bfloat16 1024x262144"
tar czf $OUT/s8c.tgz -C /tmp s8c
grep -E "passed|failed|FAILED|Error" $LOGS/tests.log | tail -6; sed -n '/^op /,$p' $LOGS/chan.log; tail -c 4500 $LOGS/stalls.log
