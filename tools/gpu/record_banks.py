"""Record shared-memory wavefronts of single-warp load patterns with Nsight Compute, as a golden table.

Run on a GPU machine: python3 tools/gpu/record_banks.py OUTDIR
It writes the patterns, re-runs itself under ncu (one launch per pattern, one shared load
instruction each) and writes OUTDIR/banks_sm<cc>.csv for tests/test_banks.py.
"""
import csv
import datetime
import io
import os
import random
import subprocess
import sys

SMEM_BYTES = 40960
KERNELS = r"""
extern "C" __global__ void ld4(const int* __restrict__ offs, unsigned* __restrict__ out) {
  __shared__ __align__(16) unsigned char smem[SMEM];
  int o = offs[threadIdx.x];
  unsigned a = 0;
  if (o >= 0) {
    unsigned p = (unsigned)__cvta_generic_to_shared(smem + o);
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(a) : "r"(p));
  }
  out[threadIdx.x] = a;
}
extern "C" __global__ void ld8(const int* __restrict__ offs, unsigned* __restrict__ out) {
  __shared__ __align__(16) unsigned char smem[SMEM];
  int o = offs[threadIdx.x];
  unsigned a = 0, b = 0;
  if (o >= 0) {
    unsigned p = (unsigned)__cvta_generic_to_shared(smem + o);
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "r"(p));
  }
  out[threadIdx.x] = a ^ b;
}
extern "C" __global__ void ld16(const int* __restrict__ offs, unsigned* __restrict__ out) {
  __shared__ __align__(16) unsigned char smem[SMEM];
  int o = offs[threadIdx.x];
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (o >= 0) {
    unsigned p = (unsigned)__cvta_generic_to_shared(smem + o);
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(p));
  }
  out[threadIdx.x] = a ^ b ^ c ^ d;
}
""".replace("SMEM", str(SMEM_BYTES))


def patterns(seed=7):
    """All (name, width, 32 offsets with -1 for an inactive lane)."""
    rng = random.Random(seed)
    out = []
    for w in (4, 8, 16):
        limit = SMEM_BYTES // w  # elements
        for s in list(range(0, 34)) + [40, 48, 63, 64, 65, 96, 127, 128, 129, 255, 256, 257]:
            if 31 * s < limit:
                out.append((f"stride{s}", w, [lane * s * w for lane in range(32)]))
        if w > 4:  # strides measured in 4-byte words, for wide accesses (aligned multiples only)
            for words in (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 32, 33):
                if (words * 4) % w == 0:
                    continue
                out.append((f"wordstride{words}", w, [((lane * words * 4) // w) * w for lane in range(32)]))
        for k in range(12):
            perm = list(range(32))
            rng.shuffle(perm)
            out.append((f"perm{k}", w, [p * w for p in perm]))
        for k in range(24):
            span = rng.choice([64, 256, 1024, 4096, SMEM_BYTES])
            out.append((f"random{k}_span{span}", w, [rng.randrange(0, span // w) * w for _ in range(32)]))
        for k in range(12):
            words = [rng.randrange(0, 1024 // w) * w for _ in range(rng.choice([2, 3, 4, 8]))]
            out.append((f"fewwords{k}", w, [rng.choice(words) for _ in range(32)]))
        out.append(("broadcast_all", w, [128] * 32))
        out.append(("halves_same", w, [(lane % 16) * w for lane in range(32)]))
        out.append(("quarters_same", w, [(lane % 8) * w for lane in range(32)]))
        out.append(("pairs_same", w, [(lane // 2) * w for lane in range(32)]))
        out.append(("transpose_col32", w, [lane * 32 * w for lane in range(32)]))
        out.append(("transpose_col33", w, [lane * 33 * w for lane in range(32)]))
        out.append(("swizzle_xor", w, [(lane * 32 + (lane ^ 5)) * w for lane in range(32)]))
        out.append(("rev", w, [(31 - lane) * w for lane in range(32)]))
        out.append(("half_offset", w, [(lane + (16 if lane < 16 else -16)) * w for lane in range(32)]))
        for k in range(16):
            base = rng.choice([[lane * w for lane in range(32)], [lane * 2 * w for lane in range(32)],
                               [lane * 32 * w for lane in range(32)], [lane * 3 * w for lane in range(32)]])
            mask_p = rng.choice([0.2, 0.5, 0.8])
            addrs = [a if rng.random() > mask_p else -1 for a in base]
            if all(a < 0 for a in addrs):
                addrs[rng.randrange(32)] = base[0]
            out.append((f"inactive{k}", w, addrs))
        out.append(("one_lane", w, [-1] * 31 + [64 * w]))
        out.append(("even_lanes", w, [lane * w if lane % 2 == 0 else -1 for lane in range(32)]))
        out.append(("first_half", w, [lane * w if lane < 16 else -1 for lane in range(32)]))
        out.append(("second_half_conflict", w, [lane * 32 * w if lane >= 16 else -1 for lane in range(32)]))
    for name, w, addrs in out:
        assert len(addrs) == 32 and all(a % w == 0 and a + w <= SMEM_BYTES for a in addrs if a >= 0), name
    return out


def launch_all(pfile):
    """Child mode (under ncu): launch one kernel per pattern, in the order of the file."""
    import cupy
    mod = cupy.RawModule(code=KERNELS, backend="nvrtc")
    fns = {w: mod.get_function(f"ld{w}") for w in (4, 8, 16)}
    out = cupy.zeros(32, dtype=cupy.uint32)
    with open(pfile) as fh:
        for line in fh:
            name, w, addrs = line.rstrip("\n").split(",")
            offs = cupy.asarray([int(a) for a in addrs.split()], dtype=cupy.int32)
            fns[int(w)]((1,), (32,), (offs, out))
    cupy.cuda.runtime.deviceSynchronize()


def main():
    if sys.argv[1] == "--child":
        launch_all(sys.argv[2])
        return
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    pats = patterns()
    pfile = os.path.join(outdir, "bank_patterns.txt")
    with open(pfile, "w") as fh:
        for name, w, addrs in pats:
            fh.write(f"{name},{w},{' '.join(map(str, addrs))}\n")
    metrics = ["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "smsp__sass_inst_executed_op_shared_ld.sum",
               "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"]
    cmd = ["ncu", "--clock-control", "none", "--csv", "--metrics", ",".join(metrics), "-k", "regex:^ld(4|8|16)$",
           sys.executable, os.path.abspath(__file__), "--child", pfile]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(outdir, "ncu_banks_raw.csv"), "w") as fh:
        fh.write(proc.stdout)
        fh.write(proc.stderr)
    lines = [l for l in proc.stdout.splitlines() if l.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    by_id = {}
    for r in rows:
        by_id.setdefault(int(r["ID"]), {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    ids = sorted(by_id)
    if len(ids) != len(pats):
        print(f"ncu returned {len(ids)} kernels for {len(pats)} patterns; see ncu_banks_raw.csv", proc.stderr[-2000:])
        sys.exit(1)
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    cc = "".join(map(str, cupy.cuda.Device(0).compute_capability))
    with open(os.path.join(outdir, f"banks_sm{cc}.csv"), "w") as fh:
        fh.write(f"# Recorded on {name} (sm_{cc}) on {datetime.date.today().isoformat()} by tools/gpu/record_banks.py:\n")
        fh.write("# one single-warp launch per pattern, one ld.shared of access_bytes per active lane, measured with\n")
        fh.write("# ncu --clock-control none: wavefronts = l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,\n")
        fh.write("# instructions = smsp__sass_inst_executed_op_shared_ld.sum, conflicts = l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum.\n")
        fh.write("# addresses: 32 byte offsets, -1 = inactive lane.\n")
        fh.write("pattern,access_bytes,addresses,wavefronts,instructions,conflicts\n")
        for (pname, w, addrs), i in zip(pats, ids):
            m = by_id[i]
            fh.write(f"{pname},{w},{' '.join(map(str, addrs))},{int(m[metrics[0]])},{int(m[metrics[1]])},{int(m[metrics[2]])}\n")
    print(f"{len(pats)} bank patterns recorded on {name}")


if __name__ == "__main__":
    main()
