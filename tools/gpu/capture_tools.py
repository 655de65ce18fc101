"""Capture real ncu and compute-sanitizer outputs on the GPU machine, as fixtures for the parsers' tests.

Usage there: python3 tools/gpu/capture_tools.py OUTDIR   (child mode: capture_tools.py --run CASE)
"""
import os
import subprocess
import sys

SRC = r"""
extern "C" __global__ void transpose_naive(const float* in, float* out, int n) {
    __shared__ float tile[32][32];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x; y = blockIdx.x * 32 + threadIdx.y;
    out[y * n + x] = tile[threadIdx.x][threadIdx.y];
}
extern "C" __global__ void oob_write(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i + n] = 1.0f;
}
extern "C" __global__ void race(float* x) {
    __shared__ float s[64];
    s[threadIdx.x % 64] = threadIdx.x;
    x[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}
extern "C" __global__ void uninit(const float* x, float* y) { y[threadIdx.x] = x[threadIdx.x] * 2.0f; }
extern "C" __global__ void divergent_sync(float* x) {
    if (threadIdx.x < 16) __syncthreads();
    x[threadIdx.x] = 1.0f;
}
"""


def child(case):
    import cupy

    mod = cupy.RawModule(code=SRC, options=("-lineinfo",), backend="nvrtc")
    n = 1024
    if case == "transpose":
        a = cupy.random.rand(n * n, dtype=cupy.float32)
        b = cupy.empty_like(a)
        mod.get_function("transpose_naive")((n // 32, n // 32), (32, 32), (a, b, cupy.int32(n)))
    elif case == "oob":
        x = cupy.zeros(256, dtype=cupy.float32)
        mod.get_function("oob_write")((1,), (256,), (x, cupy.int32(256)))
    elif case == "race":
        x = cupy.zeros(256, dtype=cupy.float32)
        mod.get_function("race")((1,), (256,), (x,))
    elif case == "uninit":
        x = cupy.empty(64, dtype=cupy.float32)
        y = cupy.zeros(64, dtype=cupy.float32)
        mod.get_function("uninit")((1,), (64,), (x, y))
    elif case == "sync":
        x = cupy.zeros(32, dtype=cupy.float32)
        mod.get_function("divergent_sync")((1,), (32,), (x,))
    cupy.cuda.runtime.deviceSynchronize()


def main():
    if sys.argv[1] == "--run":
        child(sys.argv[2])
        return
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__), "--run"]
    metrics = ("gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,"
               "dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,"
               "l1tex__t_sector_hit_rate.pct,lts__t_sector_hit_rate.pct,"
               "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,"
               "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,"
               "smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_shared_st.sum,dram__bytes.sum")
    runs = {
        "ncu_metrics_raw.csv": ["ncu", "--clock-control", "none", "--csv", "--page", "raw", "-k", "regex:transpose",
                                "--metrics", metrics] + me + ["transpose"],
        "ncu_metrics_details.csv": ["ncu", "--clock-control", "none", "--csv", "-k", "regex:transpose",
                                    "--metrics", metrics] + me + ["transpose"],
        "ncu_source_cuda.csv": ["ncu", "--clock-control", "none", "--csv", "--page", "source", "--print-source", "cuda",
                                "--section", "SourceCounters", "-k", "regex:transpose"] + me + ["transpose"],
        "ncu_source_sass.csv": ["ncu", "--clock-control", "none", "--csv", "--page", "source", "--print-source",
                                "cuda,sass", "--section", "SourceCounters", "-k", "regex:transpose"] + me + ["transpose"],
        "ncu_full_details.csv": ["ncu", "--clock-control", "none", "--csv", "--set", "full", "-k", "regex:transpose"]
                                + me + ["transpose"],
        "ncu_list_sets.txt": ["ncu", "--list-sets"],
        "sanitizer_memcheck.txt": ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "20"] + me + ["oob"],
        "sanitizer_racecheck.txt": ["compute-sanitizer", "--tool", "racecheck", "--racecheck-report", "all"] + me + ["race"],
        "sanitizer_initcheck.txt": ["compute-sanitizer", "--tool", "initcheck"] + me + ["uninit"],
        "sanitizer_synccheck.txt": ["compute-sanitizer", "--tool", "synccheck"] + me + ["sync"],
        "sanitizer_memcheck.xml": ["compute-sanitizer", "--tool", "memcheck", "--xml", "--save",
                                   os.path.join(out, "sanitizer_memcheck_saved.xml")] + me + ["oob"],
    }
    for name, cmd in runs.items():
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        with open(os.path.join(out, name), "w") as fh:
            fh.write(f"# command: {' '.join(cmd[:12])} ...\n# exit: {p.returncode}\n")
            fh.write(p.stdout)
            if p.stderr:
                fh.write("\n# --- stderr ---\n" + p.stderr)
        print(f"{name}: exit {p.returncode}, {len(p.stdout)} chars")


if __name__ == "__main__":
    main()
