"""Launching a kernel: the device, the CUDA driver, the launch path, TMA descriptors, jobs and isolated workers."""
