# Session 4, GPU run C1: tutorials 05 and 06 top to bottom with outputs (after the session's kernel changes).
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
mkdir -p /tmp/c
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout $limit "$@" > /tmp/c/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - T0 )) s"; }
step nb05 230 python3 tools/gpu/run_notebooks.py /tmp/c notebooks/05-matmul.py
step nb06 230 python3 tools/gpu/run_notebooks.py /tmp/c notebooks/06-tensor-cores.py
step nb04 100 python3 tools/gpu/run_notebooks.py /tmp/c notebooks/04-layernorm.py
tar czf $OUT/c.tgz -C /tmp c
for f in nb05 nb06 nb04; do tail -3 /tmp/c/$f.log; done
