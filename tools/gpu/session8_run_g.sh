# Session 8, run G (commit 90495d9, reverted after it): LayerNorm's b staged through shared memory (cp.async at the
# start) against the same kernels launched without the shared memory, and the GPU tests of tutorial 04.
LOGS=/tmp/s8g; source tools/gpu/common.sh
step tests 200 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short tests/gpu/test_memory_bound_gpu.py -k "layernorm or large_mean or norm or cluster"
step stage 260 python3 tools/gpu/try_exchange.py --baseline nostage --ops layernorm --shapes 4096x1024,4096x4096,4096x32768,1024x262144,1000x1031,3x100003
tar czf $OUT/s8g.tgz -C /tmp s8g
grep -E "passed|failed|FAILED|Error" $LOGS/tests.log | tail -6; sed -n '/^op /,$p' $LOGS/stage.log | grep -v "^$"
