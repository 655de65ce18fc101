"""Programmatic dependent launch (PDL) without a GPU: the cuLaunchKernelEx attribute kernellab builds
(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION), the launch value that carries it, the generated launch and
Driver.launch through a fake driver, pdl=True as a plain launch below sm_90, kl/pdl.cuh's griddepcontrol helpers
compiled by NVRTC to their SASS (ACQBULK, PREEXIT), and the CPU emulator taking both instructions (no-ops there:
launches on the CPU run one after the other)."""
import ctypes
import dataclasses
import json
import re
import struct

import numpy as np
import pytest

import kernellab
from kernellab.compile.signature import find_kernels
from kernellab.errors import ArgumentError
from kernellab.run.launch import cudriver as D
from kernellab.run.launch import launch as L
from kernellab.run.launch.device import DeviceInfo

torch = pytest.importorskip("torch")

H100 = DeviceInfo(index=0, name="Fake H100", arch="sm_90", multiprocessors=132,
                  shared_per_block_optin_bytes=227 * 1024, shared_per_sm_bytes=228 * 1024)
A100 = DeviceInfo(index=0, name="Fake A100", arch="sm_80", multiprocessors=108,
                  shared_per_block_optin_bytes=163 * 1024, shared_per_sm_bytes=164 * 1024)
VADD = r"""extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}"""
PARAMS = find_kernels(VADD)[0].params
SIZES = [8, 8, 8, 4]


def attributes(cfg) -> list[tuple[int, object]]:
    """(id, value) of each attribute of a CUlaunchConfig: the cluster's dims, or PDL's int."""
    out = []
    for i in range(cfg.numAttrs):
        a = cfg.attrs[i]
        if a.id == D.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
            out.append((a.id, (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z)))
        else:
            out.append((a.id, a.value.programmaticStreamSerializationAllowed))
    return out


# --- the attribute ---------------------------------------------------------------------------------------------------

def test_the_attribute_is_cuda_hs_programmatic_stream_serialization_in_cuda_hs_layout():
    assert D.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION == 6        # cuda.h's CUlaunchAttributeID
    assert ctypes.sizeof(D.CUlaunchAttributeValue) == 64 and ctypes.sizeof(D.CUlaunchAttribute) == 72
    assert D.CUlaunchAttributeValue.programmaticStreamSerializationAllowed.offset == 0   # the union's first bytes


@pytest.mark.parametrize("cluster, pdl, want", [
    (None, True, [(6, 1)]),
    ((2, 1, 1), True, [(4, (2, 1, 1)), (6, 1)]),
    ((4, 2, 1), False, [(4, (4, 2, 1))]),
    (None, False, []),
])
def test_launch_config_carries_the_attributes_asked_for(cluster, pdl, want):
    cfg, attrs = D.launch_config((8, 2, 1), (128, 1, 1), 4096, 0xABC, cluster, pdl)
    assert attributes(cfg) == want and cfg.numAttrs == len(want)
    assert (cfg.gridDimX, cfg.gridDimY, cfg.blockDimX, cfg.sharedMemBytes, cfg.hStream) == (8, 2, 128, 4096, 0xABC)
    assert ctypes.addressof(attrs) == ctypes.addressof(cfg.attrs.contents)      # the array the config points at


def test_the_launch_value_says_pdl_and_stays_a_plain_comparable_value():
    plain = L.make_config(8, 128, 0, max_threads_per_block=1024, static_shared_bytes=0, device=H100)
    pdl = L.make_config(8, 128, 0, max_threads_per_block=1024, static_shared_bytes=0, device=H100, pdl=True)
    assert pdl.pdl and not plain.pdl and pdl != plain and pdl == dataclasses.replace(plain, pdl=True)
    assert pdl.launch_ex and not plain.launch_ex
    assert str(pdl).endswith(", pdl=True") and "pdl" not in str(plain)
    assert plain.driver_kwargs() == {} and pdl.driver_kwargs() == {"pdl": True}
    assert json.loads(json.dumps(dataclasses.asdict(pdl)))["pdl"] is True        # serialisable as it is
    with pytest.raises(ArgumentError, match="pdl must be True or False"):
        L.make_config(8, 128, 0, max_threads_per_block=1024, static_shared_bytes=0, device=H100, pdl="yes")


def test_below_sm_90_pdl_is_a_plain_launch():
    cfg = L.make_config(8, 128, 0, max_threads_per_block=1024, static_shared_bytes=0, device=A100, pdl=True)
    assert cfg == L.make_config(8, 128, 0, max_threads_per_block=1024, static_shared_bytes=0, device=A100)
    assert not cfg.launch_ex


# --- Driver.launch: cuLaunchKernelEx with the attribute ------------------------------------------------------------

class FakeLib:
    """libcuda's launch calls as Python: cuLaunchKernel and cuLaunchKernelEx record what they are given (the
    CUlaunchConfig read through the pointer) and return `rcs` in turn (0 when none is left)."""

    def __init__(self, rcs=()):
        self.plain, self.ex, self.rcs = [], [], list(rcs)
        self.cuStreamSynchronize = self.cuStreamIsCapturing = lambda *a: 0

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.plain.append((f, (gx, gy, gz), (bx, by, bz), smem, stream))
        return self.rcs.pop(0) if self.rcs else 0

    def cuLaunchKernelEx(self, config_ref, f, params, extra):
        cfg = config_ref._obj
        self.ex.append((f, (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ), cfg.hStream, attributes(cfg)))
        return self.rcs.pop(0) if self.rcs else 0


def test_driver_launch_with_pdl_calls_cuLaunchKernelEx_and_retries_it_in_a_new_thread(monkeypatch):
    lib = FakeLib(rcs=[D.CUDA_ERROR_INVALID_CONTEXT])
    monkeypatch.setattr(D, "_lib_or_none", lambda: None)
    drv = D.Driver(lib)
    made = []
    monkeypatch.setattr(drv, "make_current", made.append)
    drv.launch(0xF00, (4, 1, 1), (64, 1, 1), 0, 0x50, None, 0, pdl=True)
    assert lib.plain == [] and made == [0]                  # INVALID_CONTEXT: made current, then launched again
    assert lib.ex == [(0xF00, (4, 1, 1), 0x50, [(6, 1)])] * 2
    drv.launch(0xF00, (4, 1, 1), (64, 1, 1), 0, 0x50, None, 0)                 # without: cuLaunchKernel, as ever
    drv.launch(0xF00, (4, 1, 1), (64, 1, 1), 0, 0x50, None, 0, cluster=(2, 1, 1), pdl=True)
    assert len(lib.plain) == 1 and lib.ex[-1][3] == [(4, (2, 1, 1)), (6, 1)]
    lib.cuLaunchKernelEx = None                                                  # a driver older than CUDA 12
    monkeypatch.setattr(D, "driver_version", lambda: 11080)
    with pytest.raises(RuntimeError, match=r"programmatic dependent launches \(pdl=True\) need cuLaunchKernelEx"):
        D.Driver(lib).launch(0xF00, (4, 1, 1), (64, 1, 1), 0, 0x50, None, 0, pdl=True)


# --- the generated launch and Kernel launches --------------------------------------------------------------------

class FakeCudaTensor:
    def __init__(self, ptr):
        self.dtype, self.is_cuda, self.device = torch.float32, True, torch.device("cuda", 0)
        self._ptr, self.shape = ptr, (64,)

    def get_device(self):
        return 0

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return self._ptr

    def numel(self):
        return 64

    def element_size(self):
        return 4

    def dim(self):
        return 1


FakeCudaTensor.__module__ = "torch.fake"


class RawDriver:
    """The launch path's driver calls, raw and general, recorded: launch_kernel (cuLaunchKernel), launch_kernel_ex
    (cuLaunchKernelEx, its config read through the pointer), launch (Driver.launch, with what keywords it took)."""

    def __init__(self):
        self.raw, self.raw_ex, self.launches, self.syncs = [], [], [], []

    def launch_kernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.raw.append(((gx, gy, gz), self._params(params)))
        return 0

    def launch_kernel_ex(self, config_p, f, params, extra):
        cfg = ctypes.cast(config_p, ctypes.POINTER(D.CUlaunchConfig)).contents
        self.raw_ex.append(((cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ), cfg.hStream or 0, attributes(cfg),
                            self._params(params)))
        return 0

    def launch(self, function, grid, block, shared_bytes, stream, params, device_index=0, **kw):
        self.launches.append((grid, kw, self._params(params)))

    @staticmethod
    def _params(params):
        pointers = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        return [ctypes.string_at(pointers[i], n) for i, n in enumerate(SIZES)]

    def stream_is_capturing(self, stream, status_pointer):
        status_pointer.contents.value = 0
        return 0

    def stream_synchronize(self, stream):
        self.syncs.append(stream)
        return 0

    def is_capturing(self, stream):
        return False

    def synchronize(self, stream):
        self.syncs.append(stream)

    def error(self, rc):
        return RuntimeError(f"CUDA error {rc}")

    def make_current(self, index):
        pass


@pytest.fixture(autouse=True)
def fake_streams(monkeypatch):
    monkeypatch.setattr(L, "torch_stream_handle", lambda index: 0x5000 + index)
    monkeypatch.setattr(L, "torch_stream_function", lambda: (lambda index: 0x5000 + index))
    monkeypatch.setattr(L, "cupy_stream_function", lambda: (lambda: 0xC0))


def args(n):
    return FakeCudaTensor(0x1000), FakeCudaTensor(0x2000), FakeCudaTensor(0x3000), n


def test_the_generated_pdl_launch_goes_through_cuLaunchKernelEx_with_the_attribute():
    driver = RawDriver()
    path = L.LaunchPath(0xF00, PARAMS, H100, name="vadd", signature="vadd(...)", max_threads_per_block=1024,
                        static_shared_bytes=0, driver=driver)
    cfg = path.config(4, 256, 0, pdl=True)
    assert cfg is path.config(4, 256, 0, pdl=True) and cfg != path.config(4, 256, 0)   # cached apart
    fast = path.fast(cfg, tuple(map(type, args(1))))
    assert "LAUNCH_EX(CONFIG_P, FN, PARAMS, None)" in fast.source
    assert fast(args(7), None, False) is True and fast(args(8), 0xABC, False) is True
    assert [(r[0], r[1], r[2], r[3][3]) for r in driver.raw_ex] == [
        ((4, 1, 1), 0x5000, [(6, 1)], np.int32(7).tobytes()), ((4, 1, 1), 0xABC, [(6, 1)], np.int32(8).tobytes())]
    path.run(path.config(4, 256, 0), args(9), None, False)             # the plain launch: Driver.launch, no keyword
    assert driver.launches == [((4, 1, 1), {}, driver.launches[0][2])] and len(driver.raw_ex) == 2
    path.run(cfg, (FakeCudaTensor(0x1000), FakeCudaTensor(0x2000), FakeCudaTensor(0x3000), np.int32(5)), None, False)
    assert driver.launches[-1][1] == {"pdl": True}                                   # no plan: Driver.launch, pdl=


class BytesDriver(RawDriver):
    """RawDriver whose cuLaunchKernelEx reads the config's raw bytes at cuda.h's offsets, not through kernellab's
    ctypes classes: gridDim x/y/z, blockDim x/y/z, sharedMemBytes (7 unsigned ints), 4 bytes of padding, hStream,
    attrs, numAttrs (56 bytes); each CUlaunchAttribute 72 bytes: id, 4 bytes of padding, the 64-byte value."""

    def launch_kernel_ex(self, config_p, f, params, extra):
        raw = ctypes.string_at(ctypes.cast(config_p, ctypes.c_void_p).value, 56)
        *dims, stream, attrs, n = struct.unpack_from("<7I4xQQI", raw)
        self.raw_ex.append((tuple(dims), stream, n, ctypes.string_at(attrs, 72 * n) if n else b""))
        return 0


def test_the_generated_pdl_launch_passes_cuda_hs_bytes():
    driver = BytesDriver()
    path = L.LaunchPath(0xF00, PARAMS, H100, name="vadd", signature="vadd(...)", max_threads_per_block=1024,
                        static_shared_bytes=0, driver=driver)
    fast = path.fast(path.config((4, 2), 256, 1024, pdl=True), tuple(map(type, args(1))))
    assert fast(args(7), None, False) and fast(args(8), 0xABC, False)
    dims = (4, 2, 1, 256, 1, 1, 1024)
    assert [r[:3] for r in driver.raw_ex] == [(dims, 0x5000, 1), (dims, 0xABC, 1)]     # one attribute
    for *_, attr in driver.raw_ex:          # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, the int at 8: 1
        assert struct.unpack_from("<I4xi", attr) == (6, 1) and attr[12:] == bytes(60)


@pytest.fixture
def fake_gpu(monkeypatch, tmp_cache):
    from kernellab.kernel import Kernel
    from kernellab.run.launch import device

    driver, where = RawDriver(), {"device": H100}
    monkeypatch.setattr(device, "gpu_status", lambda: (True, "1 GPU(s)"))
    monkeypatch.setattr(device, "device_info", lambda index=None: where["device"])
    monkeypatch.setattr(D, "driver", lambda: driver)
    monkeypatch.setattr(Kernel, "_function", lambda self, index: type("Fn", (), {"ptr": 0xF00})())
    return driver, where


def test_kernel_launches_with_pdl_on_sm_90_and_as_before_without(fake_gpu):
    driver, _ = fake_gpu
    k = kernellab.compile_cuda(VADD, arch="sm_90").vadd
    for n in (10, 11):
        k[8, 256](*args(n), pdl=True, sync=False)
    k[8, 256](*args(12), sync=False)
    k.launch(8, 256, *args(13), pdl=True, sync=False)
    assert [(r[2], r[3][3]) for r in driver.raw_ex] == [([(6, 1)], np.int32(n).tobytes()) for n in (10, 11, 13)]
    plain = [r[1][3] for r in driver.raw] + [p[3] for _, kw, p in driver.launches if kw == {}]
    assert plain == [np.int32(12).tobytes()] and len(driver.launches) + len(driver.raw) == 1    # cuLaunchKernel
    launcher = k[8, 256]
    assert callable(launcher._fast_pdl) and launcher._config_pdl.pdl and not launcher._config.pdl
    for n in (14, 15):                                   # the launcher's own generated PDL launch, as plain ones
        launcher(*args(n), pdl=True, sync=False)
    assert [r[3][3] for r in driver.raw_ex[-2:]] == [np.int32(n).tobytes() for n in (14, 15)]
    assert all(kw == {} for _, kw, _ in driver.launches)     # no PDL launch took Driver.launch's general way
    with pytest.raises(ArgumentError, match="pdl must be True or False"):
        k[8, 256](*args(3), pdl=1)


def test_kernel_launches_with_pdl_below_sm_90_are_plain_launches(fake_gpu):
    driver, where = fake_gpu
    where["device"] = A100
    k = kernellab.compile_cuda(VADD, arch="sm_80").vadd
    k[8, 256](*args(10), pdl=True, sync=False)
    k[8, 256](*args(11), sync=False)
    k[8, 256](*args(12), pdl=True, sync=False)
    plain = [p[3] for _, kw, p in driver.launches if kw == {}] + [r[1][3] for r in driver.raw]
    assert driver.raw_ex == [] and sorted(plain) == [np.int32(n).tobytes() for n in (10, 11, 12)]


# --- the device helpers --------------------------------------------------------------------------------------------

PDL_SOURCE = r'''
#include <kl/pdl.cuh>
extern "C" __global__ void k_wait(const float* x, float* y) { griddepcontrol_wait(); y[threadIdx.x] = x[threadIdx.x]; }
extern "C" __global__ void k_release(float* y) { griddepcontrol_launch_dependents(); y[threadIdx.x] = 1.0f; }
extern "C" __global__ void k_l2(const float* p) { prefetch_l2(p + threadIdx.x * 32); }
'''


def sass_ops(source, arch):
    module = kernellab.compile_cuda(source, arch=arch, first_line=2, filename="cell.cu")
    return {k.symbol: set(re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.x]+)", k.sass, re.M))
            for k in module.kernels}


def test_griddepcontrol_helpers_compile_to_acqbulk_and_preexit_on_sm_90_and_to_nothing_below(tmp_cache):
    ops = sass_ops(PDL_SOURCE, "sm_90")
    assert "ACQBULK" in ops["k_wait"] and "PREEXIT" in ops["k_release"]     # griddepcontrol.wait / launch_dependents
    assert "CCTL.E.PF2" in ops["k_l2"]                                        # prefetch.global.L2
    old = sass_ops(PDL_SOURCE, "sm_80")
    assert not {"ACQBULK", "PREEXIT"} & (old["k_wait"] | old["k_release"])


AFTER_WAIT = r"""
#include <kl/pdl.cuh>
#define BODY(READ)                                                                              \
    for (int i = threadIdx.x; i < 64; i += blockDim.x) prefetch_l2(x + 32 * i);                 \
    griddepcontrol_wait();                                                                      \
    const int len = READ;                                                                       \
    float acc = 0.f;                                                                            \
    for (int i = threadIdx.x; i < len; i += blockDim.x) acc += x[i];                            \
    y[blockIdx.x * blockDim.x + threadIdx.x] = acc;
extern "C" __global__ void k_restrict(const int* __restrict__ n, const float* __restrict__ x, float* y) {
    BODY(n[blockIdx.y])
}
extern "C" __global__ void k_after(const int* __restrict__ n, const float* __restrict__ x, float* y) {
    BODY(load_after_wait(n + blockIdx.y))
}
"""


def global_loads_before_the_wait(kernel) -> list[str]:
    """The global loads (LDG, LDGSTS, LD) a kernel's SASS issues before its ACQBULK (griddepcontrol.wait)."""
    ops = [x.split(";")[0].strip() for x in kernel.sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", x)]
    wait = next(i for i, op in enumerate(ops) if "ACQBULK" in op)
    return [op for op in ops[:wait] if re.search(r"\b(LDG|LDGSTS|LD)\b", op)]


def test_a_restrict_load_is_hoisted_above_the_wait_and_load_after_wait_is_not(tmp_cache):
    """The compiler treats a load through a const __restrict__ parameter as invariant (LDG.E.CONSTANT) and may issue it
    before griddepcontrol.wait, reading the primary's output before it is written; load_after_wait stays after it."""
    mod = kernellab.compile_cuda(AFTER_WAIT, arch="sm_90", first_line=2, filename="cell.cu")
    hoisted = global_loads_before_the_wait(mod.k_restrict)
    assert hoisted and all("CONSTANT" in op for op in hoisted), hoisted      # the hazard, with this NVRTC
    assert global_loads_before_the_wait(mod.k_after) == []


# --- the CPU emulator ----------------------------------------------------------------------------------------------

PRODUCER_CONSUMER = r'''
#include <kl/pdl.cuh>
__device__ __forceinline__ void my_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
extern "C" __global__ void producer(const float* x, float* y, int n) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
extern "C" __global__ void consumer(const float* y, const float* old, float* z, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    prefetch_l2(y + i);
    const float before = i < n ? old[i] : 0.0f;      // not written by the producer: safe before the wait
    griddepcontrol_wait();
    my_wait();
    if (i < n) z[i] = y[i] + before;
}
'''


def _emulator():
    from kernellab.run.sim.cuda import emulate

    if emulate.compiler() is None:
        pytest.skip("no host C++ compiler (g++ or zig's clang)")
    return emulate


def test_the_emulator_takes_griddepcontrol_inline_and_from_the_header_on_both_ways_in(tmp_cache):
    emulate = _emulator()
    from kernellab.run.sim.cuda import cpu

    assert cpu.unsupported(PRODUCER_CONSUMER) == ""                 # the checked build's way in: runs on the CPU
    for prepared in (emulate.host_source(PRODUCER_CONSUMER), emulate.prepare(PRODUCER_CONSUMER)):
        assert "asm" not in prepared and prepared.count("\n") == PRODUCER_CONSUMER.count("\n")   # lines kept
        assert "kl_emu::griddepcontrol_wait();" in prepared
        assert "kl_emu::griddepcontrol_launch_dependents();" in prepared
    n = 100
    x = np.arange(n, dtype=np.float32)
    old = np.full(n, 0.5, np.float32)
    y, z = np.zeros(n, np.float32), np.zeros(n, np.float32)
    emulate.emulate(PRODUCER_CONSUMER, "producer", (2,), (64,), [x, y, np.int32(n)])        # emulate's way in
    emulate.emulate(PRODUCER_CONSUMER, "consumer", (2,), (64,), [y, old, z, np.int32(n)])
    np.testing.assert_array_equal(z, 2 * x + 0.5)


def test_a_simulated_kernel_launch_takes_pdl(tmp_cache):
    _emulator()
    mod = kernellab.compile_cuda(PRODUCER_CONSUMER, arch="sm_90", first_line=2, filename="cell.cu")
    prod, cons = mod.producer, mod.consumer
    prod.simulate = cons.simulate = True
    n = 70
    x = torch.arange(n, dtype=torch.float32)
    y, z = torch.zeros(n), torch.zeros(n)
    prod[1, 128](x, y, n)
    cons[1, 128](y, torch.ones(n), z, n, pdl=True)
    torch.testing.assert_close(z, 2 * x + 1)
