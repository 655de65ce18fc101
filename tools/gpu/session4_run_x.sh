# Session 4, GPU run X: the Dask autotune/grading tests after fanout.prepare, why 00-map's grade failed, tutorials
# 05 and 06 top to bottom with outputs.
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
mkdir -p /tmp/x
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout $limit "$@" > /tmp/x/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - T0 )) s"; }
KERNELLAB_ARTIFACTS=/tmp/x step autotune 150 python3 -m pytest -p no:cacheprovider -m gpu -q -rs -s tests/gpu/test_autotune_gpu.py -k "dask"
step ex00 40 python3 -m pytest -p no:cacheprovider -m gpu -q -x --tb=short tests/gpu/test_exercises_gpu.py -k "00-map"
step nb05 200 python3 tools/gpu/run_notebooks.py /tmp/x notebooks/05-matmul.py
step nb06 200 python3 tools/gpu/run_notebooks.py /tmp/x notebooks/06-tensor-cores.py
tar czf $OUT/x.tgz -C /tmp x
grep -E "passed|failed|error" /tmp/x/autotune.log | tail -4
grep -v "^\s*$" /tmp/x/ex00.log | tail -25
for f in nb05 nb06; do tail -2 /tmp/x/$f.log; done
