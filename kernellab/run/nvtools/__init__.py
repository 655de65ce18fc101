"""NVIDIA's tools around a launch: Nsight Compute (ncu, per-line source counters) and compute-sanitizer."""
