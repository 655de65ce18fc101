#!/usr/bin/env bash
# Download, on this (CPU) machine, the Python 3.12 wheels the GPU machine lacks for kernellab's GPU tests, into .whl/
# (git-ignored). tools/gpu/run.py installs them there with
#   pip install --no-index --no-deps --target /tmp/site .whl/*.whl  and  PYTHONPATH=/tmp/site
# so they come ahead of the machine's own packages.
#
# Why each is needed there (the machine has torch, CuPy, numba + numba-cuda, pytest, matplotlib; see
# /work/shared/PLATFORM.md):
#   numpy>=2.3,<2.5  numba-cuda 0.30 fails to import with the machine's NumPy 2.5 (np.row_stack is gone)
#   ipython          the %%cuda / %%numba magics and their tests (tests drive a real InteractiveShell)
#   ipykernel, nbclient, nbformat, jupytext   executing the tutorial notebooks headlessly
#   ipywidgets       the occupancy explorer widget
#   greenlet         the Numba simulator's block scheduler (without it, OS threads take turns: slower, same results)
# and their dependencies, resolved by pip for CPython 3.12 on manylinux x86-64.
#
# DASK=1 adds what the autotune and grading fan-out needs there (tests/gpu/test_autotune_gpu.py,
# benchmarks/autotune_demo.py, benchmarks/autotune_multigpu.py):
#   distributed      Dask's executor, which the fan-out runs on
#   dask-cuda        LocalCUDACluster: one worker per GPU (it brings cuda-core and nvidia-ml-py, which the machine
#                    lacks, and pins dask and distributed through rapids-dask-dependency); autotune_multigpu.py runs
#                    several Nanny workers per GPU through distributed alone and samples utilisation through NVML
#                    (nvidia-ml-py's pynvml)
#
# Usage: tools/gpu/wheels.sh            (replaces .whl/ with a fresh, checked set)
#        DASK=1 tools/gpu/wheels.sh     (the same set plus Dask and dask-cuda)
#        WHEEL_DIR=/tmp/w tools/gpu/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

DEST=${WHEEL_DIR:-.whl}
LIMIT_MB=${LIMIT_MB:-40}
if [ -z "${PYTHON:-}" ]; then   # any Python with pip works: it only downloads
  PYTHON=python3
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
fi

# What the GPU tests import that the machine lacks; pip adds their dependencies.
REQUIREMENTS=(
  "numpy>=2.3,<2.5"
  "ipython>=8.20"
  "ipykernel>=6.29"
  "nbclient>=0.10"
  "nbformat>=5.10"
  "ipywidgets>=8.1"
  "jupytext>=1.16"
  "greenlet>=3.0"
)
# Dependencies not needed at run time there, dropped after the check below to save space:
#   debugpy (3.9 MB)  ipykernel imports it only for the Jupyter debugger and runs without it.
DROP=(debugpy)
if [ "${DASK:-0}" = 1 ]; then
  REQUIREMENTS+=("distributed>=2024.1" "dask-cuda>=25.2")
  # bokeh (6.4 MB) serves Dask's dashboard only; pandas (12 MB) is for dask.dataframe, which dask-cuda lists but
  # LocalCUDACluster does not import; the others come with them alone (pillow and contourpy are matplotlib's too,
  # and the machine has matplotlib).
  DROP+=(bokeh pandas narwhals xyzservices pillow contourpy)
  LIMIT_MB=${LIMIT_MB_DASK:-48}
fi
# manylinux tags pip matches exactly (no "at least"): the GPU machine's glibc takes all of these.
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
        --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "resolving and downloading for CPython 3.12 / manylinux x86-64 ..."
# (grep drops pip's warnings about unreachable extra index locations in this machine's pip config)
"$PYTHON" -m pip download -q --disable-pip-version-check "${TARGET[@]}" -d "$tmp/whl" "${REQUIREMENTS[@]}" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) \
  || { rc=$?; echo "pip download failed (exit $rc): see above; nothing in $DEST was changed" >&2; exit 1; }

# One version of each distribution: two versions of one package stop the whole --no-deps install.
dups=$(ls "$tmp/whl" | sed -E 's/^([^-]+)-.*/\1/' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dups" ]; then
  echo "more than one version of: $dups" >&2
  exit 1
fi
if ls "$tmp/whl" | grep -v '\.whl$'; then
  echo "pip fetched something that is not a wheel (above): a source build cannot be installed there" >&2
  exit 1
fi

# The set must be complete on its own: resolve the requirements again from these files alone, for the target.
"$PYTHON" -m pip install -q --disable-pip-version-check --dry-run --ignore-installed --no-index \
    --find-links "$tmp/whl" "${TARGET[@]}" --target "$tmp/site" "${REQUIREMENTS[@]}" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) \
  || { rc=$?; echo "the downloaded wheels do not satisfy the requirements on their own (exit $rc)" >&2; exit 1; }

for name in "${DROP[@]}"; do
  rm -f "$tmp/whl/$name"-*.whl
done

total_kb=$(du -sk "$tmp/whl" | cut -f1)
if [ "$total_kb" -gt $((LIMIT_MB * 1024)) ]; then
  echo "the wheels take $((total_kb / 1024)) MB, more than LIMIT_MB=$LIMIT_MB (they travel with every GPU call)" >&2
  exit 1
fi

rm -rf "$DEST"
mkdir -p "$DEST"
mv "$tmp/whl"/*.whl "$DEST"/
echo "$(ls "$DEST" | wc -l) wheels, $((total_kb / 1024)) MB in $DEST:"
ls "$DEST" | sed 's/^/  /'
