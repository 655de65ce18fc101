"""CUtensorMap parameters and kernellab.tensor_map without a GPU: the signature (128 bytes, 64-byte aligned, by value),
<cuda.h> under NVRTC, every layout rule as an ArgumentError, the driver call's arguments (stood in: it needs libcuda),
launch-argument checks, the job form (the worker re-encodes the map over its own copy), and cluster shapes.
The encode itself and a real TMA copy run in tests/gpu/test_tma_gpu.py."""
import importlib.util
import pathlib
import re
import sys

import numpy as np
import pytest
from hopper_sources import TMA_COPY

import kernellab
from kernellab.compile.signature import find_kernels, parse_param
from kernellab.errors import ArgumentError, NoGPUError
from kernellab.run.launch import job as J
from kernellab.run.launch import tensor_map as T
from kernellab.run.launch.device import DeviceInfo
from kernellab.run.launch.job import KernelJob
from kernellab.run.launch.launch import LaunchConfig, cluster_dims, make_config, marshal_args
from kernellab.run.launch.tensor_map import TensorMap, tensor_map

H100 = DeviceInfo(index=0, name="Fake H100", arch="sm_90", multiprocessors=132,
                  shared_per_block_optin_bytes=227 * 1024)
FAKE_CUPY = pathlib.Path(__file__).resolve().parent / "fixtures" / "fake_cupy" / "cupy" / "__init__.py"


class DeviceArray:
    """A device array as the CUDA array interface describes one (no GPU needed to look at it)."""

    def __init__(self, shape, typestr="<f4", ptr=0x7F0000000000, strides=None):
        self.shape = tuple(shape)
        self.__cuda_array_interface__ = {"data": (ptr, False), "typestr": typestr, "shape": self.shape,
                                         "strides": strides, "version": 3}


@pytest.fixture
def fake_encoder(monkeypatch):
    """Stand in for the driver's cuTensorMapEncodeTiled (which needs libcuda): record the call, return 128 bytes."""
    calls = []

    def encode_tiled(**kw):
        calls.append(kw)
        return bytes(range(128))

    monkeypatch.setattr(T, "encode_tiled", encode_tiled)
    return calls


@pytest.fixture(scope="module")
def tma():
    return kernellab.compile_cuda(TMA_COPY, arch="sm_90").tma_copy


# --- the parameter ----------------------------------------------------------------------------------------------

def test_cuda_h_compiles_under_nvrtc_and_the_parameter_is_128_bytes_by_value(tma):
    p = tma.params[0]
    assert p.tensor_map and p.grid_constant and p.const and not p.pointer and p.supported
    assert (p.size_bytes, p.align_bytes) == (128, 64)
    assert str(tma.signature) == "tma_copy(const __grid_constant__ CUtensorMap tmap, float* out, int rows, int cols)"
    # the compiler's own layout of the parameter: by value, 128 bytes, 64-byte aligned
    assert re.search(rf"\.param \.align 64 \.b8 {tma.symbol}_param_0\[128\]", tma.ptx)
    assert "UTMALDG" in tma.sass


def test_extern_c_kernel_and_cccl_barrier_agree_on_the_type(tmp_cache):
    src = r"""
#include <cuda/barrier>
#include <cuda.h>
static_assert(sizeof(CUtensorMap) == 128 && alignof(CUtensorMap) == 64, "layout");
extern "C" __global__ void k(int n, const __grid_constant__ CUtensorMap tmap, float* out) { out[0] = n; }
"""
    k = kernellab.compile_cuda(src, arch="sm_90").k
    assert [p.tensor_map for p in k.params] == [False, True, False]
    assert k.params[1].ctype == "const __grid_constant__ CUtensorMap"


def test_parse_param_spellings():
    for text in ("const __grid_constant__ CUtensorMap tmap", "__grid_constant__ const CUtensorMap tmap",
                 "const CUtensorMap_st tmap"):
        p = parse_param(text, 0)
        assert p.tensor_map and p.name == "tmap" and p.size_bytes == 128, text
    assert not parse_param("const CUtensorMap* tmap", 0).tensor_map          # a pointer is not the by-value map


def test_a_map_without_grid_constant_gets_a_note(tmp_cache):
    src = "#include <cuda.h>\n__global__ void k(const CUtensorMap tmap, float* out) { out[0] = 1; }\n"
    m = kernellab.compile_cuda(src, arch="sm_90")
    assert m.k.params[0].tensor_map and not m.k.params[0].grid_constant
    assert any("without __grid_constant__" in n and "const __grid_constant__ CUtensorMap tmap" in n for n in m.notes)


# --- tensor_map: what it passes to the driver -------------------------------------------------------------------

def test_driver_arguments_are_innermost_first_with_byte_strides(fake_encoder):
    x = DeviceArray((4, 100, 64), "<f2", ptr=0x7F0000001000)             # fp16 [B=4, N=100, d=64]
    tm = tensor_map(x, box=(1, 64, 64))
    (kw,) = fake_encoder
    assert kw == {"tensorDataType": "FLOAT16", "tensorRank": 3, "globalAddress": 0x7F0000001000,
                  "globalDim": [64, 100, 4], "globalStrides": [128, 12800], "boxDim": [64, 64, 1],
                  "elementStrides": [1, 1, 1], "interleave": "NONE", "swizzle": "128B", "l2Promotion": "L2_256B",
                  "oobFill": "NONE"}
    assert tm.driver_args() == kw
    assert (tm.shape, tm.dtype, tm.box, tm.strides_bytes) == ((4, 100, 64), "float16", (1, 64, 64), (12800, 128, 2))
    assert tm.box_bytes == 64 * 64 * 2 and tm.contiguous and tm.tensor is x and tm.encoded == bytes(range(128))
    arg = tm.kernel_arg()
    assert arg.shape == (1,) and arg.dtype.itemsize == 128 and arg.tobytes() == bytes(range(128))
    text = str(tm)
    assert "CUtensorMap over float16[4, 100, 64], box [1, 64, 64] (8,192 B per copy)" in text and "swizzle 128B" in text
    assert "<table" in tm._repr_html_()


def test_options_map_to_driver_enums(fake_encoder):
    x = DeviceArray((64, 64), "<u2")                                      # bfloat16 has no NumPy typestr: uint16
    tensor_map(x, (8, 16), swizzle="32B", l2_promotion=None, oob_fill="zero", element_strides=(2, 1))
    tensor_map(DeviceArray((64, 64), "<f4"), (8, 8), swizzle=None, l2_promotion="64B", oob_fill="nan")
    a, b = fake_encoder
    assert (a["tensorDataType"], a["swizzle"], a["l2Promotion"], a["elementStrides"]) == ("UINT16", "32B", "NONE", [1, 2])
    assert (b["tensorDataType"], b["swizzle"], b["l2Promotion"], b["oobFill"]) == ("FLOAT32", "NONE", "L2_64B",
                                                                                   "NAN_REQUEST_ZERO_FMA")
    tm = tensor_map(DeviceArray((64, 64), "<f4"), (8, 8), swizzle="none", element_strides=(2, 1))
    assert tm.box_elements == 4 * 8 and tm.box_bytes == 128       # ceil(box / element stride) per dimension


def test_torch_bfloat16_and_strided_views(fake_encoder):
    torch = pytest.importorskip("torch")
    base = DeviceArray((64, 256), "<u2", strides=(512, 2))
    tm = tensor_map(base, (64, 64))
    assert tm.strides_bytes == (512, 2) and tm.contiguous
    view = DeviceArray((64, 128), "<u2", ptr=0x7F0000000000 + 128, strides=(512, 2))  # columns 64..191 of it
    tv = tensor_map(view, (64, 64))
    assert not tv.contiguous and fake_encoder[-1]["globalStrides"] == [512] and fake_encoder[-1]["globalDim"] == [128, 64]
    with pytest.raises(ArgumentError, match="tensor is on cpu: pass x.cuda"):
        tensor_map(torch.zeros(64, 64, dtype=torch.bfloat16), (64, 64))


# --- tensor_map: each rule the driver checks, as a clear error ---------------------------------------------------

@pytest.mark.parametrize("make, kw, match", [
    (lambda: DeviceArray((64, 64)), dict(box=(64, 300)), r"dimension 1 is 300, outside \[1, 256\]"),
    (lambda: DeviceArray((64, 64)), dict(box=(64,)), r"has 1 entry but the tensor has 2 dimensions"),
    (lambda: DeviceArray((64, 64)), dict(box=(8, 6)), r"24 bytes, not a multiple of 16 bytes; use a multiple of 4"),
    (lambda: DeviceArray((64, 64)), dict(box=(8, 64)), r"256 bytes \(64 float32\), more than the 128B swizzle span: "
                                                       r"with swizzle='128B' at most 32 elements"),
    (lambda: DeviceArray((64, 64)), dict(box=(8, 16), swizzle="32B"), r"at most 8 elements"),
    (lambda: DeviceArray((64, 64), ptr=0x7F0000000004), dict(box=(8, 8)), r"not 16-byte aligned"),
    (lambda: DeviceArray((64, 70)), dict(box=(8, 8)), r"stride 280 bytes of dimension 0 .* multiple of 16 bytes.*"
                                                      r"multiple of 4 float32 elements"),
    (lambda: DeviceArray((64, 64), strides=(256, 8)), dict(box=(8, 8)), r"innermost dimension is not contiguous"),
    (lambda: DeviceArray((2,) * 6), dict(box=(1,) * 6), r"1 to 5 dimensions; the tensor has 6"),
    (lambda: DeviceArray((64, 64), "<c8"), dict(box=(8, 8)), r"cannot hold complex64 elements"),
    (lambda: DeviceArray((64, 64)), dict(box=(8, 8), swizzle="256B"), r"swizzle='256B' is not one of"),
    (lambda: DeviceArray((64, 64), "<i4"), dict(box=(8, 8), oob_fill="nan"), r"oob_fill='nan' needs a floating"),
    (lambda: DeviceArray((64, 64)), dict(box=(8, 8), interleave="16B"), r"needs a tensor of 3 to 5 dimensions"),
    (lambda: DeviceArray((4, 64, 64)), dict(box=(1, 8, 8), interleave="32B", swizzle="64B"), r"needs swizzle='32B'"),
    (lambda: DeviceArray((64, 64)), dict(box=(8, 8), element_strides=(9, 1)), r"element_strides .* outside \[1, 8\]"),
    (lambda: DeviceArray((64, 64)), dict(box="8x8"), r"box must be a tuple of ints"),
    (lambda: np.zeros((64, 64), np.float32), dict(box=(8, 8)), r"this is host memory"),
    (lambda: [1.0, 2.0], dict(box=(8, 8)), r"needs a CUDA torch tensor or a CuPy array, got a list"),
])
def test_layout_rules_are_argument_errors(fake_encoder, make, kw, match):
    with pytest.raises(ArgumentError, match=match):
        tensor_map(make(), **kw)
    assert fake_encoder == []                                     # nothing reached the driver


def test_without_libcuda_the_encode_says_what_is_missing():
    try:
        from cuda.bindings import driver

        driver.cuInit(0)
        pytest.skip("libcuda is present here")
    except RuntimeError:
        pass
    with pytest.raises(NoGPUError, match="needs the CUDA driver \\(libcuda\\)"):
        tensor_map(DeviceArray((64, 64)), (16, 32))


class CudaArray(DeviceArray):
    """A CuPy-like array on GPU `index` (the module name is what _device_tensor looks at)."""

    def __init__(self, index, shape=(64, 64)):
        super().__init__(shape)
        self.dtype, self.strides, self.device = np.dtype(np.float32), (shape[1] * 4, 4), type("D", (), {"id": index})
        self.data = type("P", (), {"ptr": 0x7F0000000000})()


CudaArray.__module__ = "cupy.fake"


@pytest.mark.parametrize("current,tensor,pushed", [
    (None, CudaArray(1), [1]),               # a thread with no context: the tensor's GPU's primary context
    (0xC0, CudaArray(1), [1]),               # a context is current, but the tensor is on GPU 1: push its own
    (None, DeviceArray((64, 64)), [0]),      # GPU unknown (CUDA array interface), none current: GPU 0's
    (0xC0, DeviceArray((64, 64)), []),       # GPU unknown, one current: encode in it
])
def test_the_encode_runs_with_a_current_context(monkeypatch, current, tensor, pushed):
    """cuTensorMapEncodeTiled fails with CUDA_ERROR_INVALID_CONTEXT where no context is current (a fresh process, a
    new thread): kernellab.tensor_map pushes the tensor's GPU's primary context around the call."""
    import contextlib

    from kernellab.run.launch import cudriver

    log = []

    @contextlib.contextmanager
    def pushed_ctx(index):
        log.append(("push", index))
        yield
        log.append(("pop", index))

    monkeypatch.setattr(cudriver, "current_context", lambda: current)
    monkeypatch.setattr(cudriver, "context_on", pushed_ctx)
    monkeypatch.setattr(T, "encode_tiled", lambda **kw: log.append("encode") or bytes(128))
    tensor_map(tensor, (16, 32))
    want = [("push", pushed[0]), "encode", ("pop", pushed[0])] if pushed else ["encode"]
    assert log == want


def test_no_driver_no_context_the_encode_says_why(monkeypatch):
    from kernellab.run.launch import cudriver

    def unavailable(*a):
        raise cudriver.DriverUnavailable("libcuda.so.1 cannot be loaded")

    monkeypatch.setattr(cudriver, "current_context", unavailable)
    monkeypatch.setattr(T, "encode_tiled", lambda **kw: (_ for _ in ()).throw(NoGPUError("needs libcuda")))
    with pytest.raises(NoGPUError, match="needs libcuda"):
        tensor_map(DeviceArray((64, 64)), (16, 32))


# --- launch arguments -------------------------------------------------------------------------------------------

def _map(tensor=None, **over):
    tensor = np.zeros((64, 64), np.float32) if tensor is None else tensor
    fields = dict(tensor=tensor, shape=tuple(tensor.shape), dtype="float32", box=(16, 32),
                  strides_bytes=T.contiguous_strides_bytes(tensor.shape, 4), element_strides=(1, 1),
                  global_address=0x7E0000000000, device=0, encoded=bytes(range(128)))
    fields.update(over)
    return TensorMap(**fields)


def test_marshal_passes_the_128_bytes_by_value(tma):
    values = marshal_args(tma.params, (_map(), DeviceArray((64, 64)), 64, 64), H100, str(tma.signature))
    assert values[0].dtype.itemsize == 128 and values[0].tobytes() == bytes(range(128))
    assert values[1] == np.uint64(0x7F0000000000) and values[2] == np.int32(64)


def test_marshal_errors_say_to_call_tensor_map(tma):
    out = DeviceArray((64, 64))
    with pytest.raises(ArgumentError, match=r"argument 0 \('tmap', const __grid_constant__ CUtensorMap\) takes a "
                                            r"tensor map, but got a .*kernellab.tensor_map\(x, box=\(rows, cols\)\)"):
        marshal_args(tma.params, (out, out, 64, 64), H100)
    with pytest.raises(ArgumentError, match="takes a tensor map \\(kernellab.tensor_map\\(tensor, box\\)\\), got a int"):
        marshal_args(tma.params, (7, out, 64, 64), H100)
    with pytest.raises(ArgumentError, match="got a tensor map, but the parameter is not a CUtensorMap"):
        marshal_args(tma.params, (_map(), _map(), 64, 64), H100)
    with pytest.raises(ArgumentError, match="maps a tensor on GPU 1 but the kernel launches on GPU 0"):
        marshal_args(tma.params, (_map(device=1), out, 64, 64), H100)
    with pytest.raises(ArgumentError, match="holds 0 encoded bytes, not 128"):
        marshal_args(tma.params, (_map(encoded=b""), out, 64, 64), H100)
    (k,) = find_kernels("__global__ void p(const CUtensorMap* tmap) {}")
    with pytest.raises(ArgumentError, match="passed by value, not by pointer"):
        marshal_args(k.params, (_map(),), H100)


# --- another process: the job carries the tensor and how to encode the map ---------------------------------------

def test_job_carries_the_tensor_and_the_encode_parameters(tma):
    x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    out = np.zeros((64, 64), np.float32)
    job = KernelJob.from_launch(tma.image(), (2, 4), 128, (_map(x, swizzle="none"), out, 64, 64), cluster=(2, 1, 1))
    spec = job.args[0]
    assert (spec.kind, spec.dtype, spec.shape, spec.writes) == ("tensor", "float32", (64, 64), True)
    assert np.array_equal(spec.host_array(), x)
    assert spec.tensor_map == {"box": [16, 32], "element_strides": [1, 1], "swizzle": "none", "interleave": "none",
                               "l2_promotion": "256B", "oob_fill": "zero"}
    assert job.cluster == (2, 1, 1)
    assert "tmap: CUtensorMap over float32[64, 64], box [16, 32] (data)" in job.describe()
    back = KernelJob.from_bytes(job.to_bytes())
    assert back.args[0].tensor_map == spec.tensor_map and back.cluster == (2, 1, 1) and back == job
    with pytest.raises(ArgumentError, match="not C-contiguous .* contiguous tensors only so far"):
        KernelJob.from_launch(tma.image(), (2, 4), 128, (_map(x, strides_bytes=(512, 4)), out, 64, 64))
    with pytest.raises(ArgumentError, match="takes a tensor map"):
        KernelJob.from_launch(tma.image(), (2, 4), 128, (x, out, 64, 64))
    with pytest.raises(ArgumentError, match="not a whole number of clusters"):
        KernelJob.from_launch(tma.image(), (3, 4), 128, (_map(x), out, 64, 64), cluster=(2, 1, 1))


def test_worker_encodes_the_map_over_its_own_copy(tma, monkeypatch, fake_encoder):
    spec = importlib.util.spec_from_file_location("cupy", FAKE_CUPY)
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    job = KernelJob.from_launch(tma.image(), (2, 4), 128, (_map(x), np.zeros((64, 64), np.float32), 64, 64))
    arrays, values = J._materialize(job, {})
    (kw,) = fake_encoder
    assert kw["globalAddress"] == arrays[0].data.ptr != 0x7E0000000000   # the worker's copy, not the caller's address
    assert (kw["globalDim"], kw["globalStrides"], kw["boxDim"]) == ([64, 64], [256], [32, 16])
    assert values[0].dtype.itemsize == 128 and values[0].tobytes() == bytes(range(128))
    assert np.array_equal(arrays[0].get(), x)


def test_outputs_come_back_into_the_mapped_tensor():
    from kernellab.run.launch.worker import apply_outputs

    x = np.zeros((4, 8), np.float32)
    job = KernelJob("k", (1, 1, 1), (1, 1, 1), (J.ArgSpec("tensor", "tmap", "float32", (4, 8), tensor_map={}),))
    apply_outputs((_map(x),), job, J.JobResult("ok", outputs=((0, np.ones((4, 8), np.float32).tobytes()),)))
    assert (x == 1).all()


# --- clusters ---------------------------------------------------------------------------------------------------

def test_cluster_shapes_are_checked():
    assert cluster_dims(None, (8, 1, 1)) is None
    assert cluster_dims(2, (8, 1, 1), H100) == (2, 1, 1)
    cfg = make_config((8, 2), 128, 0, max_threads_per_block=1024, static_shared_bytes=0, device=H100, cluster=(2, 2))
    assert cfg.cluster == (2, 2, 1) and "cluster=(2, 2, 1)" in str(cfg)
    assert LaunchConfig((1, 1, 1), (1, 1, 1)).cluster is None
    with pytest.raises(ArgumentError, match="grid x = 7 is not a multiple of 2"):
        cluster_dims((2, 1, 1), (7, 1, 1))
    assert cluster_dims((4, 4, 1), (16, 16, 1), H100) == (4, 4, 1)        # 16: the non-portable size
    with pytest.raises(ArgumentError, match="32 blocks; at most 16 .*8 portable"):
        cluster_dims((8, 4, 1), (16, 16, 1))
    with pytest.raises(ArgumentError, match="need compute capability 9.0"):
        cluster_dims(2, (8, 1, 1), DeviceInfo(0, "Fake A100", "sm_80", 108))
    with pytest.raises(ArgumentError, match="cluster must be an int or a tuple"):
        cluster_dims("2x1", (8, 1, 1))


def test_run_job_launches_a_cluster_through_cuLaunchKernelEx(tma, monkeypatch, fake_encoder):
    """The worker's runner takes the cluster launch (run/launch/cudriver.py's cuLaunchKernelEx, a fake driver here) when
    the job has a cluster, with each value's bytes behind kernelParams: the re-encoded map's 128 first."""
    import ctypes
    import types

    from kernellab.run.launch import cudriver

    spec = importlib.util.spec_from_file_location("cupy", FAKE_CUPY)
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    seen = []

    class Driver:
        def launch(self, function, grid, block, shared_bytes, stream, params, device_index=0, cluster=None):
            p = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
            seen.append((function, grid, block, cluster, stream, ctypes.string_at(p[0], 128),
                         ctypes.string_at(p[2], 4)))

    monkeypatch.setattr(cudriver, "driver", lambda: Driver())
    monkeypatch.setattr(J, "_function", lambda job, state: types.SimpleNamespace(ptr=0xF00))
    x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    job = KernelJob.from_launch(tma.image(), (2, 4), 128, (_map(x), np.zeros((64, 64), np.float32), 64, 64), cluster=2)
    res = J.run_job(job, {}, scan=False)
    assert res.ok, res.message
    ((function, grid, block, cluster, stream, tmap, rows),) = seen
    assert (function, grid, block, cluster) == (0xF00, (2, 4, 1), (128, 1, 1), (2, 1, 1)) and stream != 0
    assert tmap == bytes(range(128)) and rows == np.int32(64).tobytes()


# --- the cache ------------------------------------------------------------------------------------------------

class FakeTorchCuda:
    """What tensor_map reads of a CUDA torch tensor (its module says torch), without a GPU."""

    def __init__(self, shape, ptr=0x7F0000010000, dtype="bfloat16", stride=None):
        import torch

        self.shape, self.dtype, self.ptr = tuple(shape), getattr(torch, dtype), ptr
        self._stride = stride or tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        self.is_cuda, self.device = True, type("Device", (), {"index": 0})()

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return self._stride

    def element_size(self):
        return 2

    def get_device(self):
        return 0


FakeTorchCuda.__module__ = "torch.fake"


def test_a_repeated_map_is_not_encoded_again_and_keeps_its_own_tensor(fake_encoder):
    pytest.importorskip("torch")
    T.tensor_map_cache_clear()
    a, same_memory = FakeTorchCuda((128, 64)), FakeTorchCuda((128, 64))
    first = tensor_map(a, (64, 64))
    again = tensor_map(same_memory, [64, 64])                       # a list box is the same box
    assert len(fake_encoder) == 1
    assert again.encoded == first.encoded and again.tensor is same_memory and first.tensor is a
    assert all(v["tensor"] is None for v in T._MAP_CACHE.values())                 # the cache holds no tensor
    # Anything the 128 bytes depend on makes a new map: address, shape, strides, box, swizzle, dtype.
    tensor_map(FakeTorchCuda((128, 64), ptr=0x7F0000020000), (64, 64))
    tensor_map(FakeTorchCuda((256, 64)), (64, 64))
    tensor_map(FakeTorchCuda((128, 64), stride=(128, 1)), (64, 64))
    tensor_map(a, (32, 64))
    tensor_map(a, (64, 32), swizzle="64B")
    tensor_map(FakeTorchCuda((128, 64), dtype="float16"), (64, 64))
    assert len(fake_encoder) == 7
    with pytest.raises(ArgumentError, match="at most 32 elements"):   # a failed check is not cached
        tensor_map(a, (64, 64), swizzle="64B")
    with pytest.raises(ArgumentError, match="at most 32 elements"):
        tensor_map(a, (64, 64), swizzle="64B")
    T.tensor_map_cache_clear()
    tensor_map(a, (64, 64))
    assert len(fake_encoder) == 8


def test_a_loop_over_hundreds_of_input_sets_encodes_each_map_once(fake_encoder):
    """A benchmark or model that cycles through a few hundred (q, k, v) address sets keeps every map cached: 134 sets
    of three maps (benchmarks/attention.py's grid at small shapes) re-encoded every call under a 256-entry cache."""
    pytest.importorskip("torch")
    T.tensor_map_cache_clear()
    tensors = [FakeTorchCuda((128, 64), ptr=0x7F0000000000 + 0x10000 * i) for i in range(3 * 134)]
    for _ in range(2):
        for t in tensors:
            tensor_map(t, (64, 64))
    assert len(fake_encoder) == len(tensors)
    T.tensor_map_cache_clear()


@pytest.fixture
def fake_replace(monkeypatch):
    """Stand in for the driver's cuTensorMapReplaceAddress: the template's bytes with the new address in the first 8."""
    from kernellab.run.launch import cudriver

    calls = []

    def replace(encoded, address):
        calls.append((encoded, address))
        return int(address).to_bytes(8, "little") + encoded[8:]

    monkeypatch.setattr(cudriver, "replace_tensor_map_address", replace)
    return calls


def test_a_known_layout_at_a_new_address_replaces_the_address_instead_of_encoding(fake_encoder, fake_replace):
    """A training step's fresh tensors (same shapes, new addresses) get their maps by the driver's address
    replacement from the layout's newest map: no encode, the map's fields are the layout's with the new address,
    and the result is cached under its own address."""
    pytest.importorskip("torch")
    T.tensor_map_cache_clear()
    first = tensor_map(FakeTorchCuda((128, 64), ptr=0x7F0000010000), (64, 64))
    moved = FakeTorchCuda((128, 64), ptr=0x7F0000090000)
    second = tensor_map(moved, (64, 64))
    assert len(fake_encoder) == 1 and len(fake_replace) == 1
    assert fake_replace[0] == (first.encoded, 0x7F0000090000)
    assert second.encoded == (0x7F0000090000).to_bytes(8, "little") + first.encoded[8:]
    assert second.global_address == 0x7F0000090000 and second.tensor is moved
    assert (second.shape, second.box, second.strides_bytes, second.swizzle) == (
        first.shape, first.box, first.strides_bytes, first.swizzle)
    assert first.global_address == 0x7F0000010000                   # the template map is not changed
    assert tensor_map(moved, (64, 64)).encoded == second.encoded and len(fake_replace) == 1   # cached now
    # Another layout (box, shape, dtype, swizzle) is encoded in full.
    tensor_map(FakeTorchCuda((128, 64), ptr=0x7F00000A0000), (32, 64))
    tensor_map(FakeTorchCuda((256, 64), ptr=0x7F00000B0000), (64, 64))
    tensor_map(FakeTorchCuda((128, 64), ptr=0x7F00000C0000, dtype="float16"), (64, 64))
    assert len(fake_encoder) == 4 and len(fake_replace) == 1
    T.tensor_map_cache_clear()


def test_an_address_the_layout_cannot_take_gets_the_full_checks(fake_encoder, fake_replace):
    """A misaligned address of a known layout is not replaced: the full path's alignment error says why."""
    pytest.importorskip("torch")
    T.tensor_map_cache_clear()
    tensor_map(FakeTorchCuda((128, 64), ptr=0x7F0000010000), (64, 64))
    with pytest.raises(ArgumentError, match="not 16-byte aligned"):
        tensor_map(FakeTorchCuda((128, 64), ptr=0x7F0000010008), (64, 64))
    assert fake_replace == []
    T.tensor_map_cache_clear()


def test_where_the_driver_cannot_replace_the_map_is_encoded(fake_encoder, monkeypatch):
    """No libcuda, an old driver or a driver error on replacement: the full encode, as before."""
    pytest.importorskip("torch")
    from kernellab.run.launch import cudriver

    for error in (cudriver.DriverUnavailable("no cuTensorMapReplaceAddress"), cudriver.CudaDriverError(1)):
        def fail(encoded, address, error=error):
            raise error

        monkeypatch.setattr(cudriver, "replace_tensor_map_address", fail)
        T.tensor_map_cache_clear()
        fake_encoder.clear()
        tensor_map(FakeTorchCuda((128, 64), ptr=0x7F0000010000), (64, 64))
        made = tensor_map(FakeTorchCuda((128, 64), ptr=0x7F0000020000), (64, 64))
        assert len(fake_encoder) == 2 and made.global_address == 0x7F0000020000
        assert fake_encoder[1]["globalAddress"] == 0x7F0000020000
    T.tensor_map_cache_clear()


def test_without_a_current_context_the_replacement_is_retried_in_the_tensors_gpus_context(monkeypatch):
    """cuTensorMapReplaceAddress answering CUDA_ERROR_INVALID_CONTEXT (a thread without a context) is retried with
    the GPU's primary context pushed."""
    import contextlib

    from kernellab.run.launch import cudriver

    log = []

    def replace(encoded, address):
        log.append("replace")
        if "push" not in log:
            raise cudriver.CudaDriverError(cudriver.CUDA_ERROR_INVALID_CONTEXT)
        return encoded

    @contextlib.contextmanager
    def pushed_ctx(index):
        log.append("push")
        yield

    monkeypatch.setattr(cudriver, "replace_tensor_map_address", replace)
    monkeypatch.setattr(cudriver, "context_on", pushed_ctx)
    monkeypatch.setattr(cudriver, "current_context", lambda: None)
    assert T.replace_address(bytes(128), 0x7F0000020000, 3) == bytes(128)
    assert log == ["replace", "push", "replace"]


def test_the_driver_call_gets_a_64_byte_aligned_copy_and_leaves_the_template_alone(monkeypatch):
    """cudriver.replace_tensor_map_address hands the driver a 64-byte-aligned copy of the map (a CUtensorMap's
    alignment) and returns the bytes the driver wrote there."""
    import ctypes

    from kernellab.run.launch import cudriver

    seen = []

    def fake_fn(map_address, address):
        seen.append(map_address % 64)
        ctypes.memmove(map_address, int(address).to_bytes(8, "little"), 8)
        return 0

    monkeypatch.setattr(cudriver, "_replace_address_fn", lambda: fake_fn)
    template = bytes(range(128))
    out = cudriver.replace_tensor_map_address(template, 0x1122334455667700)
    assert seen == [0] and out == (0x1122334455667700).to_bytes(8, "little") + template[8:]
    assert template == bytes(range(128))
    monkeypatch.setattr(cudriver, "_replace_address_fn", lambda: lambda m, a: 1)
    with pytest.raises(cudriver.CudaDriverError):
        cudriver.replace_tensor_map_address(template, 0x1000)


def test_a_full_cache_drops_its_oldest_map(fake_encoder, fake_replace, monkeypatch):
    """At MAP_CACHE_SIZE entries the oldest map goes (its address is then replaced again); the newest stay."""
    pytest.importorskip("torch")
    monkeypatch.setattr(T, "MAP_CACHE_SIZE", 3)
    T.tensor_map_cache_clear()
    tensors = [FakeTorchCuda((128, 64), ptr=0x7F0000000000 + 0x10000 * i) for i in range(4)]
    for t in tensors:
        tensor_map(t, (64, 64))
    assert len(T._MAP_CACHE) == 3 and (len(fake_encoder), len(fake_replace)) == (1, 3)
    tensor_map(tensors[3], (64, 64))                                # the newest: a hit
    assert len(fake_replace) == 3
    tensor_map(tensors[0], (64, 64))                                # the oldest was dropped: made again
    assert len(fake_replace) == 4 and len(T._MAP_CACHE) == 3
    T.tensor_map_cache_clear()
