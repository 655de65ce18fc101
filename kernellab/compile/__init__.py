"""Source text -> compiled kernels with resources, PTX and SASS (NVRTC for CUDA C++, Numba for Python)."""
