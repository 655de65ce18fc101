"""KernelJob and ArgSpec without a GPU: building a job from a compiled kernel, its byte and file forms, fills, the CLI.

Running a job needs a GPU (tests/gpu/test_faults_gpu.py, tests/gpu/test_tools_gpu.py); everything before the launch
is checked here: argument specs for NumPy and CPU torch data (bfloat16 included), scalars of exact C types, the
image or the recompile from source through the compile cache, and the error paths. `run_job` itself runs on a
stand-in cupy that keeps CUDA's stream-ordering rules (tests/fixtures/fake_cupy), and `lend` (CUDA IPC or a copy,
and why) with the driver calls stood in. Staging: which tensors from_launch stages (once per distinct tensor), the
worker's `stage_buffers` (plain cudaMalloc per slot, regrown, freed) and run_job on staged arguments.
"""
import importlib.util
import json
import os
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest

import kernellab
from kernellab.errors import ArgumentError, KernellabError
from kernellab.run.launch import job as J
from kernellab.run.launch.job import (ArgSpec, JobResult, KernelJob, JOB_MAGIC, job_image, lend, nonfinite_note,
                                      run_job, scalar_value, storage_dtype, tensor_spec)

FAKE_CUPY = pathlib.Path(__file__).resolve().parent / "fixtures" / "fake_cupy" / "cupy" / "__init__.py"

SRC = r"""#include <cuda_bf16.h>
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
__global__ void scale(__nv_bfloat16* x, __nv_bfloat16 s, double alpha, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] = __float2bfloat16(__bfloat162float(x[i]) * __bfloat162float(s) * (float)alpha);
}
"""


@pytest.fixture(scope="module")
def mod():
    return kernellab.compile_cuda(SRC, arch="sm_90", options=("--use_fast_math",), first_line=2, filename="cell.cu")


def test_kernel_job_is_the_checked_launch_as_one_value(mod, monkeypatch):
    """Kernel.job checks the launch (Kernel.check_launch: config and arguments), then builds the KernelJob from the
    kernel's KernelImage: shared_bytes and the cluster come from the checked config, the device from the GPU."""
    import dataclasses
    import pickle

    from kernellab.kernel import Kernel
    from kernellab.run.launch import worker
    from kernellab.run.launch.device import DeviceInfo
    from kernellab.run.launch.launch import make_config

    dev = DeviceInfo(3, "Fake GPU", "sm_90", 132)
    checked = []

    def check_launch(kernel, grid, block, args, shared_bytes=0, cluster=None):
        checked.append((grid, block, shared_bytes))
        kernel.check_args(*args)                          # the argument checks, CPU arrays standing in
        return make_config(grid, block, shared_bytes, max_threads_per_block=1024, static_shared_bytes=0,
                           device=dev), dev

    monkeypatch.setattr(Kernel, "check_launch", check_launch)
    monkeypatch.setattr(worker, "sync_caller", lambda: None)
    a = np.ones(64, np.float32)
    job = mod.vadd.job(2, 32, a, a, np.zeros_like(a), 64, shared_bytes=128)
    assert checked == [(2, 32, 128)]
    assert (job.grid, job.block, job.shared_bytes, job.device) == ((2, 1, 1), (32, 1, 1), 128, 3)
    image = mod.vadd.image()
    assert dataclasses.is_dataclass(image) and pickle.loads(pickle.dumps(image)) == image
    assert job == KernelJob.from_launch(image, 2, 32, (a, a, np.zeros_like(a), 64), 128, device=3)
    assert KernelJob.from_bytes(job.to_bytes()).shared_bytes == 128
    with pytest.raises(ArgumentError):
        mod.vadd.job(2, 32, a, a, a)                                 # the argument checks run before any job


def test_from_launch_records_source_image_and_arguments(mod):
    a = np.arange(1000, dtype=np.float32)
    b = np.ones(1000, dtype=np.float32)
    c = np.zeros(1000, dtype=np.float32)
    job = KernelJob.from_launch(mod.vadd.image(), (1000 + 255) // 256, 256, (a, b, c, 1000))
    assert job.symbol == "vadd" and job.name == "vadd" and job.backend == "cuda"
    assert job.grid == (4, 1, 1) and job.block == (256, 1, 1) and job.shared_bytes == 0
    assert job.source == SRC and job.first_line == 2 and job.filename == "cell.cu"
    assert job.options == ("--use_fast_math",) and job.arch == "sm_90"
    assert job.image == mod.cubin and job.image_format == "cubin"
    a_spec, b_spec, c_spec, n_spec = job.args
    assert (a_spec.kind, a_spec.name, a_spec.dtype, a_spec.shape, a_spec.writes) == ("tensor", "a", "float32", (1000,),
                                                                                       False)
    assert c_spec.writes and not b_spec.writes                          # const pointers do not come back
    assert np.array_equal(a_spec.host_array(), a)
    assert (n_spec.kind, n_spec.dtype, n_spec.value) == ("scalar", "int32", 1000)
    assert scalar_value(n_spec).dtype == np.int32
    assert "vadd[(4, 1, 1), (256, 1, 1)](a: float32[1000] (data)" in job.describe()
    assert job.line(5) == "    if (i < n) c[i] = a[i] + b[i];"        # cell line 5 (the %%cuda line is 1)


def test_bfloat16_and_exact_scalars_round_trip(mod):
    torch = pytest.importorskip("torch")
    x = torch.tensor([1.5, -2.0, 3.25, float("nan")], dtype=torch.bfloat16)
    job = KernelJob.from_launch(mod.scale.image(), 1, 32, (x, 0.5, 2.0, 4))
    spec, s, alpha, n = job.args
    assert spec.dtype == "bfloat16" and spec.data == x.view(torch.int16).numpy().tobytes()
    assert storage_dtype("bfloat16") == np.uint16
    assert (s.dtype, s.value) == ("bfloat16", 0x3F00)                  # 0.5 as its bfloat16 bits
    assert scalar_value(s) == np.uint16(0x3F00) and scalar_value(alpha).dtype == np.float64
    assert (n.dtype, n.value) == ("int64", 4) and scalar_value(n).dtype == np.int64
    back = KernelJob.from_bytes(job.to_bytes())
    assert back == job
    bits = back.args[0].host_array()
    assert torch.equal(torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16)[:3], x[:3])


def test_bytes_and_file_forms(mod, tmp_path):
    a = np.random.default_rng(0).standard_normal(77).astype(np.float32)
    job = KernelJob.from_launch(mod.vadd.image(), 1, 128, (a, a, np.zeros_like(a), 77), shared_bytes=0)
    raw = job.to_bytes()
    assert raw.startswith(JOB_MAGIC)
    (n,) = struct.unpack_from("<Q", raw, len(JOB_MAGIC))
    head = json.loads(raw[len(JOB_MAGIC) + 8:len(JOB_MAGIC) + 8 + n])
    assert head["symbol"] == "vadd" and head["args"][3]["value"] == 77   # the header is plain JSON
    assert KernelJob.from_bytes(raw) == job
    path = job.save(tmp_path / "vadd.kljob")
    assert KernelJob.load(path) == job
    with pytest.raises(KernellabError, match="not a kernellab kernel job"):
        KernelJob.from_bytes(b"PK\x03\x04" + raw)
    with pytest.raises(KernellabError, match="truncated"):
        KernelJob.from_bytes(raw[:-3])


def test_shapes_only_job_keeps_scalars_and_zero_fills(mod):
    a = np.ones(10, dtype=np.float32)
    job = KernelJob.from_launch(mod.vadd.image(), 1, 32, (a, a, a, 10), data="shapes")
    assert all(s.data is None and s.fill == "zeros" for s in job.args[:3])
    assert job.args[3].value == 10
    assert np.array_equal(job.args[0].host_array(), np.zeros(10, np.float32))
    assert len(job.to_bytes()) < len(KernelJob.from_launch(mod.vadd.image(), 1, 32, (a, a, a, 10)).to_bytes())


def test_fills_are_reproducible_and_typed():
    spec = ArgSpec("tensor", "x", "float32", (4, 8), fill="randn", seed=3)
    assert np.array_equal(spec.host_array(), spec.host_array())
    assert spec.host_array().shape == (4, 8) and spec.host_array().dtype == np.float32
    assert np.array_equal(ArgSpec("tensor", "i", "int32", (5,), fill="arange").host_array(), np.arange(5, dtype=np.int32))
    full = ArgSpec("tensor", "h", "bfloat16", (3,), fill="full", fill_value=1.0).host_array()
    assert full.dtype == np.uint16 and list(full) == [0x3F80] * 3        # 1.0 in bfloat16
    with pytest.raises(KernellabError, match="unknown fill"):
        ArgSpec("tensor", "x", "float32", (2,), fill="gaussian").host_array()
    with pytest.raises(KernellabError, match="bytes of data"):
        ArgSpec("tensor", "x", "float32", (4,), data=b"\0" * 12).host_array()


def test_argument_errors_name_the_parameter(mod):
    a = np.ones(10, dtype=np.float32)
    with pytest.raises(ArgumentError, match="takes 4 arguments, got 3"):
        KernelJob.from_launch(mod.vadd.image(), 1, 32, (a, a, a))
    with pytest.raises(ArgumentError, match=r"argument 1 \('b'.*expects float32 elements but got float64"):
        KernelJob.from_launch(mod.vadd.image(), 1, 32, (a, a.astype(np.float64), a, 10))
    with pytest.raises(ArgumentError, match=r"argument 3 \('n'.*integer parameter but got the float 2.5"):
        KernelJob.from_launch(mod.vadd.image(), 1, 32, (a, a, a, 2.5))
    with pytest.raises(ArgumentError, match="pointer parameter but got a list"):
        KernelJob.from_launch(mod.vadd.image(), 1, 32, ([1.0], a, a, 10))
    with pytest.raises(ArgumentError, match="grid"):
        KernelJob.from_launch(mod.vadd.image(), 0, 32, (a, a, a, 10))


def test_null_pointer_and_with_data():
    job = KernelJob("k", (1, 1, 1), (32, 1, 1), (ArgSpec("null", "p"),
                                                 ArgSpec("tensor", "x", "float32", (8,), ipc_handle=b"\1" * 64,
                                                         ipc_offset=256)))
    assert KernelJob.from_bytes(job.to_bytes()) == job
    plain = job.with_data()
    assert plain.args[1].ipc_handle is None and plain.args[1].fill == "zeros" and not plain.args[1].shared
    assert plain.args[0] == job.args[0]


def test_job_without_image_compiles_from_source_through_the_cache(mod, tmp_cache):
    a = np.ones(4, dtype=np.float32)
    job = KernelJob.from_launch(mod.vadd.image(), 1, 32, (a, a, a, 4))
    cubin, fmt = job_image(job)
    assert (cubin, fmt) == (mod.cubin, "cubin")
    from dataclasses import replace

    rebuilt, fmt = job_image(replace(job, image=None, image_format=None))
    assert fmt == "cubin" and rebuilt[:4] == b"\x7fELF"
    again, _ = job_image(replace(job, image=None, image_format=None))
    assert again == rebuilt                                            # the second compile is a cache hit
    with pytest.raises(KernellabError, match="no compiled image"):
        job_image(replace(job, image=None, source=""))


def test_tensor_spec_and_nonfinite_note():
    x = np.array([[1.0, np.nan], [np.inf, 2.0]], dtype=np.float32)
    spec = tensor_spec(x, "c")
    note = nonfinite_note(spec, x, np)
    assert note == "c (float32[2, 2]) holds 1 NaN and 1 Inf of 4 elements after the launch, the first at index 0, 1"
    assert nonfinite_note(spec, np.zeros((2, 2), np.float32), np) is None
    bits = np.array([0x3F80, 0x7FC0, 0xFF80], dtype=np.uint16)       # 1.0, NaN, -Inf in bfloat16
    bf = ArgSpec("tensor", "y", "bfloat16", (3,))
    assert nonfinite_note(bf, bits, np) == "y (bfloat16[3]) holds 1 NaN and 1 Inf of 3 elements after the launch, " \
                                           "the first at index 1"


def test_result_round_trip():
    r = JobResult("ok", outputs=((2, b"\1\2\3\4"), (5, b"")), kernel_ms=0.25, notes=("n",), stdout="hi\n", pid=42,
                  device="H200")
    back = JobResult.from_bytes(r.to_bytes())
    assert back == r and back.output(2) == b"\1\2\3\4" and back.output(3) is None and back.ok
    with pytest.raises(KernellabError, match="not a kernellab job result"):
        JobResult.from_bytes(KernelJob("k", (1, 1, 1), (1, 1, 1), ()).to_bytes())


def test_cli_reports_a_missing_gpu_in_its_result(mod, tmp_path):
    a = np.ones(4, dtype=np.float32)
    path = KernelJob.from_launch(mod.vadd.image(), 1, 32, (a, a, a, 4)).save(tmp_path / "j.kljob")
    out = tmp_path / "r.klres"
    proc = subprocess.run([sys.executable, "-m", "kernellab.run.launch.job", path, "--out", str(out)], capture_output=True,
                          text=True, timeout=120)
    if kernellab.has_gpu():
        pytest.skip("this machine has a GPU: the job ran (tests/gpu covers that)")
    assert proc.returncode == 1, proc.stderr
    res = JobResult.from_bytes(out.read_bytes())
    assert res.status == "error" and res.message and "vadd" in proc.stderr
    bad = subprocess.run([sys.executable, "-m", "kernellab.run.launch.job", str(tmp_path / "missing")], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "cannot read" in bad.stderr


# --- run_job on a stand-in GPU that keeps CUDA's stream-ordering rules ------------------------------------------


@pytest.fixture
def stand_in_cupy(monkeypatch):
    """tests/fixtures/fake_cupy as `cupy` for this test: uploads land late unless the launch's stream waits for them."""
    spec = importlib.util.spec_from_file_location("cupy", FAKE_CUPY)
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def test_run_job_uploads_launches_and_scans_on_one_stream(mod, stand_in_cupy):
    a, c = np.full(64, np.inf, dtype=np.float32), np.zeros(64, dtype=np.float32)
    state: dict = {}
    res = run_job(KernelJob.from_launch(mod.vadd.image(), 1, 64, (a, -a, c, 64)), state)   # inf + -inf = NaN
    assert res.ok, res.message
    assert res.notes == ("c (float32[64]) holds 64 NaN of 64 elements after the launch, the first at index 0",)
    assert np.isnan(np.frombuffer(res.output(2), np.float32)).all()
    assert res.output(0) is None and res.output(1) is None                   # const inputs do not come back
    x = np.arange(64, dtype=np.float32)
    again = run_job(KernelJob.from_launch(mod.vadd.image(), 1, 64, (x, x, c, 64)), state)  # the same stream, warm
    assert again.ok and again.notes == () and np.array_equal(np.frombuffer(again.output(2), np.float32), 2 * x)
    assert {e[-1] for e in stand_in_cupy.log} == {"stream"}                 # nothing on the legacy default stream
    assert [e[0] for e in stand_in_cupy.log][:4] == ["copy", "copy", "copy", "kernel"]


def test_stand_in_reproduces_uploads_racing_a_non_blocking_stream(mod, stand_in_cupy):
    """What run_job did before: uploads on the (legacy) current stream, the launch on a non-blocking one."""
    cupy = stand_in_cupy
    a, c = np.full(64, np.inf, dtype=np.float32), np.zeros(64, dtype=np.float32)
    job = KernelJob.from_launch(mod.vadd.image(), 1, 64, (a, -a, c, 64))
    arrays, values = J._materialize(job, {})                                 # no stream: the current one
    stream = cupy.cuda.Stream(non_blocking=True)
    J._function(job, {})(job.grid, job.block, tuple(values), shared_mem=0, stream=stream)
    stream.synchronize()
    assert nonfinite_note(job.args[2], arrays[2], cupy) is None              # the kernel read stale inputs
    assert not np.isnan(arrays[2].get()).any()                               # and c's upload landed after it


# --- lending CUDA tensors (CUDA IPC) or copying them, and saying why ---------------------------------------------


class CudaArray:
    """A device array as the CUDA array interface describes one (no GPU needed to look at it)."""

    def __init__(self, ptr: int, n: int):
        self.shape = (n,)
        self.__cuda_array_interface__ = {"data": (ptr, False), "typestr": "<f4", "shape": (n,), "version": 3}


def test_lend_shares_a_whole_allocation_and_says_why_not_otherwise(monkeypatch):
    mib = 1 << 20
    ranges = {}
    monkeypatch.setattr(J, "_address_range", lambda ptr: ranges[ptr])
    monkeypatch.setattr(J, "_ipc_get_handle", lambda base: b"H" * 64)
    whole = CudaArray(0x10000000, 16 * mib // 4)                            # 16 MiB in its own 16 MiB allocation
    ranges[0x10000000] = (0x10000000, 16 * mib)
    assert lend(whole) == (b"H" * 64, 0) and J.ipc_export(whole) == (b"H" * 64, 0)
    rounded = CudaArray(0x20000000, (16 * mib - 4096) // 4)                  # rounded up a little: still its own
    ranges[0x20000000] = (0x20000000, 16 * mib)
    assert lend(rounded) == (b"H" * 64, 0)
    inner = CudaArray(0x30000000 + 4 * mib, mib)                             # a block inside a 20 MiB segment
    ranges[0x30000000 + 4 * mib] = (0x30000000, 20 * mib)
    assert lend(inner) == ("it starts 4.0 MiB into a 20.0 MiB allocation that holds other data (a view, or a block "
                           "carved from a caching allocator's segment); lending it would let the worker's kernel "
                           "reach that data") and J.ipc_export(inner) is None
    head = CudaArray(0x40000000, mib)                                        # 4 MiB at the start of 20 MiB
    ranges[0x40000000] = (0x40000000, 20 * mib)
    assert lend(head) == ("its allocation is 20.0 MiB for 4.0 MiB of data (a caching allocator's segment shared "
                          "with other tensors); lending it would let the worker's kernel reach them")
    pieces = CudaArray(0x50000000, 16 * mib)                                 # 64 MiB mapped in 20 MiB pieces
    ranges[0x50000000] = (0x50000000, 20 * mib)
    assert "span more than one allocation" in lend(pieces) and "expandable_segments" in lend(pieces)
    assert lend(CudaArray(0x60000000, 4)).startswith("cuMemGetAddressRange failed on its address (KeyError")
    assert lend(np.zeros(4, np.float32)) == "it is host memory"
    assert lend(whole, disabled="IPC is off") == "IPC is off"

    def refuse(base):
        raise RuntimeError("cudaErrorInvalidValue: invalid argument")

    monkeypatch.setattr(J, "_ipc_get_handle", refuse)
    assert lend(whole).startswith("cudaIpcGetMemHandle failed (RuntimeError: cudaErrorInvalidValue: invalid "
                                  "argument); memory from cudaMallocAsync pools or VMM")


def test_from_launch_records_why_each_large_tensor_is_copied(mod, monkeypatch):
    big = np.zeros(1 << 18, dtype=np.float32)                                 # 1 MiB
    small = np.zeros(4, dtype=np.float32)
    why: dict = {}
    job = KernelJob.from_launch(mod.vadd.image(), 1, 32, (big, small, big, 4), data="share", share_min_bytes=1 << 20,
                                not_shared=why)
    assert why == {"a": "it is host memory", "c": "it is host memory"}      # b is below share_min_bytes
    assert not any(s.shared for s in job.args) and job.args[0].data is not None
    monkeypatch.setattr(J, "lend", lambda x, disabled=None: disabled or (b"\1" * 64, 0))
    why = {}
    job = KernelJob.from_launch(mod.vadd.image(), 1, 32, (big, small, big, 4), data="share", share_min_bytes=1 << 20,
                                not_shared=why)
    assert why == {} and [s.shared for s in job.args[:3]] == [True, False, True] and job.args[0].data is None
    job = KernelJob.from_launch(mod.vadd.image(), 1, 32, (big, small, big, 4), data="share", share_min_bytes=1 << 20,
                                not_shared=why, share_disabled="IPC failed before")
    assert why == {"a": "IPC failed before", "c": "IPC failed before"} and not any(s.shared for s in job.args)


# --- staging: CUDA tensors copied on the device into the worker's own buffers ------------------------------------


def test_from_launch_stages_cuda_tensors_once_each(mod, monkeypatch):
    a, b, c = (np.zeros(64, dtype=np.float32) for _ in range(3))
    host = np.zeros(64, dtype=np.float32)
    device = {id(a): 0x1000, id(b): 0x2000, id(c): 0x3000}
    monkeypatch.setattr(J, "device_pointer", lambda x: device.get(id(x)))
    job = KernelJob.from_launch(mod.vadd.image(), 1, 64, (a, b, a, 64), data="share", stage_min_bytes=0, device=0)
    assert [s.stage_slot for s in job.args] == [0, 1, 0, None] and job.args[0].data is None    # a: once
    assert job.args[0].staged and not job.args[0].shared and "a: float32[64] (staged)" in job.describe()
    assert KernelJob.from_bytes(job.to_bytes()) == job
    plain = job.with_data()
    assert not any(s.staged for s in plain.args) and plain.args[0].fill == "zeros"
    mixed = KernelJob.from_launch(mod.vadd.image(), 1, 64, (a, host, c, 64), data="share", stage_min_bytes=0)
    assert [s.staged for s in mixed.args[:3]] == [True, False, True] and mixed.args[1].data is not None
    why: dict = {}
    off = KernelJob.from_launch(mod.vadd.image(), 1, 64, (a, host, c, 64), data="share", stage_min_bytes=0,
                                stage_disabled="IPC failed before", not_staged=why)
    assert why == {"a": "IPC failed before", "c": "IPC failed before"} and not any(s.staged for s in off.args)
    above = KernelJob.from_launch(mod.vadd.image(), 1, 64, (a, b, c, 64), data="share", stage_min_bytes=257)
    assert not any(s.staged for s in above.args)                              # 256 bytes each: below the threshold
    assert not any(s.staged for s in KernelJob.from_launch(mod.vadd.image(), 1, 64, (a, b, c, 64)).args)   # data='copy'
    raw = job.to_bytes()                                                       # a job file from before staging:
    (n,) = struct.unpack_from("<Q", raw, len(JOB_MAGIC))                       # no "stage_slot" keys
    head = json.loads(raw[len(JOB_MAGIC) + 8:len(JOB_MAGIC) + 8 + n])
    assert head["args"][0]["stage_slot"] == 0
    for arg in head["args"]:
        del arg["stage_slot"]
    text = json.dumps(head).encode()
    older = KernelJob.from_bytes(JOB_MAGIC + struct.pack("<Q", len(text)) + text + raw[len(JOB_MAGIC) + 8 + n:])
    assert not any(s.staged for s in older.args) and older.symbol == job.symbol


def test_stage_buffers_and_run_job_on_staged_arguments(mod, stand_in_cupy, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_CUPY_IPC_DIR", str(tmp_path))
    state: dict = {}
    got = J.stage_buffers({"sizes": {"0": 256, "1": 256, "2": 256}}, state)
    assert sorted(got["slots"]) == ["0", "1", "2"] and got["slots"]["0"]["bytes"] == J.STAGE_GRANULE_BYTES
    assert bytes.fromhex(got["slots"]["0"]["handle"]).startswith(b"file:") and len(list(tmp_path.iterdir())) == 3
    buf = {int(k): stand_in_cupy._buffer(state["staging"][int(k)][0], 256).view(np.float32) for k in got["slots"]}
    buf[0][:], buf[1][:], buf[2][:] = np.inf, -np.inf, 0.0                   # what the caller copied in
    a = np.zeros(64, dtype=np.float32)
    spec = lambda name, slot, writes: ArgSpec("tensor", name, "float32", (64,), writes=writes, stage_slot=slot)
    job = KernelJob.from_launch(mod.vadd.image(), 1, 64, (a, a, a, 64))
    job = KernelJob(job.symbol, job.grid, job.block, (spec("a", 0, False), spec("b", 1, False), spec("c", 2, True),
                                                      job.args[3]), image=job.image, image_format="cubin")
    res = run_job(job, state)
    assert res.ok and res.outputs == () and np.isnan(buf[2]).all()             # written in place, nothing to send
    assert res.notes == ("c (float32[64]) holds 64 NaN of 64 elements after the launch, the first at index 0",)
    assert {e[-1] for e in stand_in_cupy.log} == {"stream"}
    grown = J.stage_buffers({"sizes": {"1": 3 << 20}}, state)                  # regrow: the old one is freed
    assert grown["slots"]["1"]["bytes"] == 4 << 20 and len(list(tmp_path.iterdir())) == 3
    missing = run_job(KernelJob(job.symbol, job.grid, job.block, (spec("a", 7, False),) + job.args[1:],
                                image=job.image, image_format="cubin"), state)
    assert missing.status == "error" and "staged in buffer 7 of this worker, which does not exist" in missing.message
    J.stage_buffers({"free": "all"}, state)
    assert state["staging"] == {} and list(tmp_path.iterdir()) == []
    monkeypatch.setenv("FAKE_CUPY_MALLOC", "fail")
    with pytest.raises(Exception, match="cudaErrorMemoryAllocation"):
        J.stage_buffers({"sizes": {"0": 16}}, state)


def test_allocations_opened_through_ipc_are_closed_when_the_job_ends(mod, stand_in_cupy, monkeypatch):
    """The caller may free a lent tensor as soon as the launch returns (torch.cuda.empty_cache() gives segments back
    to the driver); CUDA leaves freeing memory another process has open undefined, so the worker keeps none open."""
    from dataclasses import replace

    cupy = stand_in_cupy
    rt = cupy.cuda.runtime
    n = 64
    ptr = rt.malloc(n * 4)
    handle = rt.ipcGetMemHandle(ptr)
    opened, closed = [], []
    monkeypatch.setattr(rt, "ipcOpenMemHandle", lambda h, flags=1: (opened.append(h), ptr)[1])
    monkeypatch.setattr(rt, "ipcCloseMemHandle", closed.append)
    a = np.arange(n, dtype=np.float32)
    job = KernelJob.from_launch(mod.vadd.image(), 1, 64, (a, a, np.zeros(n, np.float32), n))
    lent = ArgSpec("tensor", "c", "float32", (n,), ipc_handle=handle)
    job = replace(job, args=(*job.args[:2], lent, job.args[3]))
    state: dict = {}
    for k in (1, 2):
        res = run_job(job, state)
        assert res.ok, res.message
        assert opened == [handle] * k and closed == [ptr] * k and "ipc" not in state
    assert np.array_equal(J._device_view(cupy, ptr, lent).get(), 2 * a)     # written in place, through the handle
