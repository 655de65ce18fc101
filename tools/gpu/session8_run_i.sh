# Session 8, run I: Nsight Compute on bf16 LayerNorm 1024 x 262144 (85 % of copy) beside RMSNorm (95 %) at the
# notebook's 16-block plan, and LayerNorm bf16 4096 x 4096 with the per-pack branch, for the next session.
LOGS=/tmp/s8i; source tools/gpu/common.sh
step stalls 200 python3 tools/gpu/norm_stalls.py $LOGS/ncu "layernorm bfloat16 1024x262144" "rmsnorm bfloat16 1024x262144" "layernorm bfloat16 4096x4096"
tar czf $OUT/s8i.tgz -C /tmp s8i
tail -c 5000 $LOGS/stalls.log
