"""Roofline math (arithmetic intensity, attainable rate, ridge point) and datasheet ceilings of known GPUs.

Pure Python and NumPy: the measured ceilings come from `kernellab.run.measure.ceilings`, the chart from
`kernellab.notebook.bench_plots.roofline`.

Units throughout: bandwidth in GB/s (1e9 bytes per second), compute in TFLOP/s (1e12 per second),
arithmetic intensity in FLOP per byte of DRAM traffic. A fused multiply-add counts as 2 FLOP.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

import numpy as np

# The compute roofs a device may have, in the order they are drawn; the label says what runs there.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
ROOF_LABELS = {
    "fp32": "fp32 FMA",
    "tf32": "tf32 tensor core",
    "bf16": "bf16 tensor core",
    "fp16": "fp16 tensor core",
}


@dataclass(frozen=True)
class DeviceCeilings:
    """The DRAM bandwidth and compute peaks of one GPU: the lines of its roofline."""

    device: str                   # the name the driver reports, e.g. "NVIDIA H200"
    dram_gbps: float              # DRAM bandwidth, GB/s (read + write bytes per second)
    fp32_tflops: float            # fp32 FMA peak on the CUDA cores, dense
    tf32_tflops: float | None     # tensor-core peaks, dense (no 2:4 sparsity); None where the GPU has none
    bf16_tflops: float | None
    fp16_tflops: float | None
    source: str                   # "measured" or "datasheet"
    reference: str                # how they were measured, or which document states them
    measured_on: str = ""         # ISO date of the measurement ("" for datasheet figures)

    def peak_tflops(self, precision: str) -> float | None:
        """The compute peak for "fp32", "tf32", "bf16" or "fp16" (None where the GPU has no such unit)."""
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
        return getattr(self, f"{precision}_tflops")

    def roofs(self) -> list[tuple[str, float]]:
        """(precision, TFLOP/s) for every compute roof this device has, lowest first."""
        found = [(p, self.peak_tflops(p)) for p in PRECISIONS]
        return sorted(((p, v) for p, v in found if v), key=lambda pv: pv[1])

    def ridge_point(self, precision: str = "fp32") -> float:
        """Arithmetic intensity (FLOP/byte) where the `precision` roof meets the DRAM roof."""
        peak = self.peak_tflops(precision)
        if not peak:
            raise ValueError(f"{self.device} has no {precision} roof")
        return ridge_point(peak, self.dram_gbps)

    def to_json(self) -> dict:
        """All fields as a JSON-able dict (the on-disk cache format of measured ceilings)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> DeviceCeilings:
        """The inverse of `to_json`; unknown keys are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def arithmetic_intensity(flops, bytes_moved):
    """FLOP per byte; works on numbers and NumPy arrays."""
    b = np.asarray(bytes_moved, dtype=float)
    if np.any(b <= 0):
        raise ValueError(f"bytes moved must be positive to give an intensity, got {bytes_moved!r}")
    out = np.asarray(flops, dtype=float) / b
    return float(out) if out.ndim == 0 else out


def ridge_point(peak_tflops: float, dram_gbps: float) -> float:
    """The intensity (FLOP/byte) above which a kernel can be compute bound: peak / bandwidth."""
    if peak_tflops <= 0 or dram_gbps <= 0:
        raise ValueError(f"peak and bandwidth must be positive, got {peak_tflops} TFLOP/s and {dram_gbps} GB/s")
    return peak_tflops * 1e12 / (dram_gbps * 1e9)


def attainable_tflops(intensity, peak_tflops: float, dram_gbps: float):
    """The roofline: min(peak, intensity x bandwidth) in TFLOP/s; works on numbers and NumPy arrays."""
    i = np.asarray(intensity, dtype=float)
    out = np.minimum(peak_tflops, i * dram_gbps * 1e9 / 1e12)
    return float(out) if out.ndim == 0 else out


def bound(intensity: float, peak_tflops: float, dram_gbps: float) -> str:
    """"memory" left of the ridge point, "compute" at or right of it."""
    return "memory" if intensity < ridge_point(peak_tflops, dram_gbps) else "compute"


def fraction_of_roof(intensity: float, achieved_tflops: float, peak_tflops: float, dram_gbps: float) -> float:
    """Achieved rate over the attainable rate at that intensity (1.0 is on the roof)."""
    return achieved_tflops / attainable_tflops(intensity, peak_tflops, dram_gbps)


# --- Datasheet figures -------------------------------------------------------------------------------------
# Dense tensor-core rates (the datasheets print the 2:4-sparsity rate, twice these, with an asterisk).
# fp32 is the CUDA-core FMA peak at boost clock. GeForce bf16/fp16 figures are with fp32 accumulate.
_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (2023), dense rates"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (2024), dense rates"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (2021), dense rates"
_ADA_WP = "NVIDIA Ada GPU architecture whitepaper v2.1, appendix A, fp32 accumulate"
_AMPERE_WP = "NVIDIA Ampere GA102 GPU architecture whitepaper v2, appendix A, fp32 accumulate"


def _ds(device, dram_gbps, fp32, tf32, bf16, fp16, reference) -> DeviceCeilings:
    return DeviceCeilings(device, dram_gbps, fp32, tf32, bf16, fp16, "datasheet", reference)


DATASHEETS: dict[str, DeviceCeilings] = {
    "H200 SXM": _ds("NVIDIA H200 SXM", 4800, 67.0, 494.7, 989.4, 989.4, _H200_DS),
    "H200 NVL": _ds("NVIDIA H200 NVL", 4800, 60.0, 417.5, 835.5, 835.5, _H200_DS),
    "H100 SXM": _ds("NVIDIA H100 SXM", 3350, 67.0, 494.7, 989.4, 989.4, _H100_DS),
    "H100 NVL": _ds("NVIDIA H100 NVL", 3900, 60.0, 417.5, 835.5, 835.5, _H100_DS),
    "H100 PCIe": _ds("NVIDIA H100 PCIe", 2000, 51.0, 378.0, 756.0, 756.0, _H100_DS),
    "A100 SXM 80GB": _ds("NVIDIA A100 SXM 80GB", 2039, 19.5, 156.0, 312.0, 312.0, _A100_DS),
    "A100 SXM 40GB": _ds("NVIDIA A100 SXM 40GB", 1555, 19.5, 156.0, 312.0, 312.0, _A100_DS),
    "A100 PCIe 80GB": _ds("NVIDIA A100 PCIe 80GB", 1935, 19.5, 156.0, 312.0, 312.0, _A100_DS),
    "A100 PCIe 40GB": _ds("NVIDIA A100 PCIe 40GB", 1555, 19.5, 156.0, 312.0, 312.0, _A100_DS),
    "L40S": _ds("NVIDIA L40S", 864, 91.6, 183.0, 362.05, 362.05, "NVIDIA L40S GPU datasheet (2023), dense rates"),
    "L4": _ds("NVIDIA L4", 300, 30.3, 60.0, 121.0, 121.0, "NVIDIA L4 Tensor Core GPU datasheet (2023), dense rates"),
    "A10": _ds("NVIDIA A10", 600, 31.2, 62.5, 125.0, 125.0, "NVIDIA A10 Tensor Core GPU datasheet (2021), dense rates"),
    "RTX 4090": _ds("NVIDIA GeForce RTX 4090", 1008, 82.6, 82.6, 165.2, 165.2, _ADA_WP),
    "RTX 3090": _ds("NVIDIA GeForce RTX 3090", 936, 35.6, 35.6, 71.0, 71.0, _AMPERE_WP),
    "V100 SXM2": _ds("Tesla V100 SXM2", 900, 15.7, None, None, 125.0, "NVIDIA Tesla V100 GPU datasheet (2020)"),
    "T4": _ds("Tesla T4", 320, 8.1, None, None, 65.0, "NVIDIA T4 Tensor Core GPU datasheet (2019)"),
}

# Driver names (torch.cuda.get_device_name, cudaDeviceProp.name) -> DATASHEETS key; first match wins,
# so the more specific patterns come first ("H100 NVL" before "H100", "L40S" before "L4", "A100" before "A10").
_NAME_PATTERNS = (
    (r"H200 NVL", "H200 NVL"),
    (r"H200", "H200 SXM"),
    (r"H100 NVL", "H100 NVL"),
    (r"H100.*PCIe", "H100 PCIe"),
    (r"H100", "H100 SXM"),                       # "NVIDIA H100 80GB HBM3" is the SXM part
    (r"A100.*(80GB.*PCIe|PCIE.*80GB)", "A100 PCIe 80GB"),
    (r"A100.*PCIe", "A100 PCIe 40GB"),
    (r"A100.*80GB", "A100 SXM 80GB"),
    (r"A100", "A100 SXM 40GB"),
    (r"L40S", "L40S"),
    (r"\bL4\b", "L4"),
    (r"\bA10\b", "A10"),
    (r"RTX 4090", "RTX 4090"),
    (r"RTX 3090", "RTX 3090"),
    (r"V100", "V100 SXM2"),
    (r"\bT4\b", "T4"),
)


def datasheet_ceilings(device_name: str) -> DeviceCeilings | None:
    """The datasheet ceilings for a driver-reported device name, or None for a GPU not in the table."""
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return DATASHEETS[key]
    return None
