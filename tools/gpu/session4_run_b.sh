# Session 4, GPU run B: the tuning candidates (mma.sync pipeline, SGEMM, LayerNorm/RMSNorm), attention at small N
# with 2 or 3 consumer warpgroups at d = 64, and the launch path after its fast-path rewrite.
LOGS=/tmp/b; source tools/gpu/common.sh
step launch 30 python3 benchmarks/launch_overhead.py --launches 1000 --rounds 11
step breakdown 30 python3 benchmarks/launch_overhead.py --breakdown --launches 1000 --rounds 11
step launchtests 60 python3 -m pytest -p no:cacheprovider -m gpu -q -rs tests/gpu/test_launch_path_gpu.py tests/gpu/test_launch_gpu.py
step mma 125 python3 tools/gpu/try_mma.py
step sgemm 125 python3 tools/gpu/try_sgemm.py
step norms 125 python3 tools/gpu/try_norms.py
OUT=/tmp/b step attn_wg3 70 python3 benchmarks/attention.py --quick --no-check --ns 1024,2048 --dims 64
mv /tmp/b/attention.log /tmp/b/attention_wg3.log 2>/dev/null
OUT=/tmp/b step attn_wg2 70 python3 benchmarks/attention.py --quick --no-check --ns 1024,2048 --dims 64 -D FA3_WG64=2
tar czf $OUT/b.tgz -C /tmp b
tail -3 /tmp/b/launchtests.log
for f in launch breakdown; do tail -16 /tmp/b/$f.log; done
for f in mma sgemm norms; do echo "== $f"; grep -v "Warning\|warn" /tmp/b/$f.log | tail -22; done
for f in attn_wg3 attn_wg2; do echo "== $f"; tail -6 /tmp/b/$f.log; done
