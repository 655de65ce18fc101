"""Tensor maps and clusters on a real Hopper GPU: kernellab.tensor_map + a cp.async.bulk.tensor tile copy (exact,
out-of-bounds fill, the 128B swizzle pattern, in a worker process), and cluster launches through cuLaunchKernelEx."""
import math
import subprocess
import sys
import textwrap

import pytest
from hopper_sources import TMA_COPY

import kernellab

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

ROWS, COLS = 16, 32          # the kernel's box: BOX_ROWS x BOX_COLS floats

CLUSTER_IDS = r"""
extern "C" __global__ void cluster_ids(int* rank, int* size, int* cluster) {
    unsigned r, n, c;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    asm("mov.u32 %0, %%clusterid.x;" : "=r"(c));
    if (threadIdx.x == 0) { rank[blockIdx.x] = r; size[blockIdx.x] = n; cluster[blockIdx.x] = c; }
}
"""


@pytest.fixture(scope="module")
def copy():
    return kernellab.compile_cuda(TMA_COPY, arch="sm_90").tma_copy


def _run(copy, tm, out, rows, cols, **kw):
    grid = (math.ceil(cols / COLS), math.ceil(rows / ROWS))     # one block per box
    copy[grid, 128](tm, out, rows, cols, **kw)


def test_tma_tile_copy_is_exact(copy):
    x = torch.randn(48, 96, device="cuda")
    out = torch.zeros_like(x)
    tm = kernellab.tensor_map(x, (ROWS, COLS), swizzle="none")
    assert tm.box_bytes == ROWS * COLS * 4 and len(tm.encoded) == 128 and tm.global_address == x.data_ptr()
    _run(copy, tm, out, 48, 96)
    assert torch.equal(out, x)


def test_out_of_bounds_elements_read_as_zero(copy):
    x = torch.randn(50, 72, device="cuda")                     # 72 floats = 288 B rows: a multiple of 16 B
    out = torch.full((64, 96), 7.0, device="cuda")             # whole boxes: 4 x 3 of them
    _run(copy, kernellab.tensor_map(x, (ROWS, COLS), swizzle="none"), out, 64, 96)
    assert torch.equal(out[:50, :72], x)
    assert (out[50:] == 0).all() and (out[:, 72:] == 0).all()


def test_128B_swizzle_permutes_16_byte_chunks_by_row(copy):
    x = torch.arange(ROWS * COLS, device="cuda", dtype=torch.float32).reshape(ROWS, COLS)
    out = torch.zeros_like(x)
    _run(copy, kernellab.tensor_map(x, (ROWS, COLS), swizzle="128B"), out, ROWS, COLS)
    # a 128-byte row is 8 chunks of 16 bytes (4 floats); chunk j of row r lands at chunk j ^ (r % 8)
    expect = torch.empty_like(x)
    for r in range(ROWS):
        for j in range(8):
            expect[r, 4 * (j ^ (r % 8)):4 * (j ^ (r % 8)) + 4] = x[r, 4 * j:4 * j + 4]
    assert torch.equal(out, expect)


def test_bf16_map_and_a_strided_view(copy):
    big = torch.randn(128, 256, device="cuda").to(torch.bfloat16)
    view = big[:, 64:192]                                     # rows of 512 B, starting 128 B in
    tm = kernellab.tensor_map(view, (64, 64))
    assert tm.strides_bytes == (512, 2) and not tm.contiguous and tm.box_bytes == 64 * 64 * 2
    assert tm.driver_args()["globalDim"] == [128, 128] and tm.global_address == view.data_ptr()


def test_isolated_launch_reencodes_the_map_in_the_worker(copy):
    x = torch.randn(48, 96, device="cuda")
    out = torch.zeros_like(x)
    run = copy[(3, 3), 128](kernellab.tensor_map(x, (ROWS, COLS), swizzle="none"), out, 48, 96, isolate=True)
    assert torch.equal(out, x), run
    with pytest.raises(kernellab.ArgumentError, match="contiguous tensors only"):
        big = torch.zeros(48, 128, device="cuda")
        copy[(3, 3), 128](kernellab.tensor_map(big[:, :96], (ROWS, COLS), swizzle="none"), out, 48, 96,
                          isolate=True)


def test_a_tensor_where_a_map_is_expected(copy):
    x = torch.randn(48, 96, device="cuda")
    with pytest.raises(kernellab.ArgumentError, match="kernellab.tensor_map"):
        copy[(3, 3), 128](x, x, 48, 96)


@pytest.mark.parametrize("dtype, shape, box, swizzle", [
    ("float32", (48, 96), (ROWS, COLS), "none"),
    ("bfloat16", (24, 256, 64), (1, 64, 64), "128B"),        # tutorial 08's step 3: (B*H, N, d), box (1, 64, 64)
])
def test_a_moved_tensor_gets_the_drivers_own_map_by_address_replacement(copy, dtype, shape, box, swizzle):
    """A tensor of a layout already mapped, at a new address, gets its map by cuTensorMapReplaceAddress: the 128
    bytes equal a full encode's for that tensor, a copy through it reads the new tensor, and no encode ran."""
    from kernellab.run.launch import tensor_map as T
    T.tensor_map_cache_clear()
    dt = getattr(torch, dtype)
    first = torch.randn(*shape, device="cuda").to(dt)
    kernellab.tensor_map(first, box, swizzle=swizzle)
    moved = torch.randn(*shape, device="cuda").to(dt)
    encodes = []
    real_encode = T.encode
    T.encode = lambda *a, **k: encodes.append(a) or real_encode(*a, **k)
    try:
        tm = kernellab.tensor_map(moved, box, swizzle=swizzle)
    finally:
        T.encode = real_encode
    assert encodes == [] and tm.global_address == moved.data_ptr() != first.data_ptr()
    strides = tuple(s * moved.element_size() for s in moved.stride())
    full = T.encode(T.DATA_TYPES[dtype], moved.data_ptr(), tuple(moved.shape), strides, box, (1,) * len(shape),
                    "none", swizzle, "256B", "zero", device=moved.get_device())
    assert tm.encoded == full
    if dtype == "float32":
        out = torch.zeros_like(moved)
        _run(copy, tm, out, *shape)
        assert torch.equal(out, moved)
    T.tensor_map_cache_clear()


def test_address_replacement_in_a_thread_without_a_context():
    """cuTensorMapReplaceAddress from a thread with no current context: the map still comes out equal to a full
    encode's (kernellab retries with the GPU's primary context pushed where the driver asks for one)."""
    code = textwrap.dedent("""
        import threading
        import torch
        import kernellab
        from kernellab.run.launch import cudriver, tensor_map as T
        x, y = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
        kernellab.tensor_map(x, (16, 32), swizzle="none")
        got = []
        def in_thread():
            got.append(cudriver.current_context() is None)
            got.append(kernellab.tensor_map(y, (16, 32), swizzle="none").encoded)
        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
        T.tensor_map_cache_clear()
        print(got[0], got[1] == kernellab.tensor_map(y, (16, 32), swizzle="none").encoded)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"], proc.stdout


def test_encode_from_a_fresh_process_and_a_thread_without_a_context():
    """cuTensorMapEncodeTiled needs a current context (else CUDA_ERROR_INVALID_CONTEXT): in a fresh process before
    anything made one, and in a new thread (CUDA contexts are current per thread), kernellab.tensor_map pushes the
    tensor's GPU's primary context first."""
    code = textwrap.dedent("""
        import threading
        from kernellab.run.launch import cudriver
        from kernellab.run.launch.tensor_map import encode
        assert cudriver.current_context() is None                # nothing has made a context yet
        raw = encode("FLOAT32", 0x10000, (64, 64), (256, 4), (16, 32), (1, 1), "none", "none", "none", "zero")
        print(len(raw), raw != bytes(128), cudriver.current_context() is None)
        import torch
        import kernellab
        x = torch.randn(64, 64, device="cuda")
        main = kernellab.tensor_map(x, (16, 32), swizzle="none")
        got = []
        def in_thread():
            try:
                got.append((cudriver.current_context() is None, kernellab.tensor_map(x, (16, 32), swizzle="none")))
            except Exception as exc:
                got.append(exc)
        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
        fresh, tm = got[0]
        print(len(tm.encoded), tm.encoded == main.encoded)
        print("the thread had no context:", fresh)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["128", "True", "True"] and lines[1].split() == ["128", "True"], proc.stdout


@pytest.fixture(scope="module")
def ids():
    return kernellab.compile_cuda(CLUSTER_IDS, arch="sm_90").cluster_ids


@pytest.mark.parametrize("isolate", [False, True])
def test_cluster_launch(ids, isolate):
    rank, size, cluster = (torch.full((8,), -1, dtype=torch.int32, device="cuda") for _ in range(3))
    ids[8, 32](rank, size, cluster, cluster=(2, 1, 1), isolate=isolate)
    assert rank.tolist() == [0, 1] * 4 and size.tolist() == [2] * 8 and cluster.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    ids[8, 32](rank, size, cluster, isolate=isolate)                  # no cluster: each block alone
    assert size.tolist() == [1] * 8 and rank.tolist() == [0] * 8


def test_cluster_shape_errors(ids):
    x = torch.zeros(8, dtype=torch.int32, device="cuda")
    with pytest.raises(kernellab.ArgumentError, match="not a multiple of 2"):
        ids[7, 32](x, x, x, cluster=(2, 1, 1))


@pytest.mark.parametrize("isolate", [False, True])
def test_clusters_of_16_blocks_launch_with_the_opt_in(ids, isolate):
    """sm_90's non-portable cluster size: kernellab sets the opt-in, in this process and in a worker."""
    rank, size, cluster = (torch.full((32,), -1, dtype=torch.int32, device="cuda") for _ in range(3))
    ids[32, 32](rank, size, cluster, cluster=(16, 1, 1), isolate=isolate)
    assert rank.tolist() == list(range(16)) * 2 and size.tolist() == [16] * 32
    assert cluster.tolist() == [0] * 16 + [1] * 16


@pytest.mark.parametrize("isolate", [False, True])
def test_a_compiled_cluster_shape_of_16_blocks_launches(isolate):
    """__cluster_dims__(16, 1, 1): kernellab reads the shape from the cubin and sets the opt-in before the first
    launch, in this process and in a worker (the job's cubin says so there)."""
    src = CLUSTER_IDS.replace("void cluster_ids", "void __cluster_dims__(16, 1, 1) cluster_ids16")
    k = kernellab.compile_cuda(src, arch="sm_90").cluster_ids16
    assert k.resources.cluster_dims == (16, 1, 1)
    rank, size, cluster = (torch.full((32,), -1, dtype=torch.int32, device="cuda") for _ in range(3))
    k[32, 64](rank, size, cluster, isolate=isolate)
    assert rank.tolist() == list(range(16)) * 2 and size.tolist() == [16] * 32
    assert cluster.tolist() == [0] * 16 + [1] * 16


def test_max_active_clusters_comes_from_the_driver(ids):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n8 = ids.max_active_clusters(32, (8, 1, 1))
    n16 = ids.max_active_clusters(1024, 16)
    print(f"max active clusters on {sms} SMs: 8 blocks of 32 threads {n8}, 16 blocks of 1024 threads {n16}")
    # an SM holds 2048 threads: two of these 1024-thread blocks (H100: 14 clusters of 16, 124 of 8 x 32)
    assert 1 <= n16 <= 2 * sms // 16 and n8 >= n16
    assert n8 <= 32 * sms // 8                              # at most 32 blocks an SM


def test_profile_reports_tensor_pipe_utilisation():
    """An mma.sync kernel under Nsight Compute: the HMMA pipe was busy; metrics this ncu lacks are left out."""
    from hopper_sources import MMA_SYNC

    k = kernellab.compile_cuda(MMA_SYNC, arch="sm_90").mma_tile
    a = torch.randn(16, 16, device="cuda").to(torch.bfloat16)
    b = torch.randn(8, 16, device="cuda").to(torch.bfloat16)
    c = torch.zeros(16, 8, device="cuda")
    rep = k.profile(528, 32, a, b, c)
    if rep.permission_denied:
        pytest.skip("GPU performance counters are not permitted here: " + str(rep))
    print(rep)                                    # the lead's log: which tensor metrics this ncu knows
    assert rep.ok, rep
    assert rep.tensor_pipe_pct.get("hmma", 0) > 0 or any("does not know" in n and "hmma" in n for n in rep.notes)
    # one warp per block, one HMMA.16816 in its SASS: 528 warp-level instructions, where this ncu counts them
    assert rep.get("tensor-pipe instructions executed (HMMA and HGMMA, per warp)") in (None, 528.0)
