"""How much of a small memory-bound kernel's time is the L2 flush's dirty lines: torch's copy and tutorials 03/04's
kernels timed with kernellab.bench's flush (writing a buffer twice the L2's size, which leaves the L2 full of dirty
lines that the timed kernel's own traffic then evicts to DRAM) and with a flush that reads the buffer instead (the
L2 then holds clean lines; the previous call's dirty output is written back during the flush, untimed).

    PYTHONPATH=$PWD python3 tools/gpu/flush_effect.py          # GPU machine, repo root; under a minute

kernellab.bench keeps the write flush as its default (as Triton's do_bench does; a kernel in a model also runs after
kernels whose outputs sit dirty in L2); the read flush is its flush_l2="clean". This measures what the difference
is at each size.
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

SHAPES = [(4096, 1024), (4096, 4096), (4096, 32768)]


def main():
    import torch
    import torch.nn.functional as F

    import kernellab
    from kernellab.run.measure.bench import CudaClock
    from kernellab.run.measure.ceilings import device_ceilings
    from notebook_cells import load_tutorial

    t03, t04 = load_tutorial("03-reductions-softmax.py"), load_tutorial("04-layernorm.py")
    copy_gbps = device_ceilings().dram_gbps
    write_clock = CudaClock()
    read_clock = CudaClock(flush_l2="clean")
    print(f"{torch.cuda.get_device_name()}; copy bandwidth {copy_gbps / 1e3:.2f} TB/s; L2 {write_clock.l2_bytes >> 20} "
          f"MiB, flush {write_clock.flush_bytes >> 20} MiB", flush=True)
    rows_out = []
    for dtype in (torch.bfloat16, torch.float32):
        for r, c in SHAPES:
            g = torch.Generator(device="cuda").manual_seed(r + c)
            x = torch.randn(r, c, device="cuda", dtype=dtype, generator=g)
            w = torch.randn(c, device="cuda", dtype=dtype, generator=g)
            b = torch.randn(c, device="cuda", dtype=dtype, generator=g)
            y = torch.empty_like(x)
            fns = {"copy-op": lambda: y.copy_(x), "softmax": lambda: t03["softmax"](x, y),
                   "layernorm": lambda: t04["layernorm"](x, w, b, y, 1e-5),
                   "rmsnorm": lambda: t04["rmsnorm"](x, w, y, 1e-5),
                   "F.layer_norm": lambda: F.layer_norm(x, (c,), w, b, 1e-5)}
            nbytes = 2 * r * c * dtype.itemsize
            res = {}
            for label, clock in (("write flush", write_clock), ("read flush", read_clock)):
                first, *rest = fns
                out = kernellab.bench(fns[first], (), bytes=nbytes, name=first, warmup_ms=3, rep_ms=10,
                                      baselines={n: fns[n] for n in rest}, timer=clock, rotate=False)
                for rr in (out, *out.baselines):
                    res[(label, rr.name)] = rr.median_ms * 1e3
            for name in fns:
                wt, rt = res[("write flush", name)], res[("read flush", name)]
                rows_out.append(f"{str(dtype)[6:]:9s} {f'{r}x{c}':>11s} {name:13s} {wt:8.1f} "
                                f"{nbytes / (wt * 1e-6) / 1e9 / copy_gbps:7.0%} {rt:8.1f} "
                                f"{nbytes / (rt * 1e-6) / 1e9 / copy_gbps:7.0%}")
            rows_out.append("")
            print(f"done {dtype} {r}x{c}", flush=True)
    print(f"\n{'dtype':9s} {'shape':>11s} {'kernel':13s} {'write µs':>8s} {'of copy':>7s} {'read µs':>8s} {'of copy':>7s}")
    print("\n".join(rows_out))
    print("(of copy: x's bytes read + y's written over the time, against the 1 GiB copy ceiling; LayerNorm's w and b "
          "and RMSNorm's w are left out of the bytes here)")


if __name__ == "__main__":
    main()
