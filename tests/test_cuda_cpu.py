"""CUDA C++ on the CPU (kernellab.run.sim.cuda): `%%cuda --sim` and kernels where no GPU is usable launch on CPU
tensors and NumPy arrays, and the checks find held-out bugs at the right cell line, in compute-sanitizer's terms."""
import pathlib

import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell

import kernellab
from kernellab.errors import KernellabError
from kernellab.run.sim.cuda import compiler
from kernellab.run.sim.cuda.cpu import CpuLaunchError, unsupported

pytestmark = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler (pip install ziglang)")


def cell(source: str):
    """A %%cuda cell's module on the CPU path (the magic line is line 1, the source starts at line 2)."""
    return kernellab.compile_cuda(source, arch="sm_90", first_line=2, filename="cell.cu", simulate=True)


def line_of(source: str, marker: str) -> int:
    """The cell line of the source line holding `marker` (line 1 is the magic's)."""
    return next(i for i, text in enumerate(source.splitlines(), start=2) if marker in text)


# --- launches: the GPU's syntax and checks, on CPU tensors and NumPy arrays -------------------------------------

VADD = """extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


def test_launch_syntax_on_numpy_and_torch():
    import torch

    m = cell(VADD)
    a, b = np.arange(300, dtype=np.float32), np.ones(300, np.float32)
    c = np.zeros(300, np.float32)
    m.vadd[3, 128](a, b, c, 300)
    np.testing.assert_array_equal(c, a + 1)
    ta, tc = torch.arange(77, dtype=torch.float32), torch.zeros(77)
    m.vadd[(1, 1), (96, 1)](ta, ta, tc, 77)
    assert torch.equal(tc, 2 * ta)
    with pytest.raises(KernellabError, match="float32"):      # the GPU path's argument checks
        m.vadd[1, 32](a.astype(np.float64), b, c, 300)


def test_cpu_launch_takes_the_kernel_as_a_value():
    """kernellab.run.sim.cuda's launch receives Kernel.image() (a KernelImage, as the GPU path's jobs do), rebuilt
    from its bytes, and never the Kernel object; one build serves every image of the same module."""
    import pickle

    from kernellab.run.sim.cuda import cpu

    m = cell(VADD)
    image = pickle.loads(pickle.dumps(m.vadd.image()))
    a, c = np.arange(50, dtype=np.float32), np.zeros(50, np.float32)
    cpu.launch(image, 1, 64, (a, a, c, 50))
    np.testing.assert_array_equal(c, 2 * a)
    assert cpu.host_kernel(image) is not None and cpu.host_kernel(m.vadd.image()).host is cpu.host_kernel(image).host
    with pytest.raises(TypeError, match="KernelImage"):
        cpu.launch(m.vadd, 1, 64, (a, a, c, 50))
    with pytest.raises(KernellabError, match="float32"):       # the GPU path's argument checks, on the image
        cpu.launch(image, 1, 64, (a.astype(np.float64), a, c, 50))
    bad = cpu.sanitize(image, 1, 64, (a, a, c, 64), tool="memcheck")
    assert bad.kernel == "vadd" and bad.error_count > 0               # n = 64 past the arrays' 50: found, by name
    assert cpu.sanitize(image, 1, 64, (a, a, c, 50), tool="memcheck").error_count == 0


def test_out_of_bounds_raises_naming_line_thread_and_block():
    src = VADD.replace("if (i < n) c[i]", "c[i]")
    m = cell(src)
    a = np.zeros(100, np.float32)
    c = np.zeros(100, np.float32)
    with pytest.raises(CpuLaunchError) as info:
        m.vadd[1, 128](a, a, c, 100)
    e = info.value
    assert e.line == line_of(src, "c[i] = a[i]") and e.block == (0, 0, 0) and e.thread == (100, 0, 0)
    assert f"out of bounds at cell line {e.line}" in str(e) and "a[100]" in str(e)
    np.testing.assert_array_equal(c, 0)           # the 100 threads inside wrote, the others' writes were dropped


def test_magic_sim_binds_cpu_kernels_and_says_so_in_one_line():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernellab")
    result = ip.run_cell("%%cuda --sim --name simmod\n" + VADD)
    assert result.success, result.error_in_exec
    k = ip.user_ns["vadd"]
    assert k.simulate
    notes = [n for n in ip.user_ns["simmod"].notes if "on the CPU" in n]
    assert len(notes) == 1 and "--sim" in notes[0]
    ip.user_ns["x"] = np.ones(40, np.float32)
    ip.user_ns["y"] = np.zeros(40, np.float32)
    assert ip.run_cell("vadd[1, 64](x, x, y, 40)").success
    np.testing.assert_array_equal(ip.user_ns["y"], 2)


# --- held-out bugs, each caught with its line -------------------------------------------------------------------

MISSING_GUARD = """__global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = 2.0f * x[i];                                 // BUG: no i < n
}
"""
PAST_THE_END = """__global__ void diff(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i + 1] - x[i];                  // BUG: x[n] at i = n - 1
}
"""
SHARED_OFF_BY_ONE = """__global__ void shift(const float* x, float* y, int n) {
    __shared__ float tile[64];
    int t = threadIdx.x, i = blockIdx.x * 64 + t;
    if (i < n) tile[t + 1] = x[i];                      // BUG: tile[64] for t = 63
    __syncthreads();
    if (i < n) y[i] = tile[t];
}
"""
MISSING_BARRIER = """__global__ void flip(const float* x, float* y) {
    __shared__ float tile[64];
    int t = threadIdx.x;
    tile[t] = x[blockIdx.x * 64 + t];                   // WRITE
    y[blockIdx.x * 64 + t] = tile[63 - t];              // BUG: no __syncthreads() before this read
}
"""
DIVERGENT_BARRIER = """__global__ void flip_tail(const float* x, float* y, int n) {
    __shared__ float tile[64];
    int t = threadIdx.x, i = blockIdx.x * 64 + t;
    if (i < n) {
        tile[t] = x[i];
        __syncthreads();                                // BUG: the threads past n never reach it
        y[i] = tile[t ^ 1];
    }
}
"""
UNINITIALISED = """__global__ void half_tile(const float* x, float* y) {
    __shared__ float tile[64];
    int t = threadIdx.x;
    if (t < 32) tile[t] = x[t];
    __syncthreads();
    y[t] = tile[63 - t];                                // BUG: tile[32..63] were never written
}
"""
N = 100


def _args(n_in=N, n_out=N):
    return (np.arange(n_in, dtype=np.float32), np.zeros(n_out, np.float32))


@pytest.mark.parametrize("name, source, launch, tool, kind", [
    ("missing guard", MISSING_GUARD, lambda k: k.sanitize(1, 128, *_args(), N, tool="memcheck"), "memcheck",
     "invalid_read"),
    ("reading past the end", PAST_THE_END, lambda k: k.sanitize(2, 64, *_args(), N, tool="memcheck"), "memcheck",
     "invalid_read"),
    ("off-by-one in shared memory", SHARED_OFF_BY_ONE, lambda k: k.sanitize(2, 64, *_args(), N, tool="memcheck"),
     "memcheck", "invalid_access"),
    ("divergent barrier", DIVERGENT_BARRIER, lambda k: k.sanitize(2, 64, *_args(), N, tool="synccheck"),
     "synccheck", "barrier"),
    ("uninitialised shared read", UNINITIALISED, lambda k: k.sanitize(1, 64, *_args(64, 64), tool="initcheck"),
     "initcheck", "uninitialized_read"),
])
def test_held_out_bug_is_caught_at_its_line(name, source, launch, tool, kind):
    m = cell(source)
    rep = launch(m.kernels[0])
    assert not rep.ok and rep.simulated, str(rep)
    f = rep.findings[0]
    assert (f.tool, f.kind) == (tool, kind), str(rep)
    assert f.where.cell_line == line_of(source, "BUG"), str(rep)
    assert f.thread is not None and f.block is not None
    assert "BUG" in f.where.source_line


def test_missing_barrier_is_a_race_between_the_two_lines():
    m = cell(MISSING_BARRIER)
    rep = m.flip.sanitize(2, 64, *_args(128, 128), tool="racecheck")
    assert [f.kind for f in rep.findings] == ["race"], str(rep)
    f = rep.findings[0]
    assert set(f.lines) == {line_of(MISSING_BARRIER, "WRITE"), line_of(MISSING_BARRIER, "BUG")}
    assert f.hazard in ("RAW", "WAR") and f.other_thread is not None and f.thread != f.other_thread
    fixed = MISSING_BARRIER.replace("    y[blockIdx", "    __syncthreads();\n    y[blockIdx")
    assert cell(fixed).flip.sanitize(2, 64, *_args(128, 128), tool="all").ok


def test_same_warp_accesses_ordered_by_syncwarp_are_no_race():
    src = """__global__ void warp_flip(const float* x, float* y) {
    __shared__ float tile[32];
    tile[threadIdx.x] = x[threadIdx.x];
    __syncwarp();
    y[threadIdx.x] = tile[31 - threadIdx.x];
}
"""
    assert cell(src).warp_flip.sanitize(1, 32, *_args(32, 32), tool="racecheck").ok
    racy = cell(src.replace("    __syncwarp();\n", ""))
    assert [f.kind for f in racy.warp_flip.sanitize(1, 32, *_args(32, 32), tool="racecheck").findings] == ["race"]


def test_early_return_before_the_barrier_is_clean():
    src = """__global__ void guarded(const float* x, float* y, int n) {
    __shared__ float tile[64];
    int t = threadIdx.x, i = blockIdx.x * 64 + t;
    if (blockIdx.x * 64 >= n) return;
    tile[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = tile[t ^ 1];
}
"""
    assert cell(src).guarded.sanitize(3, 64, *_args(), N, tool="all").ok


# --- the fault suite's out-of-bounds kernels (tests/gpu/test_faults_gpu.py), reported, not crashed -------------

FAULTS = """extern "C" __global__ void oob_write(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i + n] = 1.0f;
}
extern "C" __global__ void oob_read(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i + n];
}
"""


def test_fault_suite_out_of_bounds_cases_are_reported():
    m = cell(FAULTS)
    buf = np.zeros(1024, np.float32)
    with pytest.raises(CpuLaunchError, match=rf"out of bounds at cell line {line_of(FAULTS, 'x[i + n] = 1.0f;')}"):
        m.oob_write[4, 256](buf, 1 << 28)
    assert not buf.any()                                   # nothing was written outside or inside
    rep = m.oob_read.sanitize(4, 256, buf, buf, 1 << 28, tool="memcheck")
    assert rep.findings[0].kind == "invalid_read" and rep.findings[0].count == 4 * 256     # every thread, one finding
    assert rep.findings[0].where.cell_line == line_of(FAULTS, "y[i] = x[i + n];")


def test_a_null_pointer_argument_is_reported_not_a_crash_of_the_process():
    """None for a pointer (a null pointer on a GPU): every access through it is out of bounds, reported at its line;
    the process (the notebook's kernel) lives on. Run in a child so that a regression shows as a crash, not a hang."""
    import subprocess
    import sys

    code = (
        "import kernellab\n"
        "from kernellab.run.sim.cuda.cpu import CpuLaunchError\n"
        "m = kernellab.compile_cuda('extern \"C\" __global__ void k(float* x) { x[threadIdx.x] = 1; }', simulate=True)\n"
        "try:\n"
        "    m.k[1, 32](None)\n"
        "except CpuLaunchError as e:\n"
        "    print('reported:', e.line, e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "reported: 1 " in p.stdout and "out of bounds at cell line 1" in p.stdout, p.stdout + p.stderr[-2000:]


# --- what the CPU path cannot run: said, never passed ------------------------------------------------------------

def test_inline_ptx_it_does_not_emulate_is_named_and_the_grade_is_not_passed():
    src = """extern "C" __global__ void reverse(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    asm volatile("membar.gl;" ::: "memory");
    if (i < n) out[i] = in[n - 1 - i];
}
"""
    assert "inline PTX" in unsupported(src, 2) and "line 4" in unsupported(src, 2)
    assert "wgmma" in unsupported('__global__ void k() { asm volatile("wgmma.fence.sync.aligned;"); }')
    r = kernellab.grade("01-reverse", kernellab.compile_cuda(src, arch="sm_90", first_line=2).reverse, speed=False)
    assert not r.passed and not r.findings and "inline PTX" in r.needs_gpu, str(r)
    assert "not run" in r.verdict


def test_unguarded_reverse_fails_the_grade_with_out_of_bounds_at_its_line():
    src = """extern "C" __global__ void reverse(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = in[n - 1 - i];
}
"""
    r = kernellab.grade("01-reverse", kernellab.compile_cuda(src, arch="sm_90", first_line=2).reverse, speed=False)
    assert not r.passed
    oob = [f for f in r.findings if f.kind == "out_of_bounds"]
    assert oob and oob[0].message.startswith(f"out of bounds at cell line {line_of(src, 'out[i] =')}"), str(r)


# --- what the checked build handles, and what it says where it cannot --------------------------------------------

TEMPLATED = """template <typename T>
__global__ void count_above(const T* x, unsigned* hits, T threshold, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && __ldg(x + i) > threshold) atomicAdd(hits, 1u);
    if (i == n) atomicAdd(hits + 1, 1u);                 // BUG: hits has one element
}
template __global__ void count_above<float>(const float*, unsigned*, float, int);
"""


def test_templates_explicit_instantiations_ldg_and_atomics_are_checked():
    m = cell(TEMPLATED)
    host = m.kernels[0]
    x = np.arange(100, dtype=np.float32)
    hits = np.zeros(1, np.uint32)
    rep = host.sanitize(1, 128, x, hits, np.float32(49.5), 100, tool="memcheck")
    assert [f.kind for f in rep.findings] == ["invalid_write"], str(rep)
    assert rep.findings[0].where.cell_line == line_of(TEMPLATED, "BUG")
    assert not any("fewer" in n or "did not compile" in n for n in rep.notes), rep.notes
    host[1, 100](x, hits, np.float32(49.5), 100)
    assert hits[0] == 50


def test_a_kernel_the_checked_build_cannot_compile_runs_unchecked_and_says_so():
    src = """template <typename T> __device__ T first(const T* p) { return p[0]; }
__global__ void copy_first(const float* x, float* y) { y[threadIdx.x] = first(x) + threadIdx.x; }
"""
    m = cell(src)
    y = np.zeros(4, np.float32)
    rep = m.copy_first.sanitize(1, 4, np.full(1, 2, np.float32), y, tool="memcheck")
    assert rep.ok and any("did not compile" in n and "not the bounds of the pointer arguments" in n
                          for n in rep.notes), rep.notes
    m.copy_first[1, 4](np.full(1, 2, np.float32), y)
    np.testing.assert_array_equal(y, [2, 3, 4, 5])


def test_a_kernel_whose_pointers_go_to_a_template_keeps_its_shared_memory_checks():
    """Checked pointers do not deduce T in a template taking T*: that kernel is built with plain pointer arguments
    and still checked arrays, so a missing barrier is still a race, and the build says what it does not check."""
    src = """template <typename T> __device__ T load(const T* x, int i) { return x[i]; }
__global__ void rotate(const float* x, float* y) {
    __shared__ float s[64];
    s[threadIdx.x] = load(x, threadIdx.x);
    y[threadIdx.x] = s[(threadIdx.x + 1) % 64];      // no barrier before this read
}
"""
    m = cell(src)
    x, y = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    rep = m.rotate.sanitize(1, 64, x, y, tool="racecheck")
    assert any("not the bounds of the pointer arguments" in n for n in rep.notes), rep.notes
    assert rep.findings and rep.findings[0].kind == "race", rep


def test_a_launch_with_fewer_checks_runs_in_a_child_and_a_crash_is_reported():
    src = """template <typename T> __device__ void put(T* p, long i, T v) { p[i] = v; }
__global__ void scatter(float* y, long far) { put(y, threadIdx.x == 3 ? far : (long)threadIdx.x, 1.0f); }
"""
    m = cell(src)
    y = np.zeros(4, np.float32)
    m.scatter[1, 3](y, 0)                             # in bounds: the child's writes come back
    np.testing.assert_array_equal(y, [1, 1, 1, 0])
    with pytest.raises(CpuLaunchError, match="crashed the CPU path"):
        m.scatter[1, 4](y, 1 << 40)                   # far out of bounds, unchecked: the child dies, not this process


# --- tutorial 05's warp-level PTX (cp.async, ldmatrix, mma.sync) on the fiber scheduler -------------------------

# One mma.sync product fed by cp.async and ldmatrix (tests/test_kl_headers.py builds it with every header too).
MMA_CELL = ("#include <kl/cp_async.cuh>\n#include <kl/mma.cuh>\n"
            + (pathlib.Path(__file__).parent / "fixtures" / "mma_16x8x16.cu").read_text())


def mma_case():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((16, 16)).astype(np.float16)
    B = rng.standard_normal((8, 16)).astype(np.float16)
    return A, B, np.full((16, 8), np.nan, np.float32), A.astype(np.float64) @ B.astype(np.float64).T


def test_mma_sync_ldmatrix_and_cp_async_run_on_fibers_as_on_threads():
    """One runtime, two ways in: compile_host (with its checks) and emulate (a program, shared memory as an arena) give
    the same bits for tutorial 05's PTX."""
    from kernellab.run.sim.cuda.emulate import compile_host
    from kernellab.run.sim.cuda.emulate import emulate

    A, B, C, ref = mma_case()
    compile_host(MMA_CELL)["k"][1, 32](A, B, C)
    np.testing.assert_allclose(C, ref, rtol=1e-4, atol=1e-3)
    C2 = np.full_like(C, np.nan)
    emulate(MMA_CELL, "k", (1,), (32,), [A, B, C2])
    np.testing.assert_array_equal(C, C2)


def test_warp_collectives_on_fibers_need_the_whole_warp_and_waited_copies():
    from kernellab.run.sim.cuda.emulate import CpuKernelError, compile_host

    A, B, C, _ = mma_case()
    with pytest.raises(CpuKernelError, match="all 32 lanes"):       # a block of 16 threads: half a warp
        compile_host(MMA_CELL)["k"][1, 16](A, B, C)
    early = MMA_CELL.replace("    const int lane = threadIdx.x,", "    if (threadIdx.x == 5) return;\n"
                                                                       "    const int lane = threadIdx.x,")
    with pytest.raises(CpuKernelError, match="lane 5 of warp 0 has exited"):
        compile_host(early)["k"][1, 32](A, B, C)
    unwaited = MMA_CELL.replace("    cp_async_wait<0>();\n", "").replace("    cp_async_commit();\n", "    cp_async_commit();\n"
                                                                          "    if (threadIdx.x > 0) return;\n")
    with pytest.raises(CpuKernelError, match="never waited for"):
        compile_host(unwaited)["k"][1, 32](A, B, C)


def test_a_tensor_core_kernel_gets_memcheck_on_fibers():
    from kernellab.run.sim.cuda.emulate import compile_host

    A, B, C, _ = mma_case()
    src = MMA_CELL.replace("C[(g + 8 * (q / 2)) * 8", "C[(g + 8 * (q / 2) + 1) * 8")     # one row too far down
    run = compile_host(src).__getitem__("k").run(1, 32, A, B, C)
    mem = [f for f in run.findings if f.tool == "memcheck"]
    assert mem and mem[0].where.cell_line == line_of(src, "// C store") and "C[128]" in mem[0].detail



def test_a_tensor_core_kernel_gets_racecheck_and_initcheck_on_fibers():
    """cp.async's writes and ldmatrix's reads of a shared array are checked as C++ accesses of its elements are: the
    barrier between them missing is a race, half the tile never copied is an uninitialised read; the right kernel
    has neither."""
    from kernellab.run.sim.cuda.emulate import compile_host

    A, B, C, _ = mma_case()
    ok = compile_host(MMA_CELL)["k"].run(1, 32, A, B, C)
    assert not ok.error and ok.findings == (), ok.findings
    no_barrier = MMA_CELL.replace("    __syncthreads();\n", "")
    races = [f for f in compile_host(no_barrier)["k"].run(1, 32, A, B, C).findings if f.tool == "racecheck"]
    assert races and "a_s[" in races[0].detail and "ldmatrix" in races[0].detail, races
    half = MMA_CELL.replace("    cp_async_16(", "    if (threadIdx.x < 16) cp_async_16(")
    init = [f for f in compile_host(half)["k"].run(1, 32, A, B, C).findings if f.tool == "initcheck"]
    assert init and init[0].kind == "uninitialized_read" and "a_s[" in init[0].detail, init
    assert all(int(f.detail.split("a_s[")[1].split("]")[0]) >= 128 for f in init)     # rows 8..15: never copied


# --- launches the GPU refuses for resources are refused on the CPU too, in the GPU path's words ---------------------

HEAVY = r"""#define NREG 224
extern "C" __global__ void __maxnreg__(NREG) heavy(const float* x, float* y, int n) {
    float v[200];                       // 200 values a thread, all live across the barrier: ptxas needs the registers
    #pragma unroll
    for (int j = 0; j < 200; ++j) v[j] = x[(threadIdx.x + j * blockDim.x) % n];
    __syncthreads();
    float s = 0.f;
    #pragma unroll
    for (int j = 0; j < 200; ++j) s += v[j] * v[199 - j] + v[(j * 7) % 200];
    y[threadIdx.x % n] = s;
}
"""


def _heavy_expected(x, threads):
    n = x.size
    v = np.stack([x[(np.arange(threads) + j * threads) % n] for j in range(200)]).astype(np.float64)
    return (v * v[::-1] + v[(np.arange(200) * 7) % 200]).sum(axis=0)


def test_a_block_whose_registers_do_not_fit_an_sm_is_refused_as_the_gpu_refuses_it():
    """288 threads (9 warps) at 224 registers: three warps on one sub-partition need 3 x 7168 registers, more than
    its 16384, so an H100 refuses the launch (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) although 288 x 224 < 65536. The CPU
    path refuses it before running, with the GPU path's LaunchError; kernellab.occupancy says 0 blocks."""
    from kernellab.errors import LaunchError
    from kernellab.run.launch.launch import OUT_OF_RESOURCES, LaunchConfig, as_launch_error
    from kernellab.run.sim.cuda import cpu

    k = cell(HEAVY).heavy
    assert k.resources.registers > 168 and k.resources.max_threads_per_block == 256   # the driver's attribute
    assert "max 256 threads/block" in str(k.resources)
    assert kernellab.occupancy(288, k.resources.registers, 0, "sm_90").blocks_per_sm == 0
    x, y = np.arange(1000, dtype=np.float32) / 1000, np.full(320, -1, np.float32)
    image = k.image()
    assert image.registers == k.resources.registers and image.max_threads_per_block == 256
    for threads in (288, 320):           # above the max_threads_per_block registers set: the driver's error and why
        for go in (lambda: k[1, threads](x, y, 1000), lambda: cpu.launch(image, 1, (threads, 1), (x, y, 1000)),
                   lambda: cpu.sanitize(image, 1, threads, (x, y, 1000), tool="memcheck")):
            with pytest.raises(LaunchError) as info:
                go()
            cfg = LaunchConfig((1, 1, 1), (threads, 1, 1))
            gpu_words = str(as_launch_error(OUT_OF_RESOURCES, "heavy", cfg, "launch"))
            assert str(info.value).startswith(gpu_words)     # the GPU path's message, word for word, then why
            assert info.value.cuda_error == OUT_OF_RESOURCES and not info.value.sticky
            assert "3 x 7168" in str(info.value) and "at most 256 threads" in str(info.value)
            assert "at most 168 registers" in str(info.value)        # 9 or 10 warps: 3 on the fullest
    np.testing.assert_array_equal(y, -1)                  # nothing ran
    with pytest.raises(KernellabError, match="sub-partitions holds 2 such warps, so 256 threads at most"):
        k.occupancy(288)
    k[1, 256](x, y, 1000)                                 # 8 warps: two a sub-partition fit
    np.testing.assert_allclose(y[:256], _heavy_expected(x, 256), rtol=1e-5)


def test_the_same_block_at_168_registers_launches_on_the_cpu():
    k = cell(HEAVY.replace("NREG 224", "NREG 168")).heavy
    assert k.resources.registers <= 168
    x, y = np.arange(1000, dtype=np.float32) / 1000, np.zeros(288, np.float32)
    k[1, 288](x, y, 1000)
    np.testing.assert_allclose(y, _heavy_expected(x, 288), rtol=1e-5)


SMEM = r"""extern "C" __global__ void stage(const float* x, float* y, int n) {
    extern __shared__ float dyn[];
    __shared__ float fixed[1024];       // 4096 static bytes
    int i = threadIdx.x;
    fixed[i] = 1.0f;
    dyn[i] = i < n ? x[i] : 0.f;
    __syncthreads();
    if (i < n) y[i] = dyn[i] + fixed[i];
}
"""


def test_shared_memory_above_the_per_block_opt_in_limit_is_refused_as_the_gpu_path_refuses_it():
    """Dynamic plus static shared memory above sm_90's 227 KiB per block (the limit with the opt-in the GPU path
    makes for every kernel above 48 KiB) is the GPU path's ArgumentError; up to it, the launch runs."""
    from kernellab.errors import ArgumentError
    from kernellab.run.launch.device import device_for_arch
    from kernellab.run.launch.launch import make_config
    from kernellab.run.sim.cuda import cpu

    k = cell(SMEM).stage
    static = k.resources.shared_bytes
    assert static >= 4096
    x, y = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    fits = 227 * 1024 - static
    with pytest.raises(ArgumentError) as info:
        k[1, 64, fits + 4](x, y, 64)
    with pytest.raises(ArgumentError) as direct:
        make_config(1, 64, fits + 4, max_threads_per_block=1024, static_shared_bytes=static,
                    device=device_for_arch("sm_90"))
    assert str(info.value) == str(direct.value)
    assert f"at most {fits} dynamic bytes fit" in str(info.value) and "232448" in str(info.value)
    with pytest.raises(ArgumentError, match="232448"):
        cpu.sanitize(k.image(), 1, 64, (x, y, 64), shared_bytes=fits + 4, tool="memcheck")
    k[1, 64, 64 * 1024](x, y, 64)                  # above 48 KiB: the GPU path opts in, so it runs
    np.testing.assert_array_equal(y, x + 1)


def test_the_emulator_checks_a_launch_against_the_kernels_image_before_running():
    """emulate() (the tutorials' emulator tests) refuses what the GPU refuses: given the kernel's image (its sm_90
    compile), the registers as CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES; without one, threads and dynamic shared memory."""
    from kernellab.errors import ArgumentError, LaunchError
    from kernellab.run.launch.launch import OUT_OF_RESOURCES
    from kernellab.run.sim.cuda.emulate import EmulationError, emulate

    k = cell(HEAVY).heavy
    x, y = np.arange(1000, dtype=np.float32) / 1000, np.full(288, -1, np.float32)
    with pytest.raises(LaunchError) as info:
        emulate(HEAVY, "heavy", 1, 288, [x, y, 1000], image=k.image())
    assert info.value.cuda_error == OUT_OF_RESOURCES and "3 x 7168" in str(info.value)
    np.testing.assert_array_equal(y, -1)
    emulate(HEAVY, "heavy", 1, 256, [x, y, 1000], image=k.image())
    np.testing.assert_allclose(y[:256], _heavy_expected(x, 256), rtol=1e-5)
    with pytest.raises(EmulationError, match="not vadd's"):
        emulate(HEAVY, "vadd", 1, 256, [x, y, 1000], image=k.image())
    with pytest.raises(ArgumentError, match="max_threads_per_block = 1024"):
        emulate(HEAVY, "heavy", 1, 1056, [x, y, 1000])
    with pytest.raises(ArgumentError, match="232448"):
        emulate(HEAVY, "heavy", 1, 32, [x, y, 1000], 232448 + 128)


def test_cluster_shapes_and_launch_bounds_the_gpu_refuses_are_refused_on_the_cpu():
    from kernellab.errors import ArgumentError
    from kernellab.run.sim.cuda import cpu

    a, c = np.arange(256, dtype=np.float32), np.zeros(256, np.float32)
    image = cell(VADD).vadd.image()
    with pytest.raises(ArgumentError, match="at most 16 blocks per cluster"):
        cpu.launch(image, 32, 8, (a, a, c, 256), cluster=(32, 1, 1))
    with pytest.raises(ArgumentError, match="not a whole number of clusters"):
        cpu.launch(image, 3, 8, (a, a, c, 256), cluster=(2, 1, 1))
    old = kernellab.compile_cuda(VADD, arch="sm_80", first_line=2, filename="cell.cu", simulate=True).vadd
    with pytest.raises(ArgumentError, match="compute capability 9.0"):
        cpu.launch(old.image(), 2, 128, (a, a, c, 256), cluster=(2, 1, 1))
    cpu.launch(image, 4, 64, (a, a, c, 256), cluster=(2, 1, 1))
    np.testing.assert_array_equal(c, 2 * a)
    bounded = cell(VADD.replace("__global__ void", "__global__ void __launch_bounds__(128)")).vadd
    assert bounded.resources.max_threads_per_block == 128
    with pytest.raises(ArgumentError, match="max_threads_per_block = 128"):
        bounded[1, 256](a, a, c, 256)
    with pytest.raises(ArgumentError, match=r"block dimension z = 65 exceeds the device limit 64"):
        cpu.launch(image, 1, (1, 1, 65), (a, a, c, 256))


def test_a_kernel_defined_by_a_macro_launches_with_its_checks():
    """Kernels that a function-like macro defines (one per invocation) are found with their parameter types, launch
    on the CPU, and keep the pointer checks, reported at the invocation's cell line."""
    src = r'''#define SCALE_KERNEL(name, T, FACTOR) \
extern "C" __global__ void name(const T* __restrict__ x, T* y, \
        int n) { \
    int i = blockIdx.x * blockDim.x + threadIdx.x; \
    if (i < n) y[i] = x[i] * (T)FACTOR; \
}
SCALE_KERNEL(twice_f32, float, 2)
SCALE_KERNEL(thrice_f64, double, 3)
'''
    m = cell(src)
    assert [str(k.signature) for k in m.kernels] == ["twice_f32(const float* __restrict__ x, float* y, int n)",
                                                     "thrice_f64(const double* __restrict__ x, double* y, int n)"]
    x, y = np.arange(100, dtype=np.float32), np.zeros(100, np.float32)
    m.twice_f32[1, 128](x, y, 100)
    np.testing.assert_array_equal(y, 2 * x)
    xd, yd = np.arange(70, dtype=np.float64), np.zeros(70)
    m.thrice_f64[1, 96](xd, yd, 70)
    np.testing.assert_array_equal(yd, 3 * xd)
    with pytest.raises(KernellabError, match="float64"):        # the launch path packs by the macro's types
        m.twice_f32[1, 128](xd, yd, 70)
    with pytest.raises(CpuLaunchError, match=f"cell line {line_of(src, 'SCALE_KERNEL(twice_f32')}.*x\\[100\\]"):
        m.twice_f32[1, 128](x, y, 101)
