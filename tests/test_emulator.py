"""kernellab.run.sim.cuda: CUDA C++ kernels run on the CPU (threads as fibers), and the mistakes the emulation reports."""
import sys
import pathlib

import pytest


from kernellab.run.sim.cuda.emulate import compile_host, compiler, host_source  # noqa: E402

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler (g++) for the CPU emulation")

SOURCE = r"""
__device__ __forceinline__ unsigned cluster_ctarank() {     // replaced by the emulation
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
template <typename T>                                        // replaced too
__device__ __forceinline__ const T* cluster_map(const T* p, unsigned rank) {
    unsigned long long in = reinterpret_cast<unsigned long long>(p), out;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(in), "r"(rank));
    return reinterpret_cast<const T*>(out);
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// y[block] = sum of x over the block, through shuffles and shared memory
extern "C" __global__ void block_sums(const float* x, float* y, int n) {
    __shared__ float part[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < blockDim.x / 32; ++w) s += part[w];
        y[blockIdx.x] = s;
    }
}

// each block of a cluster of 4 reads its right neighbour's value through distributed shared memory
extern "C" __global__ void __cluster_dims__(4, 1, 1) neighbours(const float* x, float* y) {
    __shared__ float mine;
    if (threadIdx.x == 0) mine = x[blockIdx.x];
    cluster_sync();
    if (threadIdx.x == 0) y[blockIdx.x] = *cluster_map(&mine, (cluster_ctarank() + 1) % 4);
    cluster_sync();
}

extern "C" __global__ void mismatched_barriers(float* y) {
    float v = 1.0f;
    if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);   // waits for lanes 16..31, which...
    else __syncthreads();                                          // ...wait here for lanes 0..15
    y[threadIdx.x] = v;
}

extern "C" __global__ void early_exit_shuffle(float* y) {
    if (threadIdx.x >= 16) return;                       // lanes 16..31 have left
    y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 16);
}
"""


@pytest.fixture(scope="module")
def mod():
    return compile_host(SOURCE)


def test_a_reduction_runs_and_is_right(mod):
    x = torch.randn(1000)
    y = torch.full((4,), float("nan"))
    mod["block_sums"][4, 256](x, y, 1000)
    expected = torch.stack([x[k * 256:(k + 1) * 256].sum() for k in range(4)])
    assert torch.allclose(y, expected, atol=1e-4)


def test_clusters_take_their_size_from_the_cubin_and_share_memory(mod):
    k = mod["neighbours"]
    assert k.cluster == 4
    x = torch.arange(8, dtype=torch.float32)
    y = torch.full((8,), float("nan"))
    k[8, 64](x, y)
    assert y.tolist() == [1, 2, 3, 0, 5, 6, 7, 4]


def test_two_libraries_keep_their_own_shared_memory(mod):
    """Inline and template thread_locals must not be unified across libraries (they were, once: DSMEM broke)."""
    other = compile_host(SOURCE + "\n// a second library\n")
    for k in (other["neighbours"], mod["neighbours"]):
        y = torch.full((8,), float("nan"))
        k[8, 64](torch.arange(8, dtype=torch.float32), y)
        assert y.tolist() == [1, 2, 3, 0, 5, 6, 7, 4]


def test_a_barrier_not_every_thread_reaches_is_a_deadlock_not_a_hang(mod):
    with pytest.raises(RuntimeError, match="deadlock"):
        mod["mismatched_barriers"][1, 32](torch.zeros(32))


def test_a_shuffle_from_an_exited_lane_is_reported(mod):
    with pytest.raises(RuntimeError, match="exited"):
        mod["early_exit_shuffle"][1, 32](torch.zeros(32))


def test_the_ptx_helpers_are_cut_out_of_the_host_source():
    text = host_source(SOURCE)
    assert "asm" not in text and "using kl_emu::cluster_map;" in text
    assert text.count("\n") == SOURCE.count("\n")        # line numbers in host compile errors still match


# --- tutorials 03/04's cluster exchange: st.async into another block's shared memory, counted on its mbarrier ---

def exchange_source():
    """Tutorials 03/04's exchange (kernellab's <kl/cluster.cuh>: PTX on the GPU, cuda_host.h's kl_emu:: here) and two
    kernels that use it."""
    return r"""#include <kl/cluster.cuh>
// every block of a cluster of 4 pushes its value to all the others; y[block] = the sum of the cluster's values
extern "C" __global__ void __cluster_dims__(4, 1, 1) cluster_sums(const float* x, float* y) {
    exchange_open<float, 4>();
    Exchange<float, 4>& ex = exchange<float, 4>();
    unsigned me = cluster_ctarank();
    float v = x[blockIdx.x];
    cluster_wait();
    if (threadIdx.x < 4 && threadIdx.x != me) exchange_push(&ex.part[me], v, &ex.bar, threadIdx.x);
    exchange_wait(&ex.bar, 0);
    float s = 0.0f;
    for (int r = 0; r < 4; ++r) s += r == (int)me ? v : ex.part[r];
    if (threadIdx.x == 0) y[blockIdx.x] = s;
}

// rank 0 never pushes: the others wait for bytes that never come
extern "C" __global__ void __cluster_dims__(2, 1, 1) missing_push(float* y) {
    exchange_open<float, 2>();
    Exchange<float, 2>& ex = exchange<float, 2>();
    unsigned me = cluster_ctarank();
    cluster_wait();
    if (threadIdx.x == 0 && me == 1) exchange_push(&ex.part[me], 1.0f, &ex.bar, 0u);
    exchange_wait(&ex.bar, 0);
    y[blockIdx.x] = 1.0f;
}
"""


@pytest.fixture(scope="module")
def exchange_mod():
    return compile_host(exchange_source())


def test_the_statistic_exchange_delivers_every_block_the_others_values(exchange_mod):
    x = torch.arange(8, dtype=torch.float32)
    y = torch.full((8,), float("nan"))
    exchange_mod["cluster_sums"][8, 64](x, y)
    assert y.tolist() == [6.0] * 4 + [22.0] * 4


def test_an_exchange_whose_bytes_never_come_is_reported_not_a_hang(exchange_mod, monkeypatch):
    monkeypatch.setenv("KERNELLAB_EMU_WAIT_S", "1")
    with pytest.raises(RuntimeError, match="never pushed"):
        exchange_mod["missing_push"][2, 32](torch.zeros(2))



TWO_KERNELS = r"""
__global__ void add_one(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
__global__ void twice(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }
"""


def test_the_kernels_of_one_cell_share_one_emulator_build(tmp_path, monkeypatch):
    """emulate() builds a cell once for all its kernels, each launched by name; a cell that does not build whole (a
    kernel the preprocessor removes) falls back to the kernel alone, remembered, and still runs."""
    import numpy as np
    from kernellab.run.sim.cuda import emulate as emu

    monkeypatch.setattr(emu, "CACHE", tmp_path)
    x = np.arange(5, dtype=np.float32)
    emu.emulate(TWO_KERNELS, "add_one", (1,), (32,), [x, 5])
    emu.emulate(TWO_KERNELS, "twice", (1,), (32,), [x, 5])
    np.testing.assert_array_equal(x, (np.arange(5) + 1) * 2)
    binaries = [p.name for p in tmp_path.iterdir() if p.suffix == "" and not p.name.startswith("program-")]
    assert len(binaries) == 1 and binaries[0].startswith("cell-"), binaries
    if not emu.is_gcc(emu._compiler()):         # clang parses the runtime's headers once, from a .pch
        assert list(tmp_path.glob("program-*.h.pch")), sorted(p.name for p in tmp_path.iterdir())

    gone = TWO_KERNELS + "#if 0\n__global__ void removed(float* x) {}\n#endif\n"
    emu.emulate(gone, "twice", (1,), (32,), [x, 5])
    emu.emulate(gone, "add_one", (1,), (32,), [x, 5])
    np.testing.assert_array_equal(x, (np.arange(5) + 1) * 4 + 1)
    names = sorted(p.name.split("-")[0] + (".failed" if p.name.endswith(".failed") else "")
                   for p in tmp_path.iterdir() if p.suffix in ("", ".failed") and not p.name.startswith("program-"))
    assert names == ["add_one", "cell", "cell.failed", "twice"], names
