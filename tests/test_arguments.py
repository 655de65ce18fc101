"""Argument and launch-configuration checks against the C signature, with fake devices and fake tensors (no GPU)."""
import numpy as np
import pytest

from kernellab.compile.signature import find_kernels
from kernellab.errors import ArgumentError
from kernellab.run.launch.device import DeviceInfo
from kernellab.run.launch.launch import make_config, marshal_args

H200 = DeviceInfo(index=0, name="Fake H200", arch="sm_90", multiprocessors=132,
                  shared_per_block_optin_bytes=227 * 1024, shared_per_sm_bytes=228 * 1024)

SRC = r"""
#include <cuda_fp16.h>
extern "C" __global__ void k(const float* __restrict__ x, __half* h, float4* v, int n, float alpha, double beta,
                             unsigned char u, long long big, void* raw, __nv_bfloat16 bf) {}
"""
PARAMS = find_kernels(SRC)[0].params


class FakeTensor:
    """Duck-types the parts of torch.Tensor that argument checking reads."""

    __module__ = "torch"

    def __init__(self, dtype="float32", cuda=True, index=0, contiguous=True, ptr=0x7F0000000000, numel=64, dim=1):
        self.dtype = f"torch.{dtype}"
        self.is_cuda = cuda
        self.device = type("D", (), {"index": index if cuda else None, "__str__": lambda s: f"cuda:{index}" if cuda else "cpu"})()
        self._contig, self._ptr, self._numel, self._dim = contiguous, ptr, numel, dim
        self.shape = (numel,)

    def is_contiguous(self):
        return self._contig

    def data_ptr(self):
        return self._ptr

    def numel(self):
        return self._numel

    def element_size(self):
        return {"float32": 4, "float16": 2, "float64": 8, "int32": 4, "bfloat16": 2}.get(self.dtype[6:], 4)

    def dim(self):
        return self._dim


FakeTensor.__module__ = "torch.fake"


def good_args(**over):
    args = dict(x=FakeTensor(), h=FakeTensor("float16"), v=FakeTensor(numel=64), n=10, alpha=0.5, beta=2,
                u=255, big=2**40, raw=FakeTensor("int32"), bf=1.5)
    args.update(over)
    return tuple(args.values())


def test_good_arguments_marshal_to_exact_widths():
    vals = marshal_args(PARAMS, good_args(), H200)
    assert [type(v) for v in vals] == [np.uint64, np.uint64, np.uint64, np.int32, np.float32, np.float64, np.uint8,
                                       np.int64, np.uint64, np.uint16]
    assert vals[0] == 0x7F0000000000
    assert vals[-1] == 0x3FC0  # 1.5 in bfloat16


@pytest.mark.parametrize("field,value,match", [
    ("x", FakeTensor("float16"), r"argument 0 \('x'.*expects float32 elements but got a torch tensor \(dtype float16"),
    ("x", FakeTensor(cuda=False), r"'x'.*on cpu; the kernel needs GPU memory"),
    ("x", FakeTensor(index=1), r"'x'.*cuda:1 but the kernel launches on cuda:0"),
    ("x", FakeTensor(contiguous=False), r"'x'.*non-contiguous.*contiguous\(\)"),
    ("x", np.zeros(4, np.float32), r"'x'.*NumPy array.*device memory"),
    ("x", 5, r"'x'.*pointer parameter but got a int"),
    ("n", FakeTensor(), r"'n'.*scalar parameter but got a torch tensor"),
    ("n", 2.5, r"'n'.*integer parameter but got the float 2.5"),
    ("n", 2**31, r"'n'.*int32: 2147483648 is outside"),
    ("u", -1, r"'u'.*uint8: -1 is outside"),
    ("alpha", "0.5", r"'alpha'.*expects a number"),
    ("v", FakeTensor(ptr=0x7F0000000004), r"'v'.*16-byte aligned"),
    ("v", FakeTensor(numel=63), r"'v'.*63 elements, not a multiple of 4"),
])
def test_each_bad_argument_names_itself(field, value, match):
    with pytest.raises(ArgumentError, match=match):
        marshal_args(PARAMS, good_args(**{field: value}), H200)


def test_argument_count():
    with pytest.raises(ArgumentError, match="takes 10 arguments, got 9"):
        marshal_args(PARAMS, good_args()[:-1], H200, "k(...)")


def test_void_pointer_takes_any_dtype_and_none_is_null():
    vals = marshal_args(PARAMS, good_args(raw=None), H200)
    assert vals[8] == 0


def test_integral_float_and_numpy_scalars_are_accepted():
    vals = marshal_args(PARAMS, good_args(n=np.int64(7), alpha=np.float64(0.25), beta=3.0), H200)
    assert vals[3] == 7 and vals[4] == np.float32(0.25)


def test_launch_config_checks():
    cfg = make_config(10, (16, 16), 0, max_threads_per_block=1024, static_shared_bytes=0, device=H200)
    assert cfg.grid == (10, 1, 1) and cfg.block == (16, 16, 1)
    with pytest.raises(ArgumentError, match="513 threads, more than this kernel's max_threads_per_block = 512"):
        make_config(1, 513, 0, max_threads_per_block=512, static_shared_bytes=0, device=H200)
    with pytest.raises(ArgumentError, match="block dimension z = 65 exceeds the device limit 64"):
        make_config(1, (1, 1, 65), 0, max_threads_per_block=1024, static_shared_bytes=0, device=H200)
    with pytest.raises(ArgumentError, match="grid dimension y = 70000"):
        make_config((1, 70000), 32, 0, max_threads_per_block=1024, static_shared_bytes=0, device=H200)
    with pytest.raises(ArgumentError, match="per-block limit of 232448 bytes.*at most 228352 dynamic bytes"):
        make_config(1, 32, 230000, max_threads_per_block=1024, static_shared_bytes=4096, device=H200)
    with pytest.raises(ArgumentError, match="below 1"):
        make_config(0, 32, 0, max_threads_per_block=1024, static_shared_bytes=0, device=H200)
    with pytest.raises(ArgumentError, match="int or a tuple"):
        make_config(1.5, 32, 0, max_threads_per_block=1024, static_shared_bytes=0, device=H200)


def test_launch_without_gpu_says_so(tmp_cache):
    import kernellab

    if kernellab.has_gpu():
        pytest.skip("a GPU is present")
    m = kernellab.compile_cuda('extern "C" __global__ void k(float* x) {}', arch="sm_90")
    with pytest.raises(kernellab.NoGPUError, match="launching k needs a CUDA GPU.*Compiling, resources"):
        m.k[1, 32](None)
    with pytest.raises(kernellab.ArgumentError, match=r"k\[grid, block\]"):
        m.k[1](None)


def test_a_torch_stream_reaches_cupy_without_the_deprecated_external_stream():
    """CuPy 14 deprecates ExternalStream (its warning filled the GPU logs); torch's stream handle goes through
    Stream.from_external and the CUDA stream protocol, with no warning."""
    import warnings

    cupy = pytest.importorskip("cupy")
    from kernellab.run.launch.launch import external_stream

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream = external_stream(0x1234)
    assert isinstance(stream, cupy.cuda.Stream) and stream.ptr == 0x1234
