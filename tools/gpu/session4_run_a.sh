# Session 4, GPU run A: where the launch's host time goes, the Hopper matmul sweep after the cluster-arrive fix,
# Nsight Compute on the last matmul steps, the LayerNorm/RMSNorm table, and the Dask autotune GPU tests.
LOGS=/tmp/a; source tools/gpu/common.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > /tmp/a/smi.txt 2>&1
timeout 40 python3 benchmarks/launch_overhead.py --launches 1000 --rounds 9 > /tmp/a/launch.txt 2>&1; echo "launch rc=$? $(( $(date +%s) - T0 )) s"
timeout 30 python3 benchmarks/launch_overhead.py --breakdown --launches 1000 --rounds 9 > /tmp/a/breakdown.txt 2>&1; echo "breakdown rc=$? $(( $(date +%s) - T0 )) s"
OUT=/tmp/a/hopper timeout 130 python3 benchmarks/matmul.py --only hopper > /tmp/a/hopper.txt 2>&1; echo "hopper rc=$? $(( $(date +%s) - T0 )) s"
timeout 170 python3 tools/gpu/profile_matmul.py /tmp/a/prof > /tmp/a/prof.txt 2>&1; echo "profile rc=$? $(( $(date +%s) - T0 )) s"
OUT=/tmp/a/mb timeout 110 python3 benchmarks/memory_bound.py --ops layernorm,rmsnorm --out /tmp/a/mb > /tmp/a/mb.txt 2>&1; echo "memory_bound rc=$? $(( $(date +%s) - T0 )) s"
timeout 80 python3 -m pytest -p no:cacheprovider -m gpu -q -rs -x tests/gpu/test_autotune_gpu.py > /tmp/a/autotune.txt 2>&1; echo "autotune rc=$? $(( $(date +%s) - T0 )) s"
tar czf $OUT/a.tgz -C /tmp a
cat /tmp/a/smi.txt; tail -12 /tmp/a/launch.txt; tail -12 /tmp/a/breakdown.txt
grep -v "Warning\|warn" /tmp/a/hopper.txt | tail -25
grep -v "Warning\|warn" /tmp/a/mb.txt | tail -30
tail -3 /tmp/a/autotune.txt
