# Session 3, GPU run A: tutorials 07/00/01/02 executed with outputs, the attention benchmark, the merged launch-path,
# tensor-map and source-view tests, the launch-overhead table. Logs under $OUT; a summary printed last.
LOGS=/tmp/nb; WITH_KERNEL=1; source tools/gpu/common.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
timeout 260 python3 tools/gpu/run_notebooks.py /tmp/nb notebooks/07-fused-attention.py > /tmp/nb07.log 2>&1; echo "07 rc=$? $(( $(date +%s) - T0 )) s"
timeout 100 python3 tools/gpu/run_notebooks.py /tmp/nb notebooks/01-first-kernel.py notebooks/02-transpose-banks.py notebooks/00-puzzles.py > /tmp/nb012.log 2>&1; echo "00-02 rc=$? $(( $(date +%s) - T0 )) s"
timeout 120 python3 benchmarks/attention.py --no-check > /tmp/attention.txt 2>&1; echo "attention rc=$? $(( $(date +%s) - T0 )) s"
timeout 80 python3 -m pytest -p no:cacheprovider -m gpu -q -rs tests/gpu/test_tma_gpu.py tests/gpu/test_launch_path_gpu.py tests/gpu/test_source_view_gpu.py > /tmp/pytest.txt 2>&1; echo "pytest rc=$? $(( $(date +%s) - T0 )) s"
timeout 25 python3 benchmarks/launch_overhead.py > /tmp/launch.txt 2>&1; echo "launch rc=$? $(( $(date +%s) - T0 )) s"
cp /tmp/attention.json $OUT/ 2>/dev/null; cp attention.json $OUT/ 2>/dev/null
tar czf $OUT/nb.tgz -C /tmp nb nb07.log nb012.log attention.txt pytest.txt launch.txt 2>/dev/null
cat /tmp/nb07.log /tmp/nb012.log | grep -E "s, [0-9]+ cells|FAILED" | tail -8
grep -v "Warning\|warn" /tmp/attention.txt | tail -24
tail -4 /tmp/pytest.txt
tail -12 /tmp/launch.txt
