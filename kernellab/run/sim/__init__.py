"""Simulators of kernels on the CPU, checked as compute-sanitizer checks them on a GPU: the Numba CUDA simulator (its
block scheduler, shared-memory trace and race/initialisation checks) and cuda/, CUDA C++ on the CPU."""
