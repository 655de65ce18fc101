"""The simulator's block scheduler (kernellab.run.sim.sched): numba-cuda's semantics kept (barriers, syncthreads_count,
exceptions naming the thread, returned threads counting as arrived), the warp-level functions it adds, and the same
results with greenlets and with the OS-thread fallback. Speed is measured by benchmarks/simulator_speed.py, not here."""
import numpy as np
import pytest

pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")

from numba import cuda, float32, int32  # noqa: E402

from kernellab.run.sim import sched as simsched  # noqa: E402
from kernellab.run.sim.numba_sim import SimulatedKernelError, simulate  # noqa: E402


@pytest.fixture(params=["greenlet", "threads"])
def backend(request, monkeypatch):
    if request.param == "threads":
        monkeypatch.setenv("KERNELLAB_SIM_THREADS", "1")
    elif simsched.backend() != "greenlet":
        pytest.skip("greenlet is not installed")
    assert simsched.backend() == request.param
    return request.param


def block_reverse_sum(x, out):
    s = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    s[t] = x[cuda.grid(1)]
    cuda.syncthreads()
    v = s[63 - t]
    cuda.syncthreads()
    s[t] = v
    cuda.syncthreads()
    stride = 32
    while stride > 0:
        if t < stride:
            s[t] += s[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


def test_barriers_order_a_block_and_blocks_run_in_turn(backend):
    x = np.arange(3 * 64, dtype=np.float32)
    out = np.zeros(3, np.float32)
    simulate(block_reverse_sum, 3, 64, (x, out))
    np.testing.assert_allclose(out, x.reshape(3, 64).sum(1))


def barrier_votes(x, counts):
    t = cuda.threadIdx.x
    counts[0] = cuda.syncthreads_count(x[t] > 0)
    counts[1] = cuda.syncthreads_and(x[t] > -100)
    counts[2] = cuda.syncthreads_or(x[t] > 100)


def test_syncthreads_count_and_or(backend):
    x = np.array([1, -1, 2, 3, -5] + [0] * 43, np.float32)
    counts = np.zeros(3, np.int32)
    simulate(barrier_votes, 1, 48, (x, counts))
    assert counts.tolist() == [3, 1, 0]


def warp_functions(x, out):
    t = cuda.threadIdx.x
    lane = t % 32
    v = x[t]
    out[0, t] = cuda.shfl_sync(0xFFFFFFFF, v, 3)                   # lane 3's value, to every lane
    out[1, t] = cuda.shfl_up_sync(0xFFFFFFFF, v, 1)                # lane - 1 (lane 0 keeps its own)
    out[2, t] = cuda.shfl_down_sync(0xFFFFFFFF, v, 2)              # lane + 2 (lanes 30, 31 keep their own)
    out[3, t] = cuda.shfl_xor_sync(0xFFFFFFFF, v, 1)               # pairs swap
    out[4, t] = cuda.ballot_sync(0xFFFFFFFF, lane % 4 == 0)
    out[5, t] = cuda.all_sync(0xFFFFFFFF, v >= 0)
    out[6, t] = cuda.any_sync(0xFFFFFFFF, v > 60)
    out[7, t] = cuda.eq_sync(0xFFFFFFFF, lane < 40)
    out[8, t] = cuda.match_any_sync(0xFFFFFFFF, lane // 8)
    out[9, t] = cuda.laneid + 100 * cuda.lanemask_lt() if lane < 3 else cuda.laneid
    out[10, t] = cuda.activemask()
    if lane < 5:
        out[11, t] = cuda.activemask()                            # inside a branch: the lanes that took it


def test_warp_level_functions(backend):
    x = np.arange(64, dtype=np.int64)
    out = np.zeros((12, 64), np.int64)
    simulate(warp_functions, 1, 64, (x, out))
    lanes = np.arange(64) % 32
    base = np.arange(64) - lanes
    assert (out[0] == base + 3).all()
    assert (out[1] == np.where(lanes > 0, x - 1, x)).all()
    assert (out[2] == np.where(lanes < 30, x + 2, x)).all()
    assert (out[3] == x ^ 1).all()
    assert (out[4] == sum(1 << k for k in range(0, 32, 4))).all()
    assert (out[5] == 1).all() and out[6].tolist() == [0] * 32 + [1] * 32 and (out[7] == 1).all()
    assert (out[8] == (0xFF << (8 * (lanes // 8)))).all()
    assert out[9, :4].tolist() == [0, 101, 302, 3]
    assert (out[10] == 0xFFFFFFFF).all() and (out[11, lanes < 5] == 0b11111).all()


def partial_warp(x, out):
    t = cuda.threadIdx.x
    if t < 16:
        out[t] = cuda.shfl_down_sync(0xFFFF, x[t], 1)   # half a warp meets; the others returned
        cuda.syncwarp(0xFFFF)


def test_a_shuffle_among_the_lanes_of_its_mask(backend):
    x = np.arange(20, dtype=np.float32)
    out = np.zeros(20, np.float32)
    simulate(partial_warp, 1, 20, (x, out))
    assert out[:16].tolist() == list(range(1, 16)) + [15] and not out[16:].any()


def early_return(x, out):
    s = cuda.shared.array(32, int32)
    t = cuda.threadIdx.x
    if t >= 20:
        return
    s[t] = x[t]
    cuda.syncthreads()                              # returned threads count as arrived
    out[t] = s[19 - t]


def test_returned_threads_count_as_arrived(backend):
    x = np.arange(32, dtype=np.int32)
    out = np.zeros(32, np.int32)
    simulate(early_return, 1, 32, (x, out))
    assert out[:20].tolist() == list(range(19, -1, -1)) and not out[20:].any()


def fails_in_thread_37(x):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    if t == 37:
        x[t] = 1.0 / 0.0 if x[0] > 1e9 else x[100]


def test_an_exception_names_the_thread_and_stops_the_launch(backend):
    x = np.zeros(64, np.float32)
    with pytest.raises(SimulatedKernelError) as info:
        simulate(fails_in_thread_37, 2, 64, (x,))
    assert info.value.thread == (37, 0, 0) and info.value.block == (0, 0, 0) and info.value.exception == "IndexError"
    simulate(block_reverse_sum, 1, 64, (np.ones(64, np.float32), np.zeros(1, np.float32)))   # the next launch runs


def grid_sync(x, y):
    g = cuda.cg.this_grid()
    x[cuda.threadIdx.x] = cuda.threadIdx.x
    g.sync()
    y[cuda.threadIdx.x] = x[(cuda.threadIdx.x + 1) % 32]


def test_cooperative_grid_sync_is_a_block_barrier(backend):
    x, y = np.zeros(32, np.float32), np.zeros(32, np.float32)
    simulate(grid_sync, 1, 32, (x, y))
    assert y.tolist() == list(range(1, 32)) + [0]


def test_3d_blocks_number_threads_x_fastest():
    def ids(out):
        t = cuda.threadIdx
        linear = cuda.blockDim.x * (t.y + cuda.blockDim.y * t.z) + t.x
        out[t.z, t.y, t.x] = cuda.laneid + 32 * (linear // 32)      # lanes of a warp: consecutive linear ids

    out = np.zeros((2, 3, 16), np.int64)
    simulate(ids, 1, (16, 3, 2), (out,))
    linear = np.arange(96).reshape(2, 3, 16)
    assert (out == linear).all()
