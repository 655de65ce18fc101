# Sourced by the tools/gpu/session*_run_*.sh scripts: the wheels carried in .whl/ installed to /tmp/site (IPython,
# Jupyter's kernel, Dask, ...), PYTHONPATH, and `step NAME LIMIT_S CMD...`, which runs one command under a time
# limit with its output in $LOGS/NAME.log and prints its exit status and the seconds since the start.
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
[ -n "$WITH_KERNEL" ] && python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
mkdir -p "$LOGS"
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout $limit "$@" > "$LOGS/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - T0 )) s"; }
