"""Measuring a kernel: check against a reference, bench, the device's ceilings, autotune."""
