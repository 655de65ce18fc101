#!/usr/bin/env bash
# What the GPU machine has, in one screen (run there first).
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import sys, torch, cupy, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
python3 -c "import cuda.bindings, cuda.bindings.nvrtc as n; print('cuda.bindings', cuda.bindings.__version__, 'nvrtc', n.nvrtcVersion())" 2>&1 | tail -1
for t in nvcc ptxas cuobjdump nvdisasm ncu compute-sanitizer; do printf '%s: %s\n' "$t" "$(command -v $t || echo missing)"; done
ls -d /usr/local/cuda*/include 2>/dev/null | head -3
python3 -c "import IPython" 2>&1 | tail -1
