# Session 4, GPU run E: tutorials 03 and 04 with outputs, every tutorial's exercise graders on the GPU, the autotune
# GPU tests (Dask's LocalCUDACluster included).
LOGS=/tmp/e; WITH_KERNEL=1; source tools/gpu/common.sh
step nb03 100 python3 tools/gpu/run_notebooks.py /tmp/e notebooks/03-reductions-softmax.py
step exercises 100 python3 -m pytest -p no:cacheprovider -m gpu -q -rs tests/gpu/test_exercises_gpu.py tests/gpu/test_exercises07_gpu.py
KERNELLAB_ARTIFACTS=/tmp/e step autotune 220 python3 -m pytest -p no:cacheprovider -m gpu -q -rs -s tests/gpu/test_autotune_gpu.py
tar czf $OUT/e.tgz -C /tmp e
for f in nb03; do tail -3 /tmp/e/$f.log; done
tail -5 /tmp/e/exercises.log; grep -E "passed|failed|error|PASS|FAIL" /tmp/e/autotune.log | tail -6
