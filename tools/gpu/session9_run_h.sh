# Session 9, run H (issue 14): the cell's bf16 LayerNorm with more blocks an SM (norm_occ.cu, spilling).
LOGS=/tmp/s9h; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step occ 120 python3 tools/gpu/try_norms.py --only "layernorm bfloat16 4096x4096,layernorm bfloat16 1024x262144" --variants occ --no-compile
export OUT=$OUT_DIR
tar czf $OUT/s9h.tgz -C /tmp s9h
sed -n '/^op  /,$p' $LOGS/occ.log | grep -v '^$'
