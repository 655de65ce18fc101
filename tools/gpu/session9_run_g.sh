# Session 9, run G (issue 14): norm_resident_x (resident clusters with the st.async exchange) against the cell at
# 1024 x 262144; then what Inductor generates for RMSNorm bf16 4096 x 1024 (where torch.compile is 0.95x ours).
LOGS=/tmp/s9g; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step resx 150 python3 tools/gpu/try_norms.py --only "1024x262144" --variants "resx" --no-compile
step inductor 120 env TORCH_LOGS=output_code python3 -c "
import torch, torch.nn.functional as F
x = torch.randn(4096, 1024, device='cuda', dtype=torch.bfloat16); w = torch.randn(1024, device='cuda', dtype=torch.bfloat16)
f = torch.compile(lambda x, w: F.rms_norm(x, (1024,), w, 1e-5), dynamic=False); f(x, w); torch.cuda.synchronize()"
export OUT=$OUT_DIR
tar czf $OUT/s9g.tgz -C /tmp s9g
sed -n '/^op  /,$p' $LOGS/resx.log | grep -v '^$'; grep -n "triton_heuristics\|def triton_\|XBLOCK\|R0_BLOCK\|num_warps\|tl.load\|tl.store\|eviction" $LOGS/inductor.log | head -40
