// kl/cluster.cuh: the blocks of a cluster (sm_90) exchange one statistic each through distributed shared memory.
// Tutorials 03 (softmax: (max, sum) pairs) and 04 (LayerNorm: Welford triples) merge a row split over a cluster so.
//
// barrier.cluster would do (arrive after writing, wait, read the other blocks' values through mapa), but its
// arrive.release compiles to MEMBAR.ALL.GPU (this thread's outstanding loads and stores complete first) and its
// wait.acquire to a flush of L1: at 1024 x 262144 the MEMBARs alone held 10-20 % of the warps' stall samples
// (Nsight Compute on tutorials 03 and 04, benchmarks/NOTES-memory-bound.md). Instead each block writes its
// statistic into a slot of every other block (st.async) and the bytes count down that block's mbarrier: a block
// waits for the bytes it needs and for nothing else. The one cluster barrier left is at the start: no block may
// write into another before that one's mbarrier is initialised.
//
//     exchange_open<S, kBlocks>();                 // first thing in the kernel
//     ...
//     Exchange<Stat, kBlocks>& ex = exchange<Stat, kBlocks>();
//     cluster_wait();                              // every block's mbarrier is ready
//     exchange_push(&ex.part[me], v, &ex.bar, r);  // my statistic into block r's ex.part[me]
//     exchange_wait(&ex.bar, 0);                   // the others' statistics are in my ex.part
#pragma once
#include "ptx.cuh"

// The mbarrier completes its phase 0 once `bytes` have arrived (one arrival: this one, which expects them).
__device__ __forceinline__ void exchange_init(unsigned long long* bar, unsigned bytes) {
#ifdef __CUDA_ARCH__
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n\t"
                 "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n\t"
                 "fence.mbarrier_init.release.cluster;" :: "r"(shared_addr(bar)), "r"(bytes) : "memory");
#else
    kl_emu::exchange_init(bar, bytes);
#endif
}
// v into *slot of block `rank` (slot, bar: this block's addresses of the same variables), 4 bytes at a time, each
// counted on that block's mbarrier *bar.
template <typename Stat>
__device__ __forceinline__ void exchange_push(Stat* slot, Stat v, unsigned long long* bar, unsigned rank) {
    static_assert(sizeof(Stat) % 4 == 0, "statistics are pushed 4 bytes at a time");
#ifdef __CUDA_ARCH__
    unsigned s, m;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(s) : "r"(shared_addr(slot)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(m) : "r"(shared_addr(bar)), "r"(rank));
    const unsigned* words = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
    for (int k = 0; k < (int)(sizeof(Stat) / 4); ++k)
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                     :: "r"(s + 4 * k), "r"(words[k]), "r"(m) : "memory");
#else
    kl_emu::exchange_push(slot, v, bar, rank);
#endif
}
// Spin until the mbarrier *bar has completed phase `parity` (mbarrier.try_wait.parity).
__device__ __forceinline__ void exchange_wait(unsigned long long* bar, unsigned parity) {
#ifdef __CUDA_ARCH__
    unsigned done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(shared_addr(bar)), "r"(parity) : "memory");
    } while (!done);
#else
    kl_emu::exchange_wait(bar, parity);
#endif
}
template <typename Stat, int kBlocks>
struct Exchange {                                        // in each block: the other blocks' statistics
    Stat part[kBlocks];
    unsigned long long bar;                              // counts their bytes
};
// This block's Exchange of statistics S (one per S and kBlocks, in static shared memory).
template <typename Stat, int kBlocks>
__device__ __forceinline__ Exchange<Stat, kBlocks>& exchange() {
    __shared__ Exchange<Stat, kBlocks> ex;
    return ex;
}
// First thing in a cluster kernel: this block's mbarrier expects kBlocks - 1 statistics; the others learn it is ready.
template <typename Stat, int kBlocks>
__device__ __forceinline__ void exchange_open() {
    if (threadIdx.x == 0) exchange_init(&exchange<Stat, kBlocks>().bar, (kBlocks - 1) * sizeof(Stat));
    cluster_arrive_relaxed();                            // no fence: only the mbarrier's init is published
}                                                        // (exchange_init's fence)
