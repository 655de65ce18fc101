# Session 4, GPU run C: tutorials 03, 05 and 06 top to bottom with outputs, the exercise graders of every tutorial
# on the GPU, and the autotune GPU tests (Dask's LocalCUDACluster included).
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
mkdir -p /tmp/c
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout $limit "$@" > /tmp/c/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - T0 )) s"; }
step nb05 150 python3 tools/gpu/run_notebooks.py /tmp/c notebooks/05-matmul.py
step nb06 150 python3 tools/gpu/run_notebooks.py /tmp/c notebooks/06-tensor-cores.py
step nb03 90 python3 tools/gpu/run_notebooks.py /tmp/c notebooks/03-reductions-softmax.py
step exercises 70 python3 -m pytest -p no:cacheprovider -m gpu -q -rs tests/gpu/test_exercises_gpu.py
KERNELLAB_ARTIFACTS=/tmp/c step autotune 130 python3 -m pytest -p no:cacheprovider -m gpu -q -rs -s tests/gpu/test_autotune_gpu.py
tar czf $OUT/c.tgz -C /tmp c
for f in nb05 nb06 nb03; do tail -2 /tmp/c/$f.log; done
tail -4 /tmp/c/exercises.log; grep -E "passed|failed|error" /tmp/c/autotune.log | tail -3
