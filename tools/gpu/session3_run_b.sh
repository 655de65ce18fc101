# Session 3, GPU run B: first GPU pass of the memory-bound and matmul ladders (--quick), the autotune GPU tests and
# tutorial 07's exercise graders on the GPU. Logs under $OUT (one tarball); a summary printed last.
LOGS=/tmp/b; source tools/gpu/common.sh
OUT=/tmp/b timeout 80 python3 benchmarks/memory_bound.py --quick > /tmp/b/memory_bound.txt 2>&1; echo "memory_bound rc=$? $(( $(date +%s) - T0 )) s"
OUT=/tmp/b timeout 95 python3 benchmarks/matmul.py --quick > /tmp/b/matmul.txt 2>&1; echo "matmul rc=$? $(( $(date +%s) - T0 )) s"
timeout 75 python3 -m pytest -p no:cacheprovider -m gpu -q -rs -x tests/gpu/test_autotune_gpu.py > /tmp/b/autotune.txt 2>&1; echo "autotune rc=$? $(( $(date +%s) - T0 )) s"
timeout 65 python3 -m pytest -p no:cacheprovider -m gpu -q -rs tests/gpu/test_exercises07_gpu.py > /tmp/b/ex07.txt 2>&1; echo "ex07 rc=$? $(( $(date +%s) - T0 )) s"
tar czf $OUT/b.tgz -C /tmp b
grep -v "Warning\|warn" /tmp/b/memory_bound.txt | tail -30
grep -v "Warning\|warn" /tmp/b/matmul.txt | tail -30
tail -3 /tmp/b/autotune.txt; tail -3 /tmp/b/ex07.txt
