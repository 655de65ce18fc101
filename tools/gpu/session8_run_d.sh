# Session 8, run D: bf16 rows through the w/b ring (notebook 04 now) against the cell without it ("noring"), and
# 16-block clusters for 1 MB rows (tools/gpu/norm_variants/norm_cluster16.cu, family "rt"), by try_norms.
LOGS=/tmp/s8d; source tools/gpu/common.sh
step tests 200 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short -x tests/gpu/test_memory_bound_gpu.py -k "layernorm or rmsnorm or large_mean or cluster or norm"
step norms 330 python3 tools/gpu/try_norms.py --variants rt,noring --budget-s 250 --only "float32 1024x262144,bfloat16 1024x262144,bfloat16 4096x32768,bfloat16 3x100003"
tar czf $OUT/s8d.tgz -C /tmp s8d
grep -E "passed|failed|FAILED|Error" $LOGS/tests.log | tail -6; sed -n '/^op /,$p' $LOGS/norms.log | grep -v "^$"
