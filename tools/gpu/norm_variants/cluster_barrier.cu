
// ---- the cluster-barrier helpers tutorials 03/04's cells had before session 8 (their exchange is st.async now) ----
// Appended after a cell (it keeps cluster_wait and cluster_ctarank) by the candidates that still meet their
// cluster's blocks at barrier.cluster (norm_persistent.cu) and by tools/gpu/try_exchange.py's
// "barrier" baseline.
__device__ __forceinline__ void cluster_arrive() {       // release: this block's shared writes are visible...
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
template <typename T>                                    // where *p lives in the shared memory of block `rank`
__device__ __forceinline__ const T* cluster_map(const T* p, unsigned rank) {
    unsigned long long in = reinterpret_cast<unsigned long long>(p), out;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(in), "r"(rank));
    return reinterpret_cast<const T*>(out);
}
