# Session 4, GPU run X: the Dask autotune/grading tests after fanout.prepare, why 00-map's grade failed, tutorials
# 05 and 06 top to bottom with outputs.
LOGS=/tmp/x; WITH_KERNEL=1; source tools/gpu/common.sh
KERNELLAB_ARTIFACTS=/tmp/x step autotune 150 python3 -m pytest -p no:cacheprovider -m gpu -q -rs -s tests/gpu/test_autotune_gpu.py -k "dask"
step ex00 40 python3 -m pytest -p no:cacheprovider -m gpu -q -x --tb=short tests/gpu/test_exercises_gpu.py -k "00-map"
step nb05 200 python3 tools/gpu/run_notebooks.py /tmp/x notebooks/05-matmul.py
step nb06 200 python3 tools/gpu/run_notebooks.py /tmp/x notebooks/06-tensor-cores.py
tar czf $OUT/x.tgz -C /tmp x
grep -E "passed|failed|error" /tmp/x/autotune.log | tail -4
grep -v "^\s*$" /tmp/x/ex00.log | tail -25
for f in nb05 nb06; do tail -2 /tmp/x/$f.log; done
