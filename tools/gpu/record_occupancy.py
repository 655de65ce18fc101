"""Record the driver's occupancy answers on the live GPU as a golden table for tests/test_occupancy.py.

Run on a GPU machine: python3 tools/gpu/record_occupancy.py OUTDIR [--configs 4000]
Writes OUTDIR/occupancy_sm<cc>.csv, OUTDIR/kernel_attrs_sm<cc>.csv and OUTDIR/device_sm<cc>.json.
"""
import argparse
import datetime
import json
import os
import random

import cupy
from cupy.cuda import driver, runtime

# A kernel whose register appetite grows with ACC; -maxrregcount then caps it, so that
# the (ACC, cap) grid gives many distinct register counts, odd ones included.
SOURCE = r"""
extern "C" __global__ void __launch_bounds__(LB) hungry(const float* __restrict__ x, float* __restrict__ y, int n) {
  __shared__ float tile[STATIC_FLOATS + 1];
  extern __shared__ float dyn[];
  float acc[ACC];
#pragma unroll
  for (int k = 0; k < ACC; ++k) acc[k] = x[(threadIdx.x * (k + 1)) % n];
  for (int it = 0; it < n; ++it) {
#pragma unroll
    for (int k = 0; k < ACC; ++k) acc[k] = fmaf(acc[k], acc[(k + 1) % ACC], x[(it + k) % n]);
  }
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < ACC; ++k) s += acc[k];
  tile[threadIdx.x % (STATIC_FLOATS + 1)] = s;
  dyn[threadIdx.x] = s;
  __syncthreads();
  y[blockIdx.x * blockDim.x + threadIdx.x] = tile[(threadIdx.x + 1) % (STATIC_FLOATS + 1)] + dyn[0];
}
"""


def build(acc, cap, static_floats, launch_bounds):
    src = (SOURCE.replace("STATIC_FLOATS", str(static_floats)).replace("ACC", str(acc))
           .replace("LB", str(launch_bounds)))
    opts = ("--std=c++17",) + ((f"--maxrregcount={cap}",) if cap else ())
    mod = cupy.RawModule(code=src, options=opts, backend="nvrtc")
    return mod.get_function("hungry")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--configs", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=20261121)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    dev = cupy.cuda.Device(0)
    props = runtime.getDeviceProperties(0)
    cc = f"{props['major']}{props['minor']}"
    clean = {k: (v.decode(errors="replace").rstrip("\0") if isinstance(v, bytes) else v)
             for k, v in props.items() if isinstance(v, (int, float, str, bytes))}
    clean["_recorded"] = datetime.date.today().isoformat()
    clean["_optin_shared_per_block"] = dev.attributes["MaxSharedMemoryPerBlockOptin"]
    with open(os.path.join(a.out, f"device_sm{cc}.json"), "w") as fh:
        json.dump(clean, fh, indent=1, sort_keys=True)

    optin = dev.attributes["MaxSharedMemoryPerBlockOptin"]
    kernels = []
    for acc in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128):
        for cap in (0, 17, 23, 24, 31, 33, 40, 47, 56, 63, 64, 72, 80, 95, 96, 128, 129, 168, 200, 255):
            kernels.append((acc, cap))
    rng.shuffle(kernels)
    kernels = kernels[:120]
    built, attrs, seen_regs = [], [], {}
    for i, (acc, cap) in enumerate(kernels):
        static_floats = rng.choice([0, 31, 255, 1023, 4095, 8191, 12000])
        lb = rng.choice([1024, 1024, 1024, 512, 256, 128, 96])
        fn = build(acc, cap, static_floats, lb)
        regs = fn.num_regs
        static = fn.shared_size_bytes
        mtpb = fn.max_threads_per_block
        fn.max_dynamic_shared_size_bytes = optin - static
        attrs.append(dict(acc=acc, cap=cap, launch_bounds=lb, registers=regs, static_shared_bytes=static,
                          max_threads_per_block=mtpb, max_dynamic_shared_bytes=optin - static))
        built.append((fn, regs, static, mtpb, optin - static))
        seen_regs[regs] = seen_regs.get(regs, 0) + 1
    with open(os.path.join(a.out, f"kernel_attrs_sm{cc}.csv"), "w") as fh:
        fh.write(f"# Recorded on {clean['name']} (sm_{cc}) on {clean['_recorded']} with cupy {cupy.__version__},\n")
        fh.write("# by tools/gpu/record_occupancy.py: cuFuncGetAttribute for kernels of varied register appetite,\n")
        fh.write("# -maxrregcount caps and __launch_bounds__.\n")
        fh.write(",".join(attrs[0].keys()) + "\n")
        for r in attrs:
            fh.write(",".join(str(v) for v in r.values()) + "\n")

    rows = []
    for _ in range(a.configs):
        fn, regs, static, mtpb, maxdyn = rng.choice(built)
        r = rng.random()
        if r < 0.35:
            block = rng.randint(1, mtpb)
        elif r < 0.7:
            block = 32 * rng.randint(1, mtpb // 32)
        else:
            block = rng.choice([b for b in (1, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 192, 255, 256, 257,
                                               320, 384, 448, 511, 512, 513, 640, 768, 896, 1000, 1023, 1024) if b <= mtpb])
        r = rng.random()
        if r < 0.3:
            dyn = 0
        elif r < 0.6:
            dyn = rng.randint(0, maxdyn)
        elif r < 0.8:
            dyn = rng.randint(0, min(maxdyn, 48 * 1024))
        else:
            dyn = min(maxdyn, rng.choice([1, 1024, 4096, 8192, 16384, 32768, 49152, 65536, 100 * 1024, 132 * 1024, 164 * 1024,
                                          196 * 1024, 227 * 1024]) - rng.choice([0, 0, 1, 1024, 1025]))
            dyn = max(dyn, 0)
        blocks = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr if hasattr(fn, "kernel") else fn.ptr, block, dyn)
        rows.append((block, regs, static, dyn, maxdyn, blocks))
    with open(os.path.join(a.out, f"occupancy_sm{cc}.csv"), "w") as fh:
        fh.write(f"# Recorded on {clean['name']} (sm_{cc}), driver {runtime.driverGetVersion()}, on {clean['_recorded']},\n")
        fh.write("# by tools/gpu/record_occupancy.py: cuOccupancyMaxActiveBlocksPerMultiprocessor (flags 0, default carveout)\n")
        fh.write(f"# over {a.configs} random configurations of {len(built)} kernels (registers = the kernel's NUM_REGS,\n")
        fh.write("# static_shared_bytes = SHARED_SIZE_BYTES, dynamic opted in up to MAX_DYNAMIC_SHARED_SIZE_BYTES).\n")
        fh.write("block_size,registers,static_shared_bytes,dynamic_shared_bytes,max_dynamic_shared_bytes,blocks_per_sm\n")
        for row in rows:
            fh.write(",".join(map(str, row)) + "\n")
    print(f"device {clean['name']} sm_{cc}: {len(built)} kernels, register counts seen: {sorted(seen_regs)}")
    print(f"{len(rows)} occupancy rows; blocks_per_sm histogram:",
          {b: sum(1 for r in rows if r[-1] == b) for b in sorted({r[-1] for r in rows})})


if __name__ == "__main__":
    main()
