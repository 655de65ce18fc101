"""The Numba CUDA simulator: its block scheduler, shared-memory trace and race/initialisation checks."""
