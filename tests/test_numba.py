"""Numba as a backend, without a GPU: compile-only resources (numba-cuda PTX + ptxas), simulated launches, argument
checks, errors naming thread, block and line, and the %%numba magic in a real IPython shell. Sizes stay tiny: the
simulator runs about 5,000 threads per second."""
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

numba_cuda = pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")
torch = pytest.importorskip("torch", reason="torch is needed for the simulator tests")

import kernellab  # noqa: E402
from kernellab.compile import numba_backend as nb  # noqa: E402
from kernellab.compile.nvrtc import parse_ptxas  # noqa: E402
from kernellab.compile.toolkit import find_tool  # noqa: E402
from kernellab.errors import ArgumentError, CompileError, KernellabError  # noqa: E402
from kernellab.kernel_numba import NumbaKernel, _check_args, numba_kernel, numba_module  # noqa: E402
from kernellab.run.sim.numba_sim import SimulatedKernelError, SimulatorNotice  # noqa: E402

from numba import cuda, float32  # noqa: E402

needs_ptxas = pytest.mark.skipif(find_tool("ptxas") is None, reason="ptxas (nvidia-cuda-nvcc wheel) is not installed")
pytestmark = [needs_ptxas, pytest.mark.filterwarnings("ignore::kernellab.run.sim.numba_sim.SimulatorNotice")]

SOURCE = """from numba import cuda, float32

@cuda.jit(device=True)
def square(x):
    return x * x

@cuda.jit
def vadd(a, b, c, n):
    i = cuda.grid(1)
    if i < n:
        c[i] = square(a[i]) + b[i]

@cuda.jit("void(float32[:, ::1], float32[:, ::1])")
def transpose(a, out):
    tile = cuda.shared.array((32, 33), float32)
    x, y = cuda.threadIdx.x, cuda.threadIdx.y
    bx, by = cuda.blockIdx.x * 32, cuda.blockIdx.y * 32
    tile[y, x] = a[by + y, bx + x]
    cuda.syncthreads()
    out[bx + y, by + x] = tile[x, y]

@cuda.jit(max_registers=32)
def local_sum(a, out):
    buf = cuda.local.array(64, float32)
    i = cuda.grid(1)
    for j in range(64):
        buf[j] = a[(i + j * 7) % a.size]
    s = 0.0
    for j in range(64):
        s += buf[(j * 13 + i) % 64]
    out[i] = s
"""
VADD_SIG = "float32[::1], float32[::1], float32[::1], int32"


@pytest.fixture(scope="module")
def compiled():
    return kernellab.compile_numba(SOURCE, {"vadd": VADD_SIG, "local_sum": "float32[::1], float32[::1]"})


def _ptxas_directly(ptx, *flags):
    """ptxas -v on the PTX, run here by hand: what compile_numba's resources must agree with."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as fh:
            fh.write(ptx)
        proc = subprocess.run([find_tool("ptxas"), "-v", "-arch=sm_90", *flags, path, "-o", os.path.join(tmp, "k.o")],
                              capture_output=True, text=True, check=True)
    (report,) = parse_ptxas(proc.stdout + proc.stderr).values()
    return report


# -- compile only ---------------------------------------------------------------------------------------------------


def test_compile_numba_source_gives_every_kernel_in_source_order(compiled):
    assert list(compiled) == ["vadd", "transpose", "local_sum"]
    assert compiled["transpose"].signature == "float32[:, ::1], float32[:, ::1]"  # from the decorator, deferred
    assert compiled["vadd"].arch == "sm_90"
    assert ".entry " in compiled["vadd"].ptx and compiled["vadd"].symbol in compiled["vadd"].ptx
    assert compiled["vadd"].cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("name", ["vadd", "transpose", "local_sum"])
def test_resources_agree_with_ptxas_run_by_hand(compiled, name):
    out = compiled[name]
    flags = ("-maxrregcount=32",) if name == "local_sum" else ()
    by_hand = _ptxas_directly(out.ptx, *flags)
    assert out.report.registers == by_hand.registers > 0
    assert out.report.shared_bytes == by_hand.shared_bytes
    assert out.report.stack_bytes == by_hand.stack_bytes


def test_shared_tile_matches_the_same_tile_in_cuda_cpp(compiled):
    cpp = kernellab.compile_cuda("__global__ void t(float* a) { __shared__ float tile[32][33]; "
                                 "tile[threadIdx.y][threadIdx.x] = a[threadIdx.x]; __syncthreads(); "
                                 "a[threadIdx.y] = tile[threadIdx.x][threadIdx.y]; }", arch="sm_90")
    assert compiled["transpose"].shared_bytes == cpp.t.resources.shared_bytes == 32 * 33 * 4


def test_local_array_and_max_registers_are_honoured(compiled):
    out = compiled["local_sum"]
    assert out.local_bytes >= 64 * 4  # the local array lives in the stack frame
    assert out.registers <= 32 and "-maxrregcount=32" in out.options
    free = kernellab.compile_numba(cuda.jit(_fn("local_sum")), "float32[::1], float32[::1]")
    assert free.registers > 32  # without the cap it takes more


def test_launch_bounds_limit_the_block():
    k = numba_kernel(cuda.jit(launch_bounds=128)(_fn("vadd")), VADD_SIG, arch="sm_90", simulate=True)
    assert ".maxntid 128" in k.ptx and k.resources.max_threads_per_block == 128
    with pytest.raises(ArgumentError, match="max_threads_per_block = 128"):
        k[1, 256](*(np.zeros(4, np.float32),) * 3, 4)


def test_signature_spellings():
    t = nb.numba_types
    assert t("float32[::1], int32") == t("void(float32[::1], int32)") == t(["float32[::1]", "int32"])
    assert nb.signature_text(t("float32[::1]")) == "float32[::1]"
    assert nb.signature_text(t("f8[:, :], float32[::1, :]")) == "float64[:, :], float32[::1, :]"
    with pytest.raises(KernellabError, match="not a Numba signature"):
        t("floot32[::1]")
    with pytest.raises(KernellabError, match="returns"):
        t("int32(float32[::1])")


def test_compile_error_points_at_the_source_line():
    src = "from numba import cuda\n@cuda.jit\ndef bad(a, n):\n    i = cuda.grid(1)\n    a[i] = 'text'\n"
    with pytest.raises(CompileError) as info:
        kernellab.compile_numba(src, "float32[::1], int32", first_line=2)
    (diag,) = info.value.diagnostics
    assert diag.line == 6  # 'a[i] = ...' is the source's line 5, numbered from 2
    assert "setitem" in diag.message and "bad(float32[::1], int32)" in diag.message
    assert "a[i] = 'text'" in str(info.value)


@pytest.mark.parametrize("body, line", [("    a[0] = undefined_name + 1\n", 4),
                                         ("    xs = [1, 2, 3]\n    a[0] = xs[0]\n", 4)])
def test_name_error_and_unsupported_python_point_at_their_lines(body, line):
    src = "from numba import cuda\n@cuda.jit\ndef k(a):\n" + body
    with pytest.raises(CompileError) as info:
        kernellab.compile_numba(src, "float32[::1]")
    assert info.value.diagnostics[0].line == line, info.value


def test_compile_numba_on_a_function_needs_a_signature():
    @cuda.jit
    def k(a):
        a[0] = 1
    with pytest.raises(KernellabError, match="needs a signature"):
        kernellab.compile_numba(k)
    out = kernellab.compile_numba(k, "int32[::1]", arch="sm_80")
    assert out.arch == "sm_80" and out.params[0].dtype == "int32" and out.params[0].name == "a"


def test_kernel_inspection(compiled):
    k = numba_kernel(cuda.jit(_fn("vadd")), VADD_SIG, arch="sm_90", simulate=True)
    assert isinstance(k, kernellab.Kernel) and k.backend == "numba"
    assert str(k.signature) == "vadd(float32[::1] a, float32[::1] b, float32[::1] c, int32 n)"
    assert ".entry" in k.ptx
    assert "Function : " in k.sass
    occ = k.occupancy(256)
    assert occ.block_size == 256 and 0 < occ.ratio <= 1
    assert k.best_block_sizes()
    j = k.to_json()
    assert j["registers"] == k.resources.registers and j["numba_signature"] == VADD_SIG and not j["pending"]


def _fn(name):
    """The Python function of one of SOURCE's kernels (decorator signatures deferred: no GPU here)."""
    ns = {}
    nb.exec_source(SOURCE, ns, "<test-numba-source>")
    return ns[name].py_func


# -- simulated launches ---------------------------------------------------------------------------------------------


def _vadd_kernel(**kw):
    mod = numba_module(SOURCE, signatures=kw.pop("signatures", {}), arch="sm_90", simulate=True)
    return mod


def test_signature_from_the_first_launch(monkeypatch):
    from kernellab.run.sim import numba_sim

    monkeypatch.setattr(numba_sim, "_notice_shown", False)          # as in a fresh session
    mod = _vadd_kernel()
    k = mod.vadd
    assert k.pending and mod.to_json()["kernels"][0]["registers"] is None
    with pytest.raises(KernellabError, match="no signature yet"):
        k.resources
    a, b, c = np.arange(40, dtype=np.float32), np.ones(40, np.float32), np.zeros(40, np.float32)
    with pytest.warns(SimulatorNotice, match="simulator"):
        k[2, 32](a, b, c, 40)
    np.testing.assert_array_equal(c, a * a + 1)
    assert k.numba_signature == "float32[::1], float32[::1], float32[::1], int64"  # a Python int is int64
    assert k.resources.registers > 0 and not k.pending


def test_the_simulator_notice_is_shown_once_per_session(monkeypatch):
    from kernellab.run.sim import numba_sim

    monkeypatch.setattr(numba_sim, "_notice_shown", False)
    a = np.zeros(4, np.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):                       # two cells, two kernels, two launches each
            mod = _vadd_kernel(signatures={"vadd": VADD_SIG})
            mod.vadd[1, 4](a, a, a, 4)
            mod.vadd[1, 4](a, a, a, 4)
    notices = [w for w in seen if issubclass(w.category, SimulatorNotice)]
    assert len(notices) == 1 and "(Shown once.)" in str(notices[0].message)


def test_the_slow_launch_warning_uses_the_kernels_measured_rate(monkeypatch):
    from kernellab.run.sim import numba_sim

    k = _vadd_kernel(signatures={"vadd": VADD_SIG}).vadd
    assert numba_sim.threads_per_second(k) == numba_sim.SIMULATED_THREADS_PER_S      # not measured yet
    monkeypatch.setitem(numba_sim._rates, k.py_func.__code__, 10.0)                   # a slow kernel
    assert numba_sim.estimated_seconds(1, 400, k) == pytest.approx(40.0)
    a = np.zeros(400, np.float32)
    with pytest.warns(SimulatorNotice, match=r"runs 400 threads, about 40 s at 10 threads per second"):
        k[1, 400](a, a, a, 400)


def test_simulated_launch_on_torch_cpu_tensors_checks_out():
    mod = _vadd_kernel(signatures={"vadd": VADD_SIG})
    n = 70

    def candidate(a, b):
        c = torch.empty_like(a)
        mod.vadd[(n + 31) // 32, 32](a, b, c, n)
        return c

    report = kernellab.check(candidate, lambda a, b: a * a + b,
                             lambda g: (torch.randn(n, generator=g), torch.randn(n, generator=g)), trials=2)
    assert report.passed, report


def test_check_catches_a_wrong_simulated_kernel():
    mod = numba_module("@cuda.jit\ndef off(a, c, n):\n    i = cuda.grid(1)\n    if i < n - 1:\n        c[i] = a[i]\n",
                       arch="sm_90", simulate=True)

    def candidate(a):
        c = torch.empty_like(a)
        mod.off[1, 32](a, c, 32)
        return c

    report = kernellab.check(candidate, lambda a: a.clone(), lambda g: (torch.randn(32, generator=g),), trials=1)
    assert not report.passed and report.mismatches == 1


def test_exception_in_a_simulated_kernel_names_thread_block_and_line():
    src = "@cuda.jit\ndef unguarded(a, c):\n    i = cuda.grid(1)\n    c[i] = a[i] * 2\n"
    mod = numba_module(src, arch="sm_90", simulate=True, first_line=2, line_label="cell line")
    a = np.zeros(63, np.float32)  # 64 threads: only thread 31 of block 1 reads past the end
    with pytest.raises(SimulatedKernelError) as info:
        mod.unguarded[2, 32](a, a.copy())
    e = info.value
    assert e.exception == "IndexError" and e.block == (1, 0, 0) and e.thread == (31, 0, 0)
    assert e.line == 5 and e.source == "c[i] = a[i] * 2"
    text = str(e)
    assert "thread (31, 0, 0) of block (1, 0, 0)" in text and "cell line 5" in text and "if i < n" in text


def test_code_the_simulator_runs_but_the_compiler_rejects_is_reported():
    src = "@cuda.jit\ndef uses_list(a):\n    xs = [1.0, 2.0]\n    a[cuda.grid(1)] = xs[0]\n"
    mod = numba_module(src, arch="sm_90", simulate=True)
    a = np.zeros(4, np.float32)
    with pytest.raises(CompileError) as info:
        mod.uses_list[1, 4](a)
    assert info.value.diagnostics[0].line == 3
    assert not a.any()  # nothing ran


def test_device_function_and_2d_launch_in_the_simulator():
    mod = numba_module(SOURCE, arch="sm_90", simulate=True)
    a = np.arange(64 * 32, dtype=np.float32).reshape(32, 64)
    out = np.zeros((64, 32), np.float32)
    mod.transpose[(2, 1), (32, 32)](a, out)
    np.testing.assert_array_equal(out, a.T)


def test_dynamic_shared_memory_in_the_simulator():
    src = ("@cuda.jit\ndef block_sum(x, out):\n    buf = cuda.shared.array(0, float32)\n    t = cuda.threadIdx.x\n"
           "    buf[t] = x[cuda.grid(1)]\n    cuda.syncthreads()\n    if t == 0:\n        s = 0.0\n"
           "        for j in range(cuda.blockDim.x):\n            s += buf[j]\n        out[cuda.blockIdx.x] = s\n")
    mod = numba_module("from numba import float32\n" + src, arch="sm_90", simulate=True)
    x = torch.arange(2 * 16, dtype=torch.float32)
    out = torch.zeros(2)
    mod.block_sum[2, 16, 16 * 4](x, out)
    torch.testing.assert_close(out, x.view(2, 16).sum(1))
    assert mod.block_sum.resources.shared_bytes == 0  # dynamic shared memory is not static


# -- argument checks ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def typed():
    return numba_module(SOURCE, signatures={"vadd": VADD_SIG}, arch="sm_90", simulate=True)


@pytest.mark.parametrize("args, match", [
    ((np.zeros(4, np.float32),) * 3, r"takes 4 arguments, got 3"),
    ((np.zeros(4, np.float64), np.zeros(4, np.float32), np.zeros(4, np.float32), 4),
     r"argument 0 \('a', float32\[::1\]\) expects float32 elements but got a NumPy array \(dtype float64"),
    ((np.zeros(4, np.float32), np.zeros((2, 2), np.float32), np.zeros(4, np.float32), 4),
     r"argument 1 \('b', float32\[::1\]\) expects a 1-D array"),
    ((np.zeros(4, np.float32), np.zeros(8, np.float32)[::2], np.zeros(4, np.float32), 4),
     r"argument 1 \('b', float32\[::1\]\) needs a C-contiguous array"),
    ((np.zeros(4, np.float32),) * 3 + (2**40,), r"argument 3 \('n', int32\) is int32"),
    ((np.zeros(4, np.float32),) * 3 + (1.5,), r"argument 3 \('n', int32\) is an integer parameter"),
    ((np.zeros(4, np.float32), 3.0, np.zeros(4, np.float32), 4), r"argument 1 \('b', float32\[::1\]\) is an array"),
])
def test_argument_errors_name_the_argument(typed, args, match):
    with pytest.raises(ArgumentError, match=match):
        typed.vadd[1, 32](*args)


def test_launch_configuration_is_checked(typed):
    a = np.zeros(4, np.float32)
    with pytest.raises(ArgumentError, match="more than this kernel's max_threads_per_block"):
        typed.vadd[1, 2048](a, a, a, 4)
    with pytest.raises(ArgumentError, match="launch as vadd"):
        typed.vadd[1](a, a, a, 4)


def test_gpu_launches_refuse_host_memory(typed):
    params = typed.vadd.params
    arrays = (np.zeros(4, np.float32),) * 3
    with pytest.raises(ArgumentError, match=r"argument 0 \('a'.*runs on the GPU.*simulator"):
        _check_args(params, arrays + (4,), VADD_SIG, host_ok=False)
    with pytest.raises(ArgumentError, match="torch tensor"):
        _check_args(params, (torch.zeros(4),) * 3 + (4,), VADD_SIG, host_ok=False)
    values = _check_args(params, arrays + (4,), VADD_SIG, host_ok=True)
    assert values[3].dtype == np.int32


def test_first_launch_rejects_what_numba_cannot_type():
    mod = _vadd_kernel()
    with pytest.raises(ArgumentError, match="bfloat16"):
        mod.vadd[1, 4](*(torch.zeros(4, dtype=torch.bfloat16),) * 3, 4)
    assert mod.vadd.pending


def test_without_a_gpu_a_real_launch_says_how_to_simulate():
    if kernellab.has_gpu():
        pytest.skip("this machine has a GPU")
    k = numba_kernel(cuda.jit(_fn("vadd")), VADD_SIG, arch="sm_90", simulate=False)
    with pytest.raises(kernellab.NoGPUError, match="simulate = True"):
        k[1, 4](*(np.zeros(4, np.float32),) * 3, 4)


class _FakeDeviceArray:
    """Device memory as Numba sees it: only __cuda_array_interface__ (no GPU needed to hold one)."""

    def __init__(self, n, typestr="<f4", strides=None):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (0x7000_0000, False),
                                         "strides": strides, "version": 3}


def test_gpu_launch_path_with_a_stand_in_device(monkeypatch):
    """The real-launch code path, with the GPU, numba's compiled kernel and its stream replaced by stand-ins."""
    import kernellab.kernel_numba as kn
    from kernellab.run.launch import device
    from kernellab.run.launch.device import DeviceInfo

    dev = DeviceInfo(index=0, name="stand-in H100", arch="sm_90", multiprocessors=132)
    monkeypatch.setattr(device, "require_gpu", lambda what="": None)
    monkeypatch.setattr(device, "device_info", lambda index=None: dev)
    launched, synced = [], []

    class Compiled:
        def launch(self, args, grid, block, stream, shared):
            if shared == 13:
                raise RuntimeError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")
            launched.append((args, grid, block, stream, shared))

    class Stream:
        def synchronize(self):
            synced.append(True)

    stream = Stream()
    monkeypatch.setattr(kn, "_numba_stream", lambda s, args: stream)
    monkeypatch.setattr(kn, "_core_stream", lambda s: s)
    k = numba_kernel(cuda.jit(_fn("vadd")), VADD_SIG, arch="sm_90", simulate=False)
    monkeypatch.setattr(k.dispatcher, "compile", lambda argtypes: Compiled())
    a = _FakeDeviceArray(8)
    assert k[(2,), 4](a, a, a, 8) is None
    ((args, grid, block, s, shared),) = launched
    assert args == [a, a, a, 8] and type(args[3]) is int and grid == (2, 1, 1) and block == (4, 1, 1)
    assert s is stream and shared == 0 and synced == [True]
    with pytest.raises(ArgumentError, match=r"argument 2 \('c', float32\[::1\]\) needs a C-contiguous"):
        k[1, 4](a, a, _FakeDeviceArray(8, strides=(8,)), 8)
    with pytest.raises(ArgumentError, match=r"argument 1 \('b', float32\[::1\]\) expects float32 elements"):
        k[1, 4](a, _FakeDeviceArray(8, "<f8"), a, 8)
    with pytest.raises(kernellab.LaunchError, match="vadd failed at launch.*fewer threads per block"):
        k[1, 4, 13](a, a, a, 8)
    with pytest.raises(ArgumentError, match=r"argument 0 \('a', float32\[::1\]\) is a _FakeDeviceArray; launches "
                                            r"in another process take CUDA torch tensors and CuPy arrays"):
        k[1, 4](a, a, a, 8, isolate=True)                      # checked before any worker starts


# -- shared-memory traces -------------------------------------------------------------------------------------------


TRANSPOSE_TILE = """@cuda.jit
def tile_t(a, out):
    tile = cuda.shared.array((32, {width}), float32)
    x, y = cuda.threadIdx.x, cuda.threadIdx.y
    tile[y, x] = a[y, x]
    cuda.syncthreads()
    out[y, x] = tile[x, y]
"""


@pytest.mark.parametrize("width, ways", [(32, 32), (33, 1)])
def test_bank_trace_per_source_line(width, ways):
    mod = numba_module("from numba import float32\n" + TRANSPOSE_TILE.format(width=width), arch="sm_90",
                       simulate=True)
    a = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)
    out = np.zeros_like(a)
    trace = mod.tile_t.trace_banks(1, (32, 32), a, out)
    np.testing.assert_array_equal(out, a.T)  # a traced launch is a launch
    load = trace.line(8, kind="load")         # out[y, x] = tile[x, y]
    assert load.ways == ways and load.instructions == 32
    assert trace.line(6, kind="store").ways == 1
    assert mod.tile_t.last_trace is trace


def test_trace_shared_errors_name_thread_block_and_line():
    """kernellab.trace_shared wraps a simulated thread's exception as k.trace_banks does."""
    ns = {}
    nb.exec_source("from numba import float32\n@cuda.jit\ndef oob(a, out):\n    s = cuda.shared.array(8, float32)\n"
                   "    s[cuda.threadIdx.x] = a[cuda.threadIdx.x]\n    out[cuda.threadIdx.x] = s[cuda.threadIdx.x]\n",
                   ns, "<test-trace-error>")
    a = torch.arange(4, dtype=torch.float32)                     # torch CPU tensors work as in a launch
    with pytest.raises(SimulatedKernelError) as info:
        kernellab.trace_shared(ns["oob"], 1, 8, a, torch.zeros(8))
    e = info.value
    assert (e.exception, e.thread, e.block, e.line) == ("IndexError", (4, 0, 0), (0, 0, 0), 5)
    assert "oob raised IndexError in thread (4, 0, 0)" in str(e) and "hint:" in str(e)
    out = torch.zeros(4)
    trace = kernellab.trace_shared(ns["oob"], 1, 4, a, out)
    assert (out == a).all() and trace.line(5, kind="store").instructions == 1


def test_trace_refuses_big_launches():
    mod = numba_module("from numba import float32\n" + TRANSPOSE_TILE.format(width=33), arch="sm_90", simulate=True)
    a = np.zeros((32, 32), np.float32)
    with pytest.raises(ArgumentError, match="simulates every thread"):
        mod.tile_t.trace_banks(100, (32, 32), a, a)


# -- kernel factories and globals -----------------------------------------------------------------------------------


def map_test(cuda):
    def call(out, a):
        local_i = cuda.threadIdx.x
        out[local_i] = a[local_i] + 10
    return call


def test_a_kernel_factory_runs_in_the_simulator_and_compiles_with_the_real_cuda():
    """GPU-Puzzles' style: the function takes the cuda module and returns the kernel."""
    k = numba_kernel(map_test, simulate=True)
    assert k.factory is map_test and k.name == "map_test" and k.pending
    a, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    k[1, 4](out, a)
    np.testing.assert_array_equal(out, a + 10)
    assert "%tid.x" in k.ptx and k.resources.registers > 0            # compiled with numba.cuda, not the fake
    assert k.trace_banks(1, 4, out, a).kernel_name == "map_test"
    assert k.sanitize(1, 4, out, a, tool="racecheck").ok
    again = k.with_signature("float32[::1], float32[::1]")
    assert again.factory is map_test and not again.pending


FACTORY_CELL = """%%numba --sim
TPB = 4
def shared_test(cuda):
    def call(out, a, size):
        shared = cuda.shared.array(TPB, numba.float32)
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        local_i = cuda.threadIdx.x
        if i < size:
            shared[local_i] = a[i]
        {sync}
        if i < size:
            out[i] = shared[(local_i + 1) % TPB] + 10
    return call
import numba
"""


def test_a_kernel_factory_in_a_numba_cell(ip):
    assert _run(ip, FACTORY_CELL.format(sync="cuda.syncthreads()")).success
    k = ip.user_ns["shared_test"]
    assert isinstance(k, NumbaKernel) and k.factory is not None
    a, out = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    k[2, 4](out, a, 8)
    np.testing.assert_array_equal(out, a.reshape(2, 4)[:, [1, 2, 3, 0]].ravel() + 10)
    assert k.sanitize(2, 4, out, a, 8, tool="racecheck").ok
    assert _run(ip, FACTORY_CELL.format(sync="pass")).success
    (race,) = ip.user_ns["shared_test"].sanitize(2, 4, out, a, 8, tool="racecheck").findings
    assert race.lines == (9, 12)                    # cell lines: the store, and the load of a neighbour's slot


def test_a_function_of_cuda_that_is_no_factory_stays_a_function(ip):
    result = _run(ip, "%%numba --sim\ndef helper(cuda):\n    return cuda.threadIdx\n")
    assert result.success, result.error_in_exec
    assert callable(ip.user_ns["helper"]) and not isinstance(ip.user_ns["helper"], NumbaKernel)
    assert "helper takes `cuda` but helper(cuda) did not make a kernel" in str(result.result)
    marked = _run(ip, "%%numba --sim --kernel helper\ndef helper(cuda):\n    return cuda.threadIdx\n")
    assert "a kernel factory returns the kernel function" in str(marked.error_in_exec)


def test_rebinding_a_global_recompiles_the_kernel(ip):
    from kernellab.kernel_numba import GlobalsChanged

    assert _run(ip, FACTORY_CELL.format(sync="cuda.syncthreads()").replace("TPB = 4", "TPB = 3")).success
    k = ip.user_ns["shared_test"]
    a, out = np.arange(6, dtype=np.float32), np.zeros(6, np.float32)
    k[2, 3](out, a, 6)
    assert k.resources.shared_bytes == 3 * 4
    ip.user_ns["TPB"] = 4
    a, out = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    with pytest.warns(GlobalsChanged, match=r"shared_test was compiled with other values of TPB \(3, now 4\)"):
        k[2, 4](out, a, 8)
    np.testing.assert_array_equal(out, a.reshape(2, 4)[:, [1, 2, 3, 0]].ravel() + 10)
    assert k.resources.shared_bytes == 4 * 4                    # the compiled kernel has the new size too
    with warnings.catch_warnings():
        warnings.simplefilter("error", GlobalsChanged)
        k[2, 4](out, a, 8)                                      # unchanged since: no second compile


def test_a_global_read_by_a_plain_kernel_and_by_a_factory_body():
    from kernellab.kernel_numba import GlobalsChanged

    ns = {}
    nb.exec_source("SCALE = 2.0\n@cuda.jit\ndef scale(out, a):\n    out[cuda.threadIdx.x] = a[cuda.threadIdx.x] * SCALE\n"
                   "def scale_f(cuda):\n    s = SCALE\n    def call(out, a):\n        out[cuda.threadIdx.x] = a[cuda.threadIdx.x] * s\n"
                   "    return call\n", ns, "<test-globals>")
    for k in (numba_kernel(ns["scale"], "float32[::1], float32[::1]", simulate=True),
              numba_kernel(ns["scale_f"], "float32[::1], float32[::1]", simulate=True)):
        ns["SCALE"] = 2.0
        k._refresh_globals()
        a, out = np.ones(4, np.float32), np.zeros(4, np.float32)
        k[1, 4](out, a)
        assert (out == 2).all()
        ptx = k.ptx
        ns["SCALE"] = 3.0
        with pytest.warns(GlobalsChanged, match=r"SCALE \(2.0, now 3.0\)"):
            k[1, 4](out, a)
        assert (out == 3).all() and k.ptx != ptx


# -- the %%numba magic ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ip():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kernellab")
    yield shell


def _run(ip, cell):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulatorNotice)
        return ip.run_cell(cell)


def test_magic_binds_kernels_and_shows_a_card(ip):
    result = _run(ip, f"%%numba --arch sm_90 --sim --signature 'vadd: {VADD_SIG}' --name mod\n" + SOURCE)
    assert result.success, result.error_in_exec
    mod = ip.user_ns["mod"]
    assert result.result is None     # local_sum waits for its first launch: the card is a display it updates
    for name in ("vadd", "transpose", "local_sum"):
        assert isinstance(ip.user_ns[name], kernellab.Kernel)
    assert ip.user_ns["vadd"].numba_signature == VADD_SIG
    assert ip.user_ns["local_sum"].pending
    assert callable(ip.user_ns["square"].py_func)  # device functions stay numba dispatchers
    text, html = str(mod), mod._repr_html_()
    assert "runs in the simulator" in text and "(from its first launch)" in text and "vadd" in html
    bundle = mod._repr_mimebundle_()
    from kernellab.report import REPORT_MIME

    j = bundle[REPORT_MIME]
    assert j["kind"] == "compile" and j["backend"] == "numba" and len(j["kernels"]) == 3
    ip.user_ns.update(a=np.ones(8, np.float32), c=np.zeros(8, np.float32))
    result = _run(ip, "vadd[1, 8](a, a, c, 8)\nc")
    assert result.success and (result.result == 2).all()


def test_magic_help_lists_options(ip):
    doc = ip.find_cell_magic("numba").__doc__
    for opt in ("--arch", "--signature", "--sim", "--name", "--ptx", "--sass", "--banks", "--kernel"):
        assert opt in doc


def test_magic_compile_error_is_a_usage_error_at_the_cell_line(ip, capsys):
    from IPython.core.error import UsageError

    cell = "%%numba --arch sm_90 --sim -s 'bad: float32[::1]'\n@cuda.jit\ndef bad(a):\n    a[0] = 'x'\n"
    result = _run(ip, cell)
    assert isinstance(result.error_in_exec, UsageError)
    out = capsys.readouterr()
    assert "line 4" in out.out + out.err  # the %%numba line is line 1


def test_magic_syntax_error_is_a_usage_error(ip):
    from IPython.core.error import UsageError

    result = _run(ip, "%%numba --sim\n@cuda.jit\ndef k(a)\n    pass\n")
    assert isinstance(result.error_in_exec, UsageError) and "line 3" in str(result.error_in_exec)


def test_magic_kernel_error_names_the_cell_line(ip):
    assert _run(ip, "%%numba --sim\n@cuda.jit\ndef boom(a):\n    i = cuda.grid(1)\n    a[i + 1] = 1\n").success
    ip.user_ns["buf"] = np.zeros(4, np.float32)
    result = _run(ip, "boom[1, 4](buf)")
    e = result.error_in_exec
    assert isinstance(e, SimulatedKernelError)
    assert e.thread == (3, 0, 0) and e.block == (0, 0, 0) and e.line == 5 and "cell line 5" in str(e)
    assert e._render_traceback_()[0].startswith("SimulatedKernelError: boom raised IndexError")


def test_magic_launches_in_the_same_cell_are_kernellab_launches(ip):
    ip.user_ns["np"] = np
    cell = ("%%numba --sim\n@cuda.jit\ndef fill(a, v):\n    a[cuda.grid(1)] = v\n\n"
            "out = np.zeros(6, np.int32)\nfill[2, 3](out, 7)\n")
    result = _run(ip, cell)
    assert result.success, result.error_in_exec
    assert isinstance(ip.user_ns["fill"], NumbaKernel) and (ip.user_ns["out"] == 7).all()
    assert ip.user_ns["fill"].numba_signature == "int32[::1], int64"


def test_magic_marks_plain_functions_as_kernels(ip):
    result = _run(ip, "%%numba --sim --kernel fill2,fill3\ndef fill2(a, v):\n    a[cuda.grid(1)] = v\n"
                      "def fill3(a):\n    a[cuda.grid(1)] = 3\n")
    assert result.success, result.error_in_exec
    assert [ip.user_ns[n].name for n in ("fill2", "fill3")] == ["fill2", "fill3"]
    out = np.zeros(4, np.float32)
    ip.user_ns["fill2"][1, 4](out, 2.5)
    assert (out == 2.5).all()


def test_magic_banks_traces_a_launch_per_cell_line(ip, capsys):
    ip.user_ns.update(ta=np.arange(1024, dtype=np.float32).reshape(32, 32), tout=np.zeros((32, 32), np.float32))
    cell = ("%%numba --sim --banks 'tile_t[1, (32, 32)](ta, tout)'\nfrom numba import float32\n"
            + TRANSPOSE_TILE.format(width=32))
    result = _run(ip, cell)
    assert result.success, result.error_in_exec
    trace = ip.user_ns["tile_t"].last_trace
    assert trace.line(9, kind="load").ways == 32  # the %%numba line is 1: `out[y, x] = tile[x, y]` is line 9
    # The report names the cell, not the name IPython gives the cell's code (ipykernel: a temporary file path).
    assert {row["filename"] for row in trace.to_json()["lines"]} == {"cell"}
    from kernellab.run.sim.trace import shown_filename
    assert shown_filename("/tmp/ipykernel_4242/3141592653.py") == "cell" and shown_filename(__file__) == __file__
    assert "32-way" in capsys.readouterr().out
    # --banks alone: the next launch returns its trace
    assert _run(ip, "%%numba --sim --banks\nfrom numba import float32\n" + TRANSPOSE_TILE.format(width=33)).success
    result = _run(ip, "tile_t[1, (32, 32)](ta, tout)")
    assert result.result.line(9, kind="load").ways == 1
    assert _run(ip, "tile_t[1, (32, 32)](ta, tout)").result is None  # only the next one


def test_magic_ptx_and_sass(ip, capsys):
    result = _run(ip, f"%%numba --sim --ptx --sass -s 'vadd: {VADD_SIG}'\n" + SOURCE)
    assert result.success
    out = capsys.readouterr().out
    assert ".entry" in out and "vadd (sm_90):" in out
    # The SASS beside the cell's lines: `c[i] = square(a[i]) + b[i]` is cell line 12 (the magic is line 1).
    row = next(line for line in out.splitlines() if line.strip().startswith("12 ") and "c[i] = square" in line)
    header = next(line for line in out.splitlines() if line.split()[:3] == ["line", "source", "SASS"])
    assert header.split()[3:] == ["global", "ld", "global", "st", "FFMA"]
    assert row.split("c[i] = square(a[i]) + b[i]")[1].split()[1:] == ["2", "1", "1"]   # SASS count, then the classes


def test_magic_card_of_a_kernel_without_signature_updates_at_its_first_launch(ip, monkeypatch):
    """The card shows dashes until the first launch gives the types; then ptxas's registers and shared memory replace
    them in the same display (its display_id), and the "no signature yet" note goes."""
    published = []
    monkeypatch.setattr(ip.display_pub, "publish",
                        lambda data, metadata=None, transient=None, update=False, **kw:
                        published.append((data, (transient or {}).get("display_id"), update)))
    cell = ("%%numba --sim\nfrom numba import float32\n@cuda.jit\ndef flip32(x):\n"
            "    t = cuda.shared.array(32, float32)\n    t[cuda.threadIdx.x] = x[cuda.threadIdx.x]\n"
            "    cuda.syncthreads()\n    x[cuda.threadIdx.x] = t[31 - cuda.threadIdx.x]\n")
    assert _run(ip, cell).success
    [(first, display_id, update)] = [p for p in published if "application/vnd.kernellab.report+json" in p[0]]
    card = first["application/vnd.kernellab.report+json"]["kernels"][0]
    assert display_id and not update and card["pending"] and card["registers"] is None
    x = np.arange(32, dtype=np.float32)
    ip.user_ns["x32"] = x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulatorNotice)
        assert ip.run_cell("flip32[1, 32](x32)").success
    assert (x == np.arange(32)[::-1]).all()
    updates = [p for p in published if p[2] and "application/vnd.kernellab.report+json" in p[0]]
    assert len(updates) == 1 and updates[0][1] == display_id
    report = updates[0][0]["application/vnd.kernellab.report+json"]
    card = report["kernels"][0]
    assert not card["pending"] and card["registers"] > 0 and card["shared_bytes"] == 128
    assert not any("no signature yet" in n for n in report["notes"])


def test_magic_usage_errors(ip):
    from IPython.core.error import UsageError

    for line, match in (("--signature 'nope: int32'", "nope"), ("--kernel missing", "missing"),
                        ("--signature 'vadd: floot[:]'", "not a Numba signature")):
        result = _run(ip, f"%%numba --sim {line}\n" + SOURCE)
        assert isinstance(result.error_in_exec, UsageError), line
        assert match in str(result.error_in_exec)


# -- NUMBA_ENABLE_CUDASIM=1 -----------------------------------------------------------------------------------------


def test_with_numba_enable_cudasim_kernels_simulate_without_resources():
    code = textwrap.dedent("""
        import warnings, numpy as np
        warnings.simplefilter("ignore")
        from kernellab.kernel_numba import numba_module
        mod = numba_module("@cuda.jit\\ndef k(a):\\n    a[cuda.grid(1)] += 1\\n", arch="sm_90")
        a = np.zeros(4, np.float32)
        mod.k[1, 4](a)
        print(a.tolist(), mod.k.simulate, mod.k.compiled is None, "NUMBA_ENABLE_CUDASIM" in str(mod))
    """)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[1.0,", "1.0,", "1.0,", "1.0]", "True", "True", "True"]


ABI_SOURCE = """from numba import cuda

@cuda.jit
def scale_t(a, out, n, alpha, flip):
    r, c = cuda.grid(2)
    if r < a.shape[0] and c < a.shape[1]:
        out[c, r] = a[r, c] * alpha if flip else a[r, c]
"""
ABI_SIG = "float32[:, ::1], float32[:, ::1], int32, float64, boolean"
_PTX_BYTES = {"64": 8, "32": 4, "16": 2, "8": 1}


def test_an_isolated_numba_job_passes_arrays_as_numba_does():
    """Jobs (worker, compute-sanitizer, ncu) pass each array as numba-cuda's dispatcher does: the members of its
    array struct. Count, order and widths must match the kernel's own PTX parameters, scalars included."""
    import re

    import torch

    from kernellab.run.launch.job import KernelJob, numba_array_values, scalar_value

    k = numba_module(ABI_SOURCE, signatures={"scale_t": ABI_SIG}, arch="sm_90", simulate=False).scale_t
    a, out = torch.zeros(3, 5), torch.zeros(5, 3)
    job = KernelJob.from_launch(k.image(), (1, 1), (8, 8), (a, out, 7, 0.5, True))
    assert job.abi == "numba" and job.image == k.cubin and job.image_format == "cubin"
    again = KernelJob.from_bytes(job.to_bytes())
    assert again.abi == "numba" and again.image == k.cubin

    values = []
    for spec in job.args:
        values += numba_array_values(spec, 0x7000) if spec.kind == "tensor" else [scalar_value(spec)]
    entry = k.ptx[k.ptx.index(".entry"):]
    entry = entry[:entry.index(")")]
    ptx_widths = [_PTX_BYTES[bits] for bits in re.findall(r"\.param\s+\.[a-z]+?(\d+)\s", entry)]
    assert [np.asarray(v).itemsize for v in values] == ptx_widths
    assert len(values) == 2 * (5 + 2 * 2) + 3
    assert [int(v) for v in values[:9]] == [0, 0, 15, 4, 0x7000, 3, 5, 20, 4]     # a: [3, 5], C strides in bytes
    assert [int(v) for v in values[9:18]] == [0, 0, 15, 4, 0x7000, 5, 3, 12, 4]   # out: [5, 3]
    assert values[18:] == [np.int32(7), np.float64(0.5), np.bool_(True)]


def test_an_isolated_numba_job_keeps_the_cell_lines():
    """Sanitizer findings name the cell line: the cubin's line table uses the kernel's file name and the job
    quotes the cell's lines by the same numbers."""
    import torch

    from kernellab.run.launch.job import KernelJob

    k = numba_module(ABI_SOURCE, signatures={"scale_t": ABI_SIG}, arch="sm_90", simulate=False,
                     first_line=2).scale_t
    job = KernelJob.from_launch(k.image(), 1, 32, (torch.zeros(3, 5), torch.zeros(5, 3), 7, 0.5, True))
    import re

    files = re.findall(r'\.file\s+1\s+"([^"]+)"', k.ptx)
    assert job.filename == k.compiled.filename and [os.path.basename(f) for f in files] == [job.filename]
    assert re.search(r"\.loc\s+1\s+8\s", k.ptx)              # the line table numbers lines as the cell shows them
    assert job.first_line == 2 and job.line(8).strip().startswith("out[c, r] = a[r, c] * alpha")


def test_numba_launches_in_another_process_take_c_contiguous_torch_or_cupy_arrays(monkeypatch):
    import torch

    from kernellab.run.launch.device import DeviceInfo

    k = numba_module(ABI_SOURCE, signatures={"scale_t": ABI_SIG}, arch="sm_90", simulate=False).scale_t
    dev = DeviceInfo(index=0, name="stand-in H100", arch="sm_90", multiprocessors=132)
    monkeypatch.setattr(kernellab.kernel_numba, "_array_info",
                        lambda x: (str(x.dtype).replace("torch.", ""), tuple(x.shape),
                                   tuple(s * 4 for s in x.stride()), True, 0))
    a = torch.zeros(3, 5)
    k.check_launch_args((a, torch.zeros(5, 3), 7, 0.5, True), dev)
    with pytest.raises(ArgumentError, match=r"argument 1 \('out'.*needs a C-contiguous"):
        k.check_launch_args((a, torch.zeros(3, 5).t(), 7, 0.5, True), dev)
    with pytest.raises(ArgumentError, match=r"argument 2 \('n', int32\) expects a number"):
        k.check_launch_args((a, torch.zeros(5, 3), "7", 0.5, True), dev)
