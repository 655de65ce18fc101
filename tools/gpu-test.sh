#!/usr/bin/env bash
# Run the GPU tests on a GPU machine whose python3 already has torch, cupy and numba-cuda (IPython/Jupyter may be
# missing: carry wheels in .whl/, see tools/gpu/wheels.sh). Logs go to $OUT (or ./gpu-test-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-test-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
export KERNELLAB_ARTIFACTS=$OUT MPLBACKEND=Agg PYTHONUNBUFFERED=1
python3 -c "import ipykernel" 2>/dev/null && python3 -m ipykernel install --user --name python3 >/dev/null 2>&1
python3 -m pytest -p no:cacheprovider -m gpu -rs -q tests ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu-tests.log"
exit "${PIPESTATUS[0]}"
