# Session 4, GPU run Y: tutorial 03 after the +inf softmax fix, the exercise graders on the GPU (every reference
# solution; the wrong variants of tutorials 00 and 03-06), tutorial 04 after its new row plans.
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
mkdir -p /tmp/y
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout $limit "$@" > /tmp/y/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - T0 )) s"; }
step nb03 90 python3 tools/gpu/run_notebooks.py /tmp/y notebooks/03-reductions-softmax.py
step exercises 330 python3 -m pytest -p no:cacheprovider -m gpu -v -rf --tb=short tests/gpu/test_exercises_gpu.py -k "not variant or 00- or 03- or 04- or 05- or 06-"
step nb04 100 python3 tools/gpu/run_notebooks.py /tmp/y notebooks/04-layernorm.py
tar czf $OUT/y.tgz -C /tmp y
tail -2 /tmp/y/nb03.log; tail -2 /tmp/y/nb04.log
grep -c PASSED /tmp/y/exercises.log; grep -E "FAILED|ERROR" /tmp/y/exercises.log | head -20; tail -3 /tmp/y/exercises.log
