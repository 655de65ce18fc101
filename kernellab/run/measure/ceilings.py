"""A GPU's roofline ceilings, measured once per device and cached on disk.

What is measured, each with `kernellab.bench` (median of its repetitions):
- DRAM bandwidth: a 1 GiB device-to-device copy, counting read + write bytes.
- fp32 FMA peak: a kernel of independent `fmaf` chains filling every SM (compiled with CuPy); where CuPy
  cannot compile, a large fp32 matmul on the CUDA cores stands in, and `reference` says so.
- tf32, bf16 and fp16 tensor-core peaks: 8192 x 8192 x 8192 matmuls in torch (cuBLAS), 2 FLOP per FMA.
The cache is `$KERNELLAB_CACHE_DIR/ceilings/<device>.json` (default `~/.cache/kernellab`); `remeasure=True`
measures again.
"""
from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

from kernellab.analysis.roofline import DeviceCeilings
from kernellab.run.launch.launch import external_stream
from kernellab.run.measure.bench import bench, cuda_device

_COPY_BYTES = 2**30
_MATMUL_N = 8192
_FMA_CHAINS, _FMA_ITERS = 8, 4096
_FMA_SOURCE = r"""
extern "C" __global__ void fma_peak(float* out, float a, float b, int iters) {
  float x0 = threadIdx.x, x1 = x0 + 1.f, x2 = x0 + 2.f, x3 = x0 + 3.f;
  float x4 = x0 + 4.f, x5 = x0 + 5.f, x6 = x0 + 6.f, x7 = x0 + 7.f;
  for (int i = 0; i < iters; ++i) {   // 8 independent chains hide the FMA latency
    x0 = fmaf(x0, a, b); x1 = fmaf(x1, a, b); x2 = fmaf(x2, a, b); x3 = fmaf(x3, a, b);
    x4 = fmaf(x4, a, b); x5 = fmaf(x5, a, b); x6 = fmaf(x6, a, b); x7 = fmaf(x7, a, b);
  }
  float s = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
  if (s == 1234.5f) out[blockIdx.x * blockDim.x + threadIdx.x] = s;  // keeps the chains alive, never true
}
"""


def cache_dir() -> Path:
    """Where measured ceilings are kept: $KERNELLAB_CACHE_DIR/ceilings, else ~/.cache/kernellab/ceilings."""
    root = os.environ.get("KERNELLAB_CACHE_DIR")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kernellab"
    return base / "ceilings"


def cache_path(device_name: str) -> Path:
    """The cache file of one device, named after it."""
    return cache_dir() / (re.sub(r"[^A-Za-z0-9._-]+", "_", device_name).strip("_") + ".json")


def device_ceilings(device=None, *, remeasure: bool = False) -> DeviceCeilings:
    """This GPU's ceilings: from the cache, or measured now (a few seconds) and cached."""
    import torch

    name = torch.cuda.get_device_name(device)
    path = cache_path(name)
    if path.exists() and not remeasure:
        try:
            return DeviceCeilings.from_json(json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass                                   # a damaged cache file is measured again
    ceilings = measure_ceilings(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(ceilings.to_json(), indent=1))
    tmp.replace(path)
    return ceilings


def measure_ceilings(device=None) -> DeviceCeilings:
    """Measure DRAM bandwidth and the fp32, tf32, bf16 and fp16 peaks of one GPU now (no cache)."""
    import torch


    dev = cuda_device(device)
    name = torch.cuda.get_device_name(dev)
    opts = dict(warmup_ms=50, rep_ms=200, rounds=5, min_reps=10, device=dev)

    src = torch.empty(_COPY_BYTES // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty_like(src)
    copy = bench(lambda s, d: d.copy_(s), (src, dst), bytes=2 * _COPY_BYTES, name="copy", **opts)
    del src, dst
    dram_gbps = copy.gbps

    fp32_tflops, fp32_how = _fma_peak(dev, opts)

    n = _MATMUL_N
    peaks = {}
    for label, dtype in (("tf32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = label == "tf32"
        try:
            r = bench(torch.matmul, (a, b), flops=2 * n**3, name=f"{label} matmul", **opts)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        peaks[label] = r.tflops
        del a, b
    torch.cuda.empty_cache()
    reference = (f"kernellab.bench medians: {_COPY_BYTES >> 30} GiB device-to-device copy (read + write bytes); "
                 f"{fp32_how}; {n}x{n}x{n} torch.matmul in tf32, bf16, fp16; torch {torch.__version__}")
    return DeviceCeilings(device=name, dram_gbps=dram_gbps, fp32_tflops=fp32_tflops, tf32_tflops=peaks["tf32"],
                          bf16_tflops=peaks["bf16"], fp16_tflops=peaks["fp16"], source="measured",
                          reference=reference, measured_on=datetime.date.today().isoformat())


def _fma_peak(dev, opts) -> tuple[float, str]:
    """fp32 FMA TFLOP/s and how it was measured: an FMA-chain kernel, or an fp32 matmul without CuPy."""
    import torch


    props = torch.cuda.get_device_properties(dev)
    threads, blocks = 256, props.multi_processor_count * 8
    flops = 2 * _FMA_CHAINS * _FMA_ITERS * threads * blocks
    try:
        import cupy

        with cupy.cuda.Device(dev.index):
            kernel = cupy.RawKernel(_FMA_SOURCE, "fma_peak")
            out = cupy.zeros(threads * blocks, dtype=cupy.float32)

            def run():  # on torch's current stream, where bench records its events
                with external_stream(torch.cuda.current_stream(dev).cuda_stream):
                    kernel((blocks,), (threads,), (out, cupy.float32(0.999), cupy.float32(0.001),
                                                   cupy.int32(_FMA_ITERS)))
                return out

            r = bench(run, (), flops=flops, name="fp32 FMA", **opts)
        return r.tflops, (f"fp32 FMA kernel ({_FMA_CHAINS} independent fmaf chains x {_FMA_ITERS} iterations, "
                          f"{blocks} blocks of {threads} threads)")
    except Exception as exc:  # no CuPy, or it cannot compile here
        n = _MATMUL_N
        a = torch.randn(n, n, device=dev)
        b = torch.randn(n, n, device=dev)
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            r = bench(torch.matmul, (a, b), flops=2 * n**3, name="fp32 matmul", **opts)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        return r.tflops, (f"fp32 {n}^3 matmul on the CUDA cores (a lower bound: the FMA kernel could not run: "
                          f"{type(exc).__name__})")
