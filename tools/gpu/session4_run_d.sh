# Session 4, GPU run D: LayerNorm/RMSNorm candidates (try_norms, fixed), attention at small N with 2 consumer
# warpgroups (and 3 stages) at d = 64, more SGEMM tile shapes.
LOGS=/tmp/d; source tools/gpu/common.sh
python3 - <<'PY'
import re, sys
sys.path.insert(0, "tests/gpu")
from notebook_cells import cuda_cells
cell = next(c for c in cuda_cells("07-fused-attention.py") if "FA3_WG64" in c)
open("/tmp/fa3_wg2.cu", "w").write(re.sub(r"#define FA3_WG64 3\b", "#define FA3_WG64 2", cell))
open("/tmp/fa3_wg2_st3.cu", "w").write(re.sub(r"#define FA3_ST64 2\b", "#define FA3_ST64 3",
                                              re.sub(r"#define FA3_WG64 3\b", "#define FA3_WG64 2", cell)))
open("/tmp/fa3_wg3.cu", "w").write(cell)
PY
step norms 130 python3 tools/gpu/try_norms.py
for v in wg3 wg2 wg2_st3; do OUT=/tmp/d step attn_$v 45 python3 benchmarks/attention.py --quick --no-check --source /tmp/fa3_$v.cu --ns 1024,2048 --dims 64; done
step sgemm 90 python3 tools/gpu/try_sgemm.py
tar czf $OUT/d.tgz -C /tmp d
echo "== norms"; grep -v "Warning\|warn" /tmp/d/norms.log | tail -40
for v in wg3 wg2 wg2_st3; do echo "== $v"; tail -5 /tmp/d/attn_$v.log; done
echo "== sgemm"; tail -16 /tmp/d/sgemm.log
