"""The launch path without a GPU: per-type argument plans against marshal_args, the parameter buffer, the launch
configuration cache, sync and graph capture, streams, `Kernel.check_args` on any device, and why there is no GPU."""
import ctypes

import numpy as np
import pytest

import kernellab
from kernellab.compile.signature import find_kernels
from kernellab.errors import ArgumentError, LaunchError, NoGPUError
from kernellab.run.launch import launch as L
from kernellab.run.launch.device import DeviceInfo

torch = pytest.importorskip("torch")

H200 = DeviceInfo(index=0, name="Fake H200", arch="sm_90", multiprocessors=132,
                  shared_per_block_optin_bytes=227 * 1024, shared_per_sm_bytes=228 * 1024)

SRC = r"""
#include <cuda_fp16.h>
extern "C" __global__ void k(const float* __restrict__ x, __half* h, float4* v, int n, float alpha, double beta,
                             unsigned char u, long long big, void* raw, __nv_bfloat16 bf, __half hs, bool flag) {}
"""
PARAMS = find_kernels(SRC)[0].params


class FakeCudaTensor:
    """A CUDA tensor as the launch path reads one: real torch dtypes, an address, a device index."""

    def __init__(self, dtype=torch.float32, index=0, contiguous=True, ptr=0x7F0000000000, numel=64):
        self.dtype, self.is_cuda, self._index = dtype, True, index
        self.device = torch.device("cuda", index)
        self._contig, self._ptr, self._numel = contiguous, ptr, numel
        self.shape = (numel,)

    def get_device(self):
        return self._index

    def is_contiguous(self):
        return self._contig

    def data_ptr(self):
        return self._ptr

    def numel(self):
        return self._numel

    def element_size(self):
        return torch.empty(0, dtype=self.dtype).element_size()

    def dim(self):
        return 1


FakeCudaTensor.__module__ = "torch.fake"


class FakeDriver:
    """Records each launch with the bytes each parameter pointer points at; `capturing` and `fail` steer it."""

    def __init__(self, sizes=(), capturing=False, fail=None):
        self.sizes, self.capturing, self.fail = sizes, capturing, fail
        self.launches, self.syncs = [], []

    def launch(self, function, grid, block, shared_bytes, stream, params, device_index=0):
        if self.fail:
            raise RuntimeError(self.fail)
        pointers = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p)) if params else None
        raw = [ctypes.string_at(pointers[i], n) for i, n in enumerate(self.sizes)]
        self.launches.append(dict(function=function, grid=grid, block=block, shared_bytes=shared_bytes,
                                  stream=stream, params=raw))

    def synchronize(self, stream):
        self.syncs.append(stream)

    def is_capturing(self, stream):
        return self.capturing


def sizes(params):
    return [8 if p.pointer else (2 if p.dtype == "bfloat16" else np.dtype(p.dtype).itemsize) for p in params]


def make_path(params=PARAMS, device=H200, **kw):
    driver = kw.pop("driver", None) or FakeDriver(sizes(params))
    return L.LaunchPath(0xF00, params, device, name="k", signature="k(...)", max_threads_per_block=1024,
                        static_shared_bytes=0, driver=driver, **kw), driver


def good_args(**over):
    args = dict(x=FakeCudaTensor(), h=FakeCudaTensor(torch.float16), v=FakeCudaTensor(numel=64), n=10, alpha=0.5,
                beta=2.0, u=255, big=2**40, raw=FakeCudaTensor(torch.int32), bf=1.5, hs=-0.333, flag=True)
    args.update(over)
    return tuple(args.values())


@pytest.fixture(autouse=True)
def fake_streams(monkeypatch):
    monkeypatch.setattr(L, "torch_stream_handle", lambda index: 0x5000 + index)
    monkeypatch.setattr(L, "cupy_stream_handle", lambda: 0xC0)
    monkeypatch.setattr(L, "torch_stream_function", lambda: (lambda index: 0x5000 + index))
    monkeypatch.setattr(L, "cupy_stream_function", lambda: (lambda: 0xC0))


@pytest.mark.parametrize("args", [
    good_args(),
    good_args(n=-2**31, big=-1, u=0, alpha=3, beta=-1e300, flag=False, raw=None),
    good_args(alpha=1e-46, hs=65504.0, bf=-0.0),
])
def test_the_plan_packs_exactly_what_marshal_args_packs(args):
    path, driver = make_path()
    path.launch(4, 256, 0, args, sync=False)
    plan = path.plan(args)
    assert plan is not None                            # the plan's pass, not marshal_args
    want = [v.tobytes() for v in L.marshal_args(PARAMS, args, H200)]
    assert driver.launches[-1]["params"] == want
    assert driver.launches[-1]["grid"] == (4, 1, 1) and driver.launches[-1]["block"] == (256, 1, 1)
    assert driver.launches[-1]["stream"] == 0x5000     # torch's current stream on the tensors' device


def test_the_plan_is_made_once_per_type_combination_and_reads_as_code():
    path, _ = make_path()
    path.launch(1, 32, 0, good_args(), sync=False)
    path.launch(1, 32, 0, good_args(n=11, alpha=0.25), sync=False)
    assert len(path._plans) == 1
    path.launch(1, 32, 0, good_args(n=np.int32(3)), sync=False)    # another type: another plan (here: none)
    assert len(path._plans) == 2 and path.plan(good_args(n=np.int32(3))) is None
    src = path.plan(good_args()).source
    for check in ("a0.dtype is not D0", "a0.get_device() != DEV", "a0.is_contiguous()", "p2 % A2 or a2.numel() % 4",
                  "L3 <= a3 <= H3", "BF16(float(a9))"):
        assert check in src, src
    assert "a8.dtype" not in src                       # void*: any dtype


# Every argument the plan must refuse: the launch raises marshal_args's own error and launches nothing.
BAD = [
    ("x", FakeCudaTensor(torch.float16), r"argument 0 \('x'.*expects float32 elements"),
    ("x", FakeCudaTensor(index=1), r"'x'.*cuda:1 but the kernel launches on cuda:0"),
    ("x", FakeCudaTensor(contiguous=False), r"'x'.*non-contiguous"),
    ("x", np.zeros(4, np.float32), r"'x'.*NumPy array.*device memory"),
    ("x", 5, r"'x'.*pointer parameter but got a int"),
    ("x", "a string", r"'x'.*pointer parameter but got a str"),
    ("n", FakeCudaTensor(), r"'n'.*scalar parameter but got a torch tensor"),
    ("n", 2.5, r"'n'.*integer parameter but got the float 2.5"),
    ("n", 2**31, r"'n'.*int32: 2147483648 is outside"),
    ("u", -1, r"'u'.*uint8: -1 is outside"),
    ("alpha", "0.5", r"'alpha'.*expects a number"),
    ("v", FakeCudaTensor(ptr=0x7F0000000004), r"'v'.*16-byte aligned"),
    ("v", FakeCudaTensor(numel=63), r"'v'.*63 elements, not a multiple of 4"),
]


@pytest.mark.parametrize("field,value,match", BAD)
def test_every_bad_argument_gives_marshal_args_error(field, value, match):
    path, driver = make_path()
    path.launch(1, 32, 0, good_args(), sync=False)     # the plan for the good types exists
    with pytest.raises(ArgumentError, match=match):
        path.launch(1, 32, 0, good_args(**{field: value}), sync=False)
    assert len(driver.launches) == 1


def test_count_is_checked():
    path, driver = make_path()
    with pytest.raises(ArgumentError, match="takes 12 arguments, got 11"):
        path.launch(1, 32, 0, good_args()[:-1], sync=False)
    assert not driver.launches


def test_a_half_beyond_its_range_rounds_as_numpy_does():
    path, driver = make_path()
    with np.errstate(over="ignore"):
        path.launch(1, 32, 0, good_args(hs=1e6), sync=False)   # struct refuses; NumPy gives inf
    assert driver.launches[-1]["params"][10] == np.float16(np.inf).tobytes()


def test_launch_configurations_are_checked_once_and_cached():
    opted = []
    path, _ = make_path(opt_in=opted.append)
    cfg = path.config((8, 2), (16, 16), 0)
    assert path.config((8, 2), (16, 16), 0) is cfg and cfg.grid == (8, 2, 1)
    with pytest.raises(ArgumentError, match="1025 threads"):
        path.config(1, 1025, 0)
    path.config(1, 32, 100 * 1024)
    path.config(1, 64, 100 * 1024)
    path.config(1, 32, 64 * 1024)
    assert opted == [100 * 1024]                        # opt in above 48 KiB once, for the largest yet
    assert path.config([4], [32], 0).grid == (4, 1, 1)  # lists work, uncached


def test_clusters_over_8_blocks_opt_the_kernel_in_once():
    """Clusters of 9-16 blocks (sm_90's non-portable size) set the kernel's opt-in before the first such launch."""
    calls = []
    path, _ = make_path(cluster_opt_in=lambda: calls.append("opt in"))
    path.config(16, 128, 0, (8, 1, 1))
    assert calls == []                                   # 8 blocks: portable, no opt-in
    path.config(16, 128, 0, (16, 1, 1))
    path.config((8, 8), 128, 0, (4, 4, 1))
    assert calls == ["opt in"]
    with pytest.raises(ArgumentError, match="at most 16"):
        path.config(17, 128, 0, (17, 1, 1))


def test_a_block_whose_registers_do_not_fit_is_refused_before_the_driver_with_its_error():
    """288 threads at 224 registers (tutorial 08's Hopper backward): 9 warps put 3 on one sub-partition, 3 x 7168
    registers > 16384, which the driver refuses with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES. The path refuses it before
    calling the driver, with the LaunchError as_launch_error makes of that driver error; 168 registers launch."""
    path, driver = make_path(registers=224)
    with pytest.raises(LaunchError) as info:
        path.launch(1, 288, 99392, good_args(), sync=False)
    assert driver.launches == [] and path._configs == {}          # not launched, and not cached as good
    words = str(L.as_launch_error(L.OUT_OF_RESOURCES, "k", L.LaunchConfig((1, 1, 1), (288, 1, 1), 99392), "launch"))
    assert str(info.value).startswith(words) and info.value.cuda_error == L.OUT_OF_RESOURCES
    assert "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch" in words
    assert "3 x 7168" in str(info.value) and "kernellab.occupancy(288, 224, 99392, 'sm_90'): 0 blocks" in str(info.value)
    path.launch(1, 256, 99392, good_args(), sync=False)           # 8 warps: 2 a sub-partition
    assert driver.launches[-1]["block"] == (256, 1, 1)
    ok, ok_driver = make_path(registers=168)
    ok.launch(1, 288, 99392, good_args(), sync=False)
    assert ok_driver.launches[-1]["block"] == (288, 1, 1)
    unknown, unknown_driver = make_path()                         # registers not given: the driver decides
    unknown.launch(1, 288, 0, good_args(), sync=False)
    assert len(unknown_driver.launches) == 1


def test_max_active_clusters_asks_the_driver_with_the_cluster_shape(monkeypatch):
    import ctypes

    from kernellab.run.launch import cudriver as D

    seen = []

    class Lib:
        def cuOccupancyMaxActiveClusters(self, out, function, cfg_ref):
            cfg = ctypes.cast(cfg_ref, ctypes.POINTER(D.CUlaunchConfig)).contents
            a = cfg.attrs[0]
            seen.append((function.value, (cfg.gridDimX, cfg.blockDimX, cfg.sharedMemBytes), cfg.numAttrs, a.id,
                         (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z)))
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = 7
            return 0

    assert D.max_active_clusters(0xF00, (16, 1, 1), (1024, 1, 1), 131072, (16, 1, 1), lib=Lib()) == 7
    assert seen == [(0xF00, (16, 1024, 131072), 1, D.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, (16, 1, 1))]

    class Failing(Lib):
        def cuOccupancyMaxActiveClusters(self, out, function, cfg_ref):
            return 1                                     # CUDA_ERROR_INVALID_VALUE

    monkeypatch.setattr(D, "error_text", lambda rc: f"CUresult {rc}")   # no libcuda here to name it
    with pytest.raises(D.CudaDriverError, match="CUresult 1"):
        D.max_active_clusters(0xF00, (16, 1, 1), (1024, 1, 1), 0, (16, 1, 1), lib=Failing())


def test_sync_waits_except_when_deferred_asked_not_to_or_capturing():
    path, driver = make_path()
    path.launch(1, 32, 0, good_args())
    assert driver.syncs == [0x5000]
    path.launch(1, 32, 0, good_args(), sync=False)
    with L.deferred_sync():
        path.launch(1, 32, 0, good_args())
    assert driver.syncs == [0x5000]
    driver.capturing = True                             # torch.cuda.graph: recorded, not run; waiting would break it
    path.launch(1, 32, 0, good_args())
    assert driver.syncs == [0x5000] and len(driver.launches) == 4


def test_driver_errors_become_launch_errors_sticky_ones_say_so():
    path, _ = make_path(driver=FakeDriver(sizes(PARAMS), fail="CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory "
                                                                "access was encountered"))
    with pytest.raises(LaunchError, match="sticky") as info:
        path.launch(1, 32, 0, good_args())
    assert info.value.sticky and "ILLEGAL_ADDRESS" in info.value.cuda_error
    path, _ = make_path(driver=FakeDriver(sizes(PARAMS), fail="CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many"))
    with pytest.raises(LaunchError, match="fewer threads per block") as info:
        path.launch(1, 32, 0, good_args())
    assert not info.value.sticky


class _Protocol:
    def __cuda_stream__(self):
        return (0, 0xABC)


@pytest.mark.parametrize("stream,handle", [
    (0x77, 0x77),
    (type("TorchStream", (), {"cuda_stream": 0x88})(), 0x88),
    (type("CupyStream", (), {"ptr": 0x99})(), 0x99),
    (_Protocol(), 0xABC),
    (type("NumbaStream", (), {"handle": ctypes.c_void_p(0x55)})(), 0x55),
])
def test_streams_in_every_form(stream, handle):
    path, driver = make_path()
    path.launch(1, 32, 0, good_args(), stream=stream, sync=True)
    assert driver.launches[-1]["stream"] == handle and driver.syncs == [handle]


def test_scalars_only_launch_on_cupys_stream():
    params = find_kernels("__global__ void s(int n, float a) {}")[0].params
    path, driver = make_path(params)
    path.launch(1, 32, 0, (3, 1.0), sync=False)
    assert driver.launches[-1]["stream"] == 0xC0
    assert driver.launches[-1]["params"] == [np.int32(3).tobytes(), np.float32(1.0).tobytes()]


def test_a_parameter_python_cannot_pass_is_an_argument_error_not_a_crash():
    params = find_kernels("struct S { int a; float b; };\n__global__ void s(S v, float* x) {}")[0].params
    path, driver = make_path(params)
    with pytest.raises(ArgumentError, match="parameters of type 'S' cannot be passed from Python"):
        path.launch(1, 32, 0, (3, FakeCudaTensor()), sync=False)
    assert not driver.launches


def test_no_parameters_pass_null():
    params = find_kernels("__global__ void z() {}")[0].params
    path, driver = make_path(params)
    path.launch(1, 32, 0, (), sync=False)
    assert path.params_address is None and driver.launches[-1]["params"] == []


# -- through Kernel: k[grid, block](...) with a fake GPU ---------------------------------------------------------

VADD = r"""extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}"""


@pytest.fixture
def fake_gpu(monkeypatch, tmp_cache):
    from kernellab.kernel import Kernel
    from kernellab.run.launch import cudriver, device

    driver = FakeDriver([8, 8, 8, 4])
    monkeypatch.setattr(device, "gpu_status", lambda: (True, "1 GPU(s)"))
    monkeypatch.setattr(device, "device_info", lambda index=None: H200)
    monkeypatch.setattr(cudriver, "driver", lambda: driver)
    monkeypatch.setattr(Kernel, "_function", lambda self, index: type("Fn", (), {"ptr": 0xF00})())
    return driver


def test_kernel_launches_go_through_one_cached_path(fake_gpu):
    k = kernellab.compile_cuda(VADD, arch="sm_90").vadd
    a, b, c = FakeCudaTensor(ptr=0x1000), FakeCudaTensor(ptr=0x2000), FakeCudaTensor(ptr=0x3000)
    for n in (10, 11, 12):
        k[(n + 255) // 256, 256](a, b, c, n)
    assert k[1, 256] is k[1, 256]                       # the launcher is kept per configuration
    assert [l["params"][3] for l in fake_gpu.launches] == [np.int32(n).tobytes() for n in (10, 11, 12)]
    assert fake_gpu.launches[0]["params"][:3] == [np.uint64(p).tobytes() for p in (0x1000, 0x2000, 0x3000)]
    assert len(fake_gpu.syncs) == 3 and len(k._path._plans) == 1
    with pytest.raises(ArgumentError, match="expects float32 elements"):
        k[1, 256](a, b, FakeCudaTensor(torch.float64), 3)
    with pytest.raises(ArgumentError, match="1025 threads"):
        k[1, 1025](a, b, c, 3)
    k.launch(1, 128, a, b, c, 5, sync=False)            # the method form shares the path
    assert fake_gpu.launches[-1]["block"] == (128, 1, 1) and len(fake_gpu.syncs) == 3


def test_a_sticky_fault_keeps_the_launch_for_sanitize_last(fake_gpu):
    k = kernellab.compile_cuda(VADD, arch="sm_90").vadd
    args = (FakeCudaTensor(), FakeCudaTensor(), FakeCudaTensor(), 4)
    k[1, 32](*args)                                      # the launcher now takes the short way
    fake_gpu.fail = "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered"
    with pytest.raises(LaunchError) as info:
        k[1, 32](*args)
    assert info.value.sticky and info.value.job is not None and info.value.job.grid == (1, 1, 1)


# -- Kernel.check_args: on any device ---------------------------------------------------------------------------

CHECK_SRC = r"""
#include <cuda_fp16.h>
extern "C" __global__ void f(const float* x, float4* v, __half* h, int n, float a) {}
"""


@pytest.fixture
def f(tmp_cache):
    return kernellab.compile_cuda(CHECK_SRC, arch="sm_90").f


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_check_args_takes_cpu_and_meta_tensors_as_stand_ins(f, device):
    x, v, h = (torch.zeros(64, device=device), torch.zeros(64, device=device),
               torch.zeros(8, dtype=torch.float16, device=device))
    f.check_args(x, v, h, 64, 0.5)
    with pytest.raises(ArgumentError, match=r"argument 0 \('x'.*expects float32 elements but got a torch tensor "
                                            r"\(dtype float16"):
        f.check_args(h, v, h, 64, 0.5)
    with pytest.raises(ArgumentError, match="takes 5 arguments, got 4"):
        f.check_args(x, v, h, 64)
    with pytest.raises(ArgumentError, match=r"'a'.*expects a number, got str"):
        f.check_args(x, v, h, 64, "0.5")
    with pytest.raises(ArgumentError, match=r"'x'.*non-contiguous"):
        f.check_args(torch.zeros(8, 8, device=device).t(), v, h, 64, 0.5)
    with pytest.raises(ArgumentError, match=r"'v'.*16-byte aligned data, but the tensor starts 4 bytes into its "
                                            r"storage"):
        f.check_args(x, torch.zeros(65, device=device)[1:], h, 64, 0.5)
    with pytest.raises(ArgumentError, match=r"'v'.*63 elements, not a multiple of 4"):
        f.check_args(x, torch.zeros(63, device=device), h, 64, 0.5)
    with pytest.raises(ArgumentError, match=r"'n'.*scalar parameter"):
        f.check_args(x, v, h, x, 0.5)
    f.check_args(np.zeros(4, np.float32), torch.zeros(64)[4:], None, np.int64(3), 1)   # NumPy, an aligned view, null


def test_without_a_gpu_the_argument_error_comes_first(f):
    if kernellab.has_gpu():
        pytest.skip("a GPU is present")
    x, v, h = torch.zeros(64), torch.zeros(64), torch.zeros(8, dtype=torch.float16)
    with pytest.raises(ArgumentError, match="expects float32 elements"):
        f[1, 32](h, v, h, 64, 0.5)
    with pytest.raises(ArgumentError, match="takes 5 arguments"):
        f[1, 32](x, v, h)
    with pytest.raises(ArgumentError, match="2048 threads"):
        f[1, 2048](x, v, h, 64, 0.5)
    with pytest.raises(NoGPUError, match="launching f needs a CUDA GPU"):
        f[1, 32](x, v, h, 64, 0.5)


# -- why there is no GPU ----------------------------------------------------------------------------------------

def test_why_no_gpu_names_the_cause(monkeypatch):
    from kernellab.run.launch import cudriver, device

    runtime_says = "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version"

    def no_driver():
        raise cudriver.DriverUnavailable("libcuda.so.1 cannot be loaded")

    monkeypatch.setattr(cudriver, "driver_version", no_driver)
    text = device.why_no_gpu(runtime_says, 13000)
    assert text.startswith("no NVIDIA driver is installed on this machine (libcuda.so.1 cannot be loaded)")
    assert "insufficient" not in text

    monkeypatch.setattr(cudriver, "driver_version", lambda: 12020)
    text = device.why_no_gpu(runtime_says, 13000)
    assert "the NVIDIA driver is too old: it supports CUDA 12.2, and CuPy's CUDA runtime needs CUDA 13.0" in text
    assert "cupy-cuda12x" in text

    monkeypatch.setattr(cudriver, "driver_version", lambda: 13000)
    monkeypatch.setattr(cudriver, "init_error", lambda: "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected")
    text = device.why_no_gpu("cudaErrorNoDevice: no CUDA-capable device is detected", 13000)
    assert text == ("the NVIDIA driver (CUDA 13.0) finds no usable GPU: CUDA_ERROR_NO_DEVICE: no CUDA-capable device "
                    "is detected")


def test_this_machines_no_gpu_reason_is_the_right_one():
    from kernellab.run.launch import cudriver, device

    if kernellab.has_gpu():
        pytest.skip("a GPU is present")
    try:
        cudriver.driver_version()
    except cudriver.DriverUnavailable:
        assert "no NVIDIA driver is installed" in device.gpu_status()[1]
    else:
        assert "no NVIDIA driver" not in device.gpu_status()[1]


# -- tensor maps and clusters on the packed path ----------------------------------------------------------------

TMA_SRC = r"""
#include <cuda.h>
extern "C" __global__ void t(float* out, const __grid_constant__ CUtensorMap tmap, int n) {
    if (n < 0) out[0] = (float)(size_t)&tmap;
}
"""
TMA_PARAMS = find_kernels(TMA_SRC)[0].params
MAP_BYTES = bytes(range(7, 135))


def a_map(device=0, encoded=MAP_BYTES):
    from kernellab.run.launch.tensor_map import TensorMap

    return TensorMap(tensor=None, shape=(64, 64), dtype="float32", box=(16, 32), strides_bytes=(256, 4),
                     element_strides=(1, 1), global_address=0x7F0000000000, device=device, encoded=encoded)


class RecordingDriver:
    """A driver that keeps, per launch, the address and bytes behind each kernelParams pointer and the cluster."""

    def __init__(self, sizes):
        self.sizes, self.launches, self.syncs = sizes, [], []

    def launch(self, function, grid, block, shared_bytes, stream, params, device_index=0, cluster=None):
        p = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        self.launches.append(dict(grid=grid, cluster=cluster, addresses=[p[i] for i in range(len(self.sizes))],
                                  params=[ctypes.string_at(p[i], n) for i, n in enumerate(self.sizes)]))

    def synchronize(self, stream):
        self.syncs.append(stream)

    def is_capturing(self, stream):
        return False


def test_a_tensor_map_is_packed_as_its_128_bytes_at_a_64_byte_aligned_address():
    driver = RecordingDriver([8, 128, 4])
    path, _ = make_path(TMA_PARAMS, driver=driver)
    args = (FakeCudaTensor(ptr=0x1000), a_map(), 48)
    path.launch(2, 128, 0, args, sync=False)
    assert path.plan(args) is not None and "m1 = a1.encoded" in path.plan(args).source   # the plan's pass
    (launch,) = driver.launches
    assert launch["params"] == [np.uint64(0x1000).tobytes(), MAP_BYTES, np.int32(48).tobytes()]
    assert launch["params"] == [v.tobytes() for v in L.marshal_args(TMA_PARAMS, args, H200)]
    assert launch["addresses"][1] % 64 == 0 and launch["addresses"][0] % 8 == 0


@pytest.mark.parametrize("value,match", [
    (a_map(device=1), "maps a tensor on GPU 1 but the kernel launches on GPU 0"),
    (a_map(encoded=b"short"), "holds 5 encoded bytes, not 128"),
    (FakeCudaTensor(), "takes a tensor map, but got a torch tensor"),
])
def test_a_map_the_plan_refuses_gets_marshal_args_error(value, match):
    driver = RecordingDriver([8, 128, 4])
    path, _ = make_path(TMA_PARAMS, driver=driver)
    path.launch(1, 32, 0, (FakeCudaTensor(), a_map(), 1), sync=False)
    with pytest.raises(ArgumentError, match=match):
        path.launch(1, 32, 0, (FakeCudaTensor(), value, 1), sync=False)
    with pytest.raises(ArgumentError, match="got a tensor map, but the parameter is not a CUtensorMap"):
        path.launch(1, 32, 0, (a_map(), a_map(), 1), sync=False)
    assert len(driver.launches) == 1


def test_the_driver_copies_exactly_the_bytes_packed(tmp_cache):
    """The cubin's EIATTR_KPARAM_INFO: each parameter's size is what the path packs behind its pointer. The offsets
    are the kernel's own: a map after a pointer at 0x30 (64-byte aligned in constant bank 0, which parameters enter
    at 0x210), so kernelParams, not a packed `extra` buffer in the host layout, is the way to pass them."""
    import re
    import subprocess

    from kernellab.compile import toolkit

    tool = toolkit.find_tool("cuobjdump")
    if tool is None:
        pytest.skip("no cuobjdump")
    k = kernellab.compile_cuda(TMA_SRC, arch="sm_90").t
    cubin = tmp_cache / "t.cubin"
    cubin.write_bytes(k.module.cubin)
    elf = subprocess.run([tool, "-elf", str(cubin)], capture_output=True, text=True, check=True).stdout
    info = {int(o, 16): (int(off, 16), int(n, 16)) for o, off, n in
            re.findall(r"Ordinal : 0x(\w+)\s+Offset\s+: 0x(\w+)\s+Size\s+: 0x(\w+)", elf)}
    assert info == {0: (0, 8), 1: (0x30, 128), 2: (0xB0, 4)}
    fmt, offsets, total = L._layout(k.params)
    assert [info[i][1] for i in range(3)] == [8, 128, 4] and offsets == (0, 64, 192)
    assert re.search(r"\.param \.align 64 \.b8 t_param_1\[128\]", k.ptx)


def test_a_cluster_launch_goes_to_the_driver_with_its_shape():
    driver = RecordingDriver([8, 128, 4])
    path, _ = make_path(TMA_PARAMS, driver=driver)
    args = (FakeCudaTensor(), a_map(), 1)
    path.launch(8, 32, 0, args, sync=False, cluster=2)
    path.launch(8, 32, 0, args, sync=False)
    assert [l["cluster"] for l in driver.launches] == [(2, 1, 1), None]
    assert path.config(8, 32, 0, 2).cluster == (2, 1, 1) and path.config(8, 32, 0) is not path.config(8, 32, 0, 2)
    with pytest.raises(ArgumentError, match="grid x = 7 is not a multiple of 2"):
        path.launch(7, 32, 0, args, sync=False, cluster=(2, 1, 1))
    assert len(driver.launches) == 2


def test_the_cluster_launch_config_is_cuda_hs_struct():
    """CUlaunchConfig and CUlaunchAttribute as cuda.h lays them out (sizes and offsets checked against the header
    with a C compiler), and what Driver hands cuLaunchKernelEx."""
    from kernellab.run.launch import cudriver as D

    assert (ctypes.sizeof(D.CUlaunchAttributeValue), ctypes.sizeof(D.CUlaunchAttribute),
            ctypes.sizeof(D.CUlaunchConfig)) == (64, 72, 56)
    assert (D.CUlaunchConfig.hStream.offset, D.CUlaunchConfig.attrs.offset, D.CUlaunchConfig.numAttrs.offset,
            D.CUlaunchAttribute.value.offset) == (32, 40, 48, 8)
    seen = []

    def launch_ex(cfg_ref, function, params, extra):
        cfg = ctypes.cast(cfg_ref, ctypes.POINTER(D.CUlaunchConfig)).contents
        a = cfg.attrs[0]
        seen.append(((cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ), (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ),
                     cfg.sharedMemBytes, cfg.hStream, cfg.numAttrs, a.id,
                     (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z), function, params, extra))
        return 0

    drv = object.__new__(D.Driver)
    drv._launch, drv._launch_ex = (lambda *a: pytest.fail("cuLaunchKernel for a cluster launch")), launch_ex
    drv.launch(0xF00, (8, 2, 1), (128, 1, 1), 1024, 0x5000, 0x1234, 0, cluster=(2, 2, 1))
    assert seen == [((8, 2, 1), (128, 1, 1), 1024, 0x5000, 1, D.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, (2, 2, 1),
                     0xF00, 0x1234, None)]
    assert D.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION == 4


def test_kernel_cluster_launches_take_the_packed_path(fake_gpu, monkeypatch):
    from kernellab.run.launch import cudriver

    driver = RecordingDriver([8, 128, 4])
    monkeypatch.setattr(cudriver, "driver", lambda: driver)
    k = kernellab.compile_cuda(TMA_SRC, arch="sm_90").t
    args = (FakeCudaTensor(), a_map(), 3)
    k[8, 32](*args)
    k[8, 32](*args, cluster=(4, 1, 1))
    k[8, 32](*args)                                      # the launcher's short way: no cluster
    assert [l["cluster"] for l in driver.launches] == [None, (4, 1, 1), None]
    assert all(l["params"][1] == MAP_BYTES for l in driver.launches)
    with pytest.raises(ArgumentError, match="32 blocks; at most 16"):
        k[32, 32](*args, cluster=32)


def test_without_a_gpu_a_bad_cluster_shape_comes_first(tmp_cache):
    if kernellab.has_gpu():
        pytest.skip("a GPU is present")
    k = kernellab.compile_cuda(VADD, arch="sm_90").vadd
    x = torch.zeros(8)
    with pytest.raises(ArgumentError, match="not a whole number of clusters"):
        k[7, 32](x, x, x, 8, cluster=2)
    with pytest.raises(NoGPUError):
        k[8, 32](x, x, x, 8, cluster=2)


# --- the generated launch (LaunchPath.fast) ------------------------------------------------------------------


class RawDriver(FakeDriver):
    """A FakeDriver with the raw calls the generated launch makes: launch_kernel records each launch (the bytes behind
    each pointer) and returns the next CUresult of `rcs` (0 when none is left), or raises `error_type` as CuPy's
    launchKernel does; stream_is_capturing writes `capturing` through the status pointer."""

    def __init__(self, sizes=(), capturing=False, rcs=(), error_type=None, sync_rc=0):
        super().__init__(sizes, capturing)
        self.clusters = []
        self.rcs, self.error_type, self.sync_rc = list(rcs), error_type, sync_rc
        self.raw, self.queries, self.made_current = [], [], []

    def launch_kernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        rc = self.rcs.pop(0) if self.rcs else 0
        if isinstance(rc, Exception):                   # what a launch function may raise besides CUresults
            raise rc
        if rc == 0:
            pointers = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
            self.raw.append(dict(function=f, grid=(gx, gy, gz), block=(bx, by, bz), shared_bytes=smem, stream=stream,
                                 extra=extra, params=[ctypes.string_at(pointers[i], n)
                                                      for i, n in enumerate(self.sizes)]))
        if self.error_type is not None:                 # as CuPy's launchKernel: None, or the exception
            if rc:
                raise self.error_type(rc)
            return None
        return rc

    def launch(self, function, grid, block, shared_bytes, stream, params, device_index=0, cluster=None):
        self.clusters.append(cluster)
        super().launch(function, grid, block, shared_bytes, stream, params, device_index)

    def stream_is_capturing(self, stream, status_pointer):
        self.queries.append(stream)
        status_pointer.contents.value = 1 if self.capturing else 0
        return 0

    def stream_synchronize(self, stream):
        self.syncs.append(stream)
        return self.sync_rc

    def error(self, rc):
        return RuntimeError({700: "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
                             201: "CUDA_ERROR_INVALID_CONTEXT: invalid device context"}.get(rc, f"CUDA error {rc}"))

    def make_current(self, index):
        self.made_current.append(index)


class CupyStyleError(RuntimeError):
    def __init__(self, status):
        self.status = status
        super().__init__(RawDriver().error(status))


def fast_for(path, args, grid=4, block=256, shared_bytes=0):
    cfg = path.config(grid, block, shared_bytes)
    return cfg, path.fast(cfg, tuple(map(type, args)))


@pytest.mark.parametrize("args", [
    good_args(),
    good_args(n=-2**31, big=-1, u=0, alpha=3, beta=-1e300, flag=False, raw=None),
    good_args(alpha=1e-46, hs=65504.0, bf=-0.0),
])
def test_the_generated_launch_packs_what_marshal_args_packs(args):
    path, driver = make_path(driver=RawDriver(sizes(PARAMS)))
    cfg, fast = fast_for(path, args, grid=(4, 2), block=(64, 2), shared_bytes=512)
    assert fast is not None and fast is path.fast(cfg, tuple(map(type, args)))     # made once
    assert fast(args, None, False) is True
    want = [v.tobytes() for v in L.marshal_args(PARAMS, args, H200)]
    assert driver.raw == [dict(function=0xF00, grid=(4, 2, 1), block=(64, 2, 1), shared_bytes=512, stream=0x5000,
                               extra=0, params=want)]
    assert driver.launches == [] and driver.queries == [] and driver.syncs == []    # sync=False: no query, no wait
    assert "LAUNCH(FN, 4, 2, 1, 64, 2, 1, 512, s, PARAMS, 0)" in fast.source


def test_the_generated_launch_hands_back_what_it_cannot_settle_having_launched_nothing():
    path, driver = make_path(driver=RawDriver(sizes(PARAMS)))
    cfg, fast = fast_for(path, good_args())
    for args in (good_args(x=FakeCudaTensor(torch.float64)),          # wrong dtype
                 good_args(x=FakeCudaTensor(index=1)),                 # another GPU
                 good_args(x=FakeCudaTensor(contiguous=False)),
                 good_args(v=FakeCudaTensor(ptr=0x7F0000000004)),      # float4* not 16-byte aligned
                 good_args(n=2**31),                                   # out of int's range
                 good_args(alpha=1e39),                                # struct refuses: float32 overflows
                 good_args(n=np.int32(3)),                             # another type: another plan
                 good_args()[:-1], 5):                                 # too few arguments; not a tuple
        assert fast(args, None, False) is False, args
        assert not path._lock.locked()
    assert driver.raw == []
    with pytest.raises(ArgumentError, match="expects float32 elements"):         # run: the precise error
        path.run(cfg, good_args(x=FakeCudaTensor(torch.float64)))
    with pytest.raises(ArgumentError, match=r"is int32: 2147483648 is outside"):
        path.run(cfg, good_args(n=2**31))
    assert path.fast(path.config(1, 32, 0, cluster=(1, 1, 1)), tuple(map(type, good_args()))) is None
    assert path.fast(cfg, tuple(map(type, good_args(n=np.int32(3))))) is None      # no plan for these types


def test_the_generated_launch_waits_unless_asked_not_to_or_capturing():
    path, driver = make_path(driver=RawDriver(sizes(PARAMS)))
    _, fast = fast_for(path, good_args())
    assert fast(good_args(), None, None) and driver.queries == [0x5000] and driver.syncs == [0x5000]
    driver.capturing = True                              # torch.cuda.graph: recorded, not waited for
    assert fast(good_args(), None, True) and driver.queries == [0x5000] * 2 and driver.syncs == [0x5000]
    driver.capturing = False
    with L.deferred_sync():                              # kernellab.bench times it: no wait
        assert fast(good_args(), None, None)
    assert fast(good_args(), 0xABC, None) and driver.syncs == [0x5000, 0xABC]       # stream= as given
    assert fast(good_args(), _Protocol(), False) and driver.raw[-1]["stream"] == 0xABC
    assert len(driver.raw) == 5
    driver.sync_rc = 700                                 # a fault in the kernel, reported at this launch
    with pytest.raises(LaunchError, match="sticky") as info:
        fast(good_args(), None, True)
    assert info.value.sticky and not path._lock.locked()


def test_the_generated_launch_uses_cupys_stream_for_cupy_style_arguments():
    class FakeCupyArray:                                 # what the plan and marshal_args read of a cupy.ndarray
        dtype, device, nbytes, shape = np.dtype("float32"), type("Device", (), {"id": 0})(), 256, (64,)
        flags, _c_contiguous = type("Flags", (), {"c_contiguous": True})(), True
        data = type("Memory", (), {"ptr": 0xBEEF00, "device_id": 0})()

    FakeCupyArray.__module__ = "cupy.fake"
    params = find_kernels(VADD)[0].params
    path, driver = make_path(params, driver=RawDriver([8, 8, 8, 4]))
    args = (FakeCupyArray(), FakeCupyArray(), FakeCupyArray(), 7)
    _, fast = fast_for(path, args)
    assert fast(args, None, False)
    assert driver.raw[0]["stream"] == 0xC0 and driver.raw[0]["params"][0] == np.uint64(0xBEEF00).tobytes()
    assert driver.raw[0]["params"] == [v.tobytes() for v in L.marshal_args(params, args, H200)]
    strided = FakeCupyArray()
    strided._c_contiguous = False
    assert fast((strided,) + args[1:], None, False) is False and len(driver.raw) == 1
    with pytest.raises(ArgumentError, match="non-contiguous"):
        strided.flags = type("Flags", (), {"c_contiguous": False})()
        path.run(path.config(1, 32, 0), (strided,) + args[1:])


@pytest.mark.parametrize("error_type", [None, CupyStyleError])
def test_a_failed_generated_launch_retries_once_for_a_new_thread_else_says_why(error_type):
    path, driver = make_path(driver=RawDriver(sizes(PARAMS), rcs=[201], error_type=error_type))
    _, fast = fast_for(path, good_args())
    assert fast(good_args(), None, False)                # INVALID_CONTEXT: made current, launched through launch
    assert driver.made_current == [0] and len(driver.launches) == 1 and driver.raw == []
    assert driver.launches[0]["params"] == [v.tobytes() for v in L.marshal_args(PARAMS, good_args(), H200)]
    driver.rcs = [700]
    with pytest.raises(LaunchError, match="sticky") as info:
        fast(good_args(), None, False)
    assert "ILLEGAL_ADDRESS" in info.value.cuda_error and not path._lock.locked()
    assert len(driver.launches) == 1                     # not launched again
    driver.rcs = [OverflowError("can't convert negative int to unsigned")]
    with pytest.raises(LaunchError, match="failed at launch .*convert negative int") as info:
        fast(good_args(), None, False)
    assert not info.value.sticky and not path._lock.locked() and len(driver.launches) == 1


def test_kernel_launchers_take_the_generated_launch_after_the_first_call(fake_gpu, monkeypatch):
    from kernellab.run.launch import cudriver

    driver = RawDriver([8, 8, 8, 4])
    monkeypatch.setattr(cudriver, "driver", lambda: driver)
    k = kernellab.compile_cuda(VADD, arch="sm_90").vadd
    a, b, c = FakeCudaTensor(ptr=0x1000), FakeCudaTensor(ptr=0x2000), FakeCudaTensor(ptr=0x3000)
    for n in (10, 11, 12):
        k[1, 256](a, b, c, n, sync=False)
    assert len(driver.launches) == 1 and len(driver.raw) == 2      # the first through run, then generated
    assert [r["params"][3] for r in driver.raw] == [np.int32(n).tobytes() for n in (11, 12)]
    with pytest.raises(ArgumentError, match="expects float32 elements"):
        k[1, 256](a, b, FakeCudaTensor(torch.float64), 3)
    k[1, 256](a, b, c, 13, cluster=(1, 1, 1))             # a cluster: through run and Driver.launch
    assert len(driver.launches) == 2 and len(driver.raw) == 2 and driver.clusters == [None, (1, 1, 1)]
    k[1, 256](a, b, c, 14)
    assert len(driver.raw) == 3 and driver.syncs == [0x5000, 0x5000]     # the cluster launch waited too
    driver.rcs = [700]
    with pytest.raises(LaunchError, match="sticky"):
        k[1, 256](a, b, c, 15)
    assert len(driver.raw) == 3 and not k._path._lock.locked()


def _abs_lib():
    """libcuda's launch-path calls played by libc's abs() with libcuda's argtypes: 0 for function 0 and stream 0."""
    from kernellab.run.launch import cudriver as D

    libc = ctypes.CDLL(None)
    p, u, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
    lib = type("Lib", (), {})()
    for name, argtypes in (("cuLaunchKernel", [p, u, u, u, u, u, u, u, p, p, p]), ("cuStreamSynchronize", [p]),
                           ("cuStreamIsCapturing", [p, ctypes.POINTER(i)]),
                           ("cuLaunchKernelEx", [ctypes.POINTER(D.CUlaunchConfig), p, p, p])):
        fn = libc["abs"]
        fn.argtypes, fn.restype = argtypes, i
        setattr(lib, name, fn)
    return lib


def test_the_generated_calls_fit_the_ctypes_argtypes_of_the_real_driver(monkeypatch):
    from kernellab.run.launch import cudriver as D

    lib = _abs_lib()
    monkeypatch.setattr(D, "_lib_or_none", lambda: None)           # no libcuda: the given lib, ctypes calls
    drv = D.Driver(lib)
    assert drv.launch_kernel is lib.cuLaunchKernel
    monkeypatch.setattr(L, "torch_stream_function", lambda: (0).__mul__)      # stream 0 (C callable, as torch's)
    path = L.LaunchPath(0, PARAMS, H200, name="k", signature="k(...)", max_threads_per_block=1024,
                        static_shared_bytes=0, driver=drv)
    _, fast = fast_for(path, good_args())
    assert fast(good_args(), None, True) is True                   # launch, capture query, wait: each rc 0
    assert fast(good_args(), 0, False) is True


def test_cupys_launchkernel_is_offered_with_the_signature_the_generated_launch_calls(monkeypatch):
    cupy_cuda = pytest.importorskip("cupy.cuda")
    from kernellab.run.launch import cudriver as D

    fn = D._cupy_launch_kernel()
    assert fn is cupy_cuda.driver.launchKernel
    assert fn.__doc__.splitlines()[0].replace(" ", "") == (
        "launchKernel(intptr_tf,unsignedintgrid_dim_x,unsignedintgrid_dim_y,unsignedintgrid_dim_z,unsignedint"
        "block_dim_x,unsignedintblock_dim_y,unsignedintblock_dim_z,unsignedintshared_mem_bytes,intptr_tstream,"
        "intptr_tkernel_params,intptr_textra)")
    lib = _abs_lib()
    monkeypatch.setattr(D, "_lib_or_none", lambda: lib)            # this lib is the process's libcuda
    assert D.Driver(lib).launch_kernel is fn
    assert D.Driver(lib, cupy_launch=False).launch_kernel is lib.cuLaunchKernel



# --- cluster launches on the generated path (cuLaunchKernelEx) ---------------------------------------------------

class RawExDriver(RawDriver):
    """A RawDriver with the raw cuLaunchKernelEx too: launch_kernel_ex reads the CUlaunchConfig it is handed (grid,
    block, shared bytes, stream, the cluster attribute) and the bytes behind each kernelParams pointer, and returns
    the next CUresult of `rcs` (0 when none is left)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.raw_ex = []

    def launch_kernel_ex(self, config_p, f, params, extra):
        from kernellab.run.launch import cudriver as D

        rc = self.rcs.pop(0) if self.rcs else 0
        if rc == 0:
            cfg = ctypes.cast(config_p, ctypes.POINTER(D.CUlaunchConfig)).contents
            attrs = [cfg.attrs[i] for i in range(cfg.numAttrs)]
            pointers = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
            self.raw_ex.append(dict(
                function=f, grid=(cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ),
                block=(cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ), shared_bytes=cfg.sharedMemBytes,
                stream=cfg.hStream or 0, extra=extra,
                attrs=[(a.id, (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z)) for a in attrs],
                params=[ctypes.string_at(pointers[i], n) for i, n in enumerate(self.sizes)]))
        return rc


def test_a_cluster_launch_has_a_generated_launch_through_cuLaunchKernelEx():
    from kernellab.run.launch import cudriver as D

    path, driver = make_path(driver=RawExDriver(sizes(PARAMS)))
    cfg = path.config((8, 2), (64, 2), 512, cluster=(4, 2))
    fast = path.fast(cfg, tuple(map(type, good_args())))
    assert callable(fast) and fast is path.fast(cfg, tuple(map(type, good_args())))     # made once
    assert "LAUNCH_EX(CONFIG_P, FN, PARAMS, None)" in fast.source and "LAUNCH(FN" not in fast.source
    assert fast(good_args(), None, False) is True
    assert fast(good_args(n=7), 0xABC, False) is True                 # another stream, another value
    want = [v.tobytes() for v in L.marshal_args(PARAMS, good_args(), H200)]
    assert driver.raw_ex[0] == dict(function=0xF00, grid=(8, 2, 1), block=(64, 2, 1), shared_bytes=512,
                                    stream=0x5000, extra=None, params=want,
                                    attrs=[(D.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, (4, 2, 1))])
    assert driver.raw_ex[1]["stream"] == 0xABC and driver.raw_ex[1]["params"][3] == np.int32(7).tobytes()
    assert driver.raw == [] and driver.launches == []                  # neither cuLaunchKernel nor Driver.launch
    # Each configuration has its own launch config: another cluster shape launches with its own dims.
    other = path.fast(path.config(8, 64, 0, cluster=2), tuple(map(type, good_args())))
    assert other(good_args(), None, False) and driver.raw_ex[-1]["attrs"] == [(4, (2, 1, 1))]
    assert driver.raw_ex[-1]["grid"] == (8, 1, 1) and driver.raw_ex[-1]["shared_bytes"] == 0
    # What the generated launch cannot settle goes back to run, having launched nothing: run's precise error.
    assert fast(good_args(x=FakeCudaTensor(torch.float64)), None, False) is False and len(driver.raw_ex) == 3
    with pytest.raises(ArgumentError, match="expects float32 elements"):
        path.run(cfg, good_args(x=FakeCudaTensor(torch.float64)), None, False)


def test_run_takes_the_generated_cluster_launch_and_keeps_waits_capture_and_fault_naming(blocking_default):
    path, driver = make_path(driver=RawExDriver(sizes(PARAMS)))
    cfg = path.config(8, 64, 0, cluster=(2, 1, 1))
    path.run(cfg, good_args(), None, None)              # top level: waits, after asking about capture
    assert len(driver.raw_ex) == 1 and driver.launches == [] and driver.queries == [0x5000]
    assert driver.syncs == [0x5000]
    driver.capturing = True                             # under torch.cuda.graph: recorded, not waited for
    path.run(cfg, good_args(), None, True)
    assert len(driver.raw_ex) == 2 and driver.syncs == [0x5000]
    driver.capturing = False
    with L.deferred_sync():                             # inside an op or kernellab.bench: no wait, a record
        path.run(cfg, good_args(), None, None)
    assert driver.syncs == [0x5000] and [r.config for r in L.recent_launches()] == [cfg]
    assert L.recent_launches()[0].filename == __file__                 # the line of the code that launched
    path.run(cfg, good_args(n=np.int32(3)), None, False)             # types without a plan: Driver.launch
    assert driver.clusters == [(2, 1, 1)] and len(driver.raw_ex) == 3
    driver.sync_rc = 700                                # a fault found at the wait names the kernel, sticky
    with pytest.raises(LaunchError, match="sticky") as info:
        path.run(cfg, good_args(), None, True)
    assert info.value.sticky and "cluster=(2, 1, 1)" in str(info.value) and not path._lock.locked()


def test_a_failed_cluster_launch_retries_with_its_cluster_for_a_new_thread_else_says_why():
    path, driver = make_path(driver=RawExDriver(sizes(PARAMS), rcs=[201]))
    cfg = path.config(8, 64, 0, cluster=(4, 1, 1))
    path.run(cfg, good_args(), None, False)             # INVALID_CONTEXT: made current, through Driver.launch
    assert driver.made_current == [0] and driver.clusters == [(4, 1, 1)] and driver.raw_ex == []
    driver.rcs = [700]
    with pytest.raises(LaunchError, match="sticky") as info:
        path.run(cfg, good_args(), None, False)
    assert "ILLEGAL_ADDRESS" in info.value.cuda_error and "cluster=(4, 1, 1)" in str(info.value)
    assert driver.clusters == [(4, 1, 1)] and not path._lock.locked()


def test_kernel_cluster_launches_take_the_generated_launch(fake_gpu, monkeypatch):
    from kernellab.run.launch import cudriver

    driver = RawExDriver([8, 8, 8, 4])
    monkeypatch.setattr(cudriver, "driver", lambda: driver)
    k = kernellab.compile_cuda(VADD, arch="sm_90").vadd
    a, b, c = FakeCudaTensor(ptr=0x1000), FakeCudaTensor(ptr=0x2000), FakeCudaTensor(ptr=0x3000)
    for n in (10, 11):
        k[8, 256](a, b, c, n, cluster=(4, 1, 1), sync=False)
    k[8, 256](a, b, c, 12, cluster=8, sync=False)
    assert [(r["grid"], r["attrs"][0][1], r["params"][3]) for r in driver.raw_ex] == [
        ((8, 1, 1), (4, 1, 1), np.int32(10).tobytes()), ((8, 1, 1), (4, 1, 1), np.int32(11).tobytes()),
        ((8, 1, 1), (8, 1, 1), np.int32(12).tobytes())]
    assert driver.launches == [] and driver.raw == []   # no launch of the three took LaunchPath.run's general way
    with pytest.raises(ArgumentError, match="not a whole number of clusters"):
        k[6, 256](a, b, c, 3, cluster=4)
    assert len(driver.raw_ex) == 3


def test_the_generated_cluster_launch_fits_the_ctypes_argtypes_of_the_real_driver(monkeypatch):
    """cuLaunchKernelEx played by libc's strnlen(config, 0) behind libcuda's argtypes: 0 for function handle 0."""
    from kernellab.run.launch import cudriver as D

    lib = _abs_lib()
    strnlen = ctypes.CDLL(None)["strnlen"]
    strnlen.argtypes, strnlen.restype = [ctypes.POINTER(D.CUlaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_void_p], ctypes.c_int
    lib.cuLaunchKernelEx = strnlen
    monkeypatch.setattr(D, "_lib_or_none", lambda: None)
    drv = D.Driver(lib)
    assert drv.launch_kernel_ex is strnlen
    monkeypatch.setattr(L, "torch_stream_function", lambda: (0).__mul__)
    path = L.LaunchPath(0, PARAMS, H200, name="k", signature="k(...)", max_threads_per_block=1024,
                        static_shared_bytes=0, driver=drv)
    fast = path.fast(path.config(8, 64, 0, cluster=(2, 1, 1)), tuple(map(type, good_args())))
    assert fast(good_args(), None, True) is True and fast(good_args(), 0x5000, False) is True


# --- whether a launch waits, and the launches that did not ------------------------------------------------------

@pytest.fixture
def blocking_default():
    """The global launch-blocking setting back at its default (None) around a test, and no recorded launches."""
    old = L.set_launch_blocking(None)
    L.RECENT_LAUNCHES.clear()
    yield
    L.set_launch_blocking(old)
    L.RECENT_LAUNCHES.clear()


@pytest.mark.parametrize("setting, top_level, in_op", [(None, True, False), (True, True, True), (False, False, False)])
def test_the_global_setting_decides_where_the_call_does_not(blocking_default, setting, top_level, in_op):
    path, driver = make_path(driver=RawDriver(sizes(PARAMS)))
    _, fast = fast_for(path, good_args())
    L.set_launch_blocking(setting)
    assert L.resolve_sync(None) is top_level
    with L.deferred_sync():                              # inside an op or kernellab.bench
        assert L.resolve_sync(None) is in_op
    for deferred, waits in ((False, top_level), (True, in_op)):
        before = len(driver.syncs)
        with L.deferred_sync() if deferred else _nothing():
            assert fast(good_args(), None, None) and path.run(path.config(4, 256, 0), good_args()) is None
        assert len(driver.syncs) - before == (2 if waits else 0), (setting, deferred)
    before = len(driver.syncs)
    fast(good_args(), None, True)                        # a call's sync= comes first
    fast(good_args(), None, False)
    assert len(driver.syncs) - before == 1


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def test_the_environment_variable_reads_like_cuda_launch_blocking():
    assert [L._blocking_from_env(v) for v in (None, "", "1", "true", "0", "no")] == [None, None, True, True, False,
                                                                                    False]
    with pytest.raises(ArgumentError, match="KERNELLAB_LAUNCH_BLOCKING='maybe' is not understood; use 1"):
        L._blocking_from_env("maybe")
    with pytest.raises(ArgumentError, match="True, False or None"):
        L.set_launch_blocking("yes")


def test_a_fault_found_at_a_wait_names_the_launches_that_did_not_wait_and_their_lines(blocking_default):
    path, driver = make_path(driver=RawDriver(sizes(PARAMS)))
    _, fast = fast_for(path, good_args())
    fast(good_args(), None, False); line = __import__("inspect").currentframe().f_lineno    # noqa: E702
    path.run(path.config((8, 2), 128, 0), good_args(), sync=False)
    recent = L.recent_launches()
    assert [r.kernel for r in recent] == ["k", "k"] and recent[0].line == line and recent[1].line == line + 1
    assert recent[0].filename == __file__ and recent[0].function.startswith("test_a_fault_found")
    assert recent[1].config.grid == (8, 2, 1)
    driver.sync_rc = 700                                 # the next wait finds the fault
    with pytest.raises(LaunchError) as info:
        fast(good_args(), None, True)
    text = str(info.value)
    assert "Launches that did not wait" in text and f"test_launch_path.py, line {line}" in text
    assert "grid=(8, 2, 1)" in text and "set_launch_blocking(True)" in text
    driver.sync_rc = 0
    fast(good_args(), None, True)                        # a clean wait empties the record
    assert L.recent_launches() == ()


def test_a_configured_launchers_record_names_the_line_that_called_it(fake_gpu, blocking_default, monkeypatch):
    """k[grid, block](...) without waiting, first through Kernel.launch, then through its generated launch (which
    starts the record's frame walk above _Launcher.__call__ and finds the line from the code and offset when read):
    each record names this file, this function and its line."""
    from kernellab.run.launch import cudriver

    raw = RawDriver([8, 8, 8, 4])
    monkeypatch.setattr(cudriver, "driver", lambda: raw)
    monkeypatch.setattr(L, "torch_stream_function", lambda: (0).__mul__)
    k = kernellab.compile_cuda(VADD, arch="sm_90").vadd
    a, b, c = FakeCudaTensor(ptr=0x1000), FakeCudaTensor(ptr=0x2000), FakeCudaTensor(ptr=0x3000)
    launch = k[1, 32]
    lines = []
    for _ in range(3):
        launch(a, b, c, 4, sync=False); lines.append(__import__("inspect").currentframe().f_lineno)   # noqa: E702
    assert launch._fast and len(raw.raw) == 2           # the later calls took the generated launch
    recent = L.recent_launches()
    assert [(r.filename, r.line, r.function) for r in recent] == [
        (__file__, line, "test_a_configured_launchers_record_names_the_line_that_called_it") for line in lines]


def test_a_kernel_of_its_own_may_wait_or_not(fake_gpu, blocking_default):
    k = kernellab.compile_cuda(VADD, arch="sm_90").vadd
    a, b, c = FakeCudaTensor(ptr=0x1000), FakeCudaTensor(ptr=0x2000), FakeCudaTensor(ptr=0x3000)
    k.launch_blocking = False
    k[1, 32](a, b, c, 4)
    assert len(L.recent_launches()) == 1
    k.launch_blocking = True
    with L.deferred_sync():
        k[1, 32](a, b, c, 4)                             # the kernel's own setting comes before the context's
    assert L.recent_launches() == () and len(fake_gpu.syncs) == 1 and len(fake_gpu.launches) == 2
