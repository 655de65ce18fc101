# Session 8, run F: bf16 LayerNorm plans after the plain-sum statistics: 1024 x 262144 as 16 x 512 x 4 packs
# (norm_variants/norm_extra_plans.cu) against the cell's 16 x 256 x 8, and 4096 x 4096's plans again.
LOGS=/tmp/s8f; source tools/gpu/common.sh
step norms 300 python3 tools/gpu/try_norms.py --only "bfloat16 1024x262144,bfloat16 4096x4096" --variants "c16,c8 x 512 x 8,64 x 8,128 x 4 / 256,256 x 2"
tar czf $OUT/s8f.tgz -C /tmp s8f
sed -n '/^op /,$p' $LOGS/norms.log | grep -v "^$"
