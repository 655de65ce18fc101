// kl/pdl.cuh: programmatic dependent launch (PDL, sm_90): the two griddepcontrol instructions, and the L2 prefetch a
// dependent kernel may issue before its wait.
// A kernel launched with pdl=True (Kernel.launch; cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
// SERIALIZATION) may start while the previous kernel on its stream (the primary) still runs. Before its
// griddepcontrol_wait() it may only read what no earlier kernel of the stream writes, and write nothing another kernel
// reads or writes. After it, read the primary's output through cp.async, a plain (not __restrict__) pointer or
// load_after_wait: a load through a `const __restrict__` pointer may be moved above the wait by the compiler.
// On the GPU each function is inline PTX; on the CPU (kernellab/run/sim/cuda, both ways in: compile_host and emulate)
// cuda_host.h's kl_emu:: functions of the same names, which do nothing: launches there run one after the other.
#pragma once

// griddepcontrol.wait: wait until every prerequisite grid has completed and its memory operations are performed and
// visible to this grid. A no-op where the kernel was launched without PDL (nothing is pending) and below sm_90 (where
// kernellab launches without PDL).
__device__ __forceinline__ void griddepcontrol_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#elif !defined(__CUDA_ARCH__)
    kl_emu::griddepcontrol_wait();
#endif
}

// griddepcontrol.launch_dependents: from the primary, let the dependent grid (launched with PDL) be scheduled once
// every block of this grid has executed it or exited. It publishes nothing: the dependent's griddepcontrol_wait still
// waits for this whole grid and its writes, so it may come first thing in the kernel. A no-op below sm_90.
__device__ __forceinline__ void griddepcontrol_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#elif !defined(__CUDA_ARCH__)
    kl_emu::griddepcontrol_launch_dependents();
#endif
}

// Read an int the primary (the previous kernel) wrote, after griddepcontrol_wait(). A plain `p[i]` through a
// `const int* __restrict__` parameter compiles to a non-coherent load (LDG.E.CONSTANT) that the compiler treats as
// invariant for the whole kernel and may hoist above the wait (inline PTX's "memory" clobber does not hold it back):
// the kernel then reads the value before the primary has written it. This load is inline PTX marked volatile, so it
// stays after the wait; .cg reads it from L2 (the point of coherence, where the primary's writes are), not L1.
__device__ __forceinline__ int load_after_wait(const int* p) {
#ifdef __CUDA_ARCH__
    int v;
    asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#else
    return *p;
#endif
}

// Ask for the 128-byte line holding p into L2 (prefetch.global.L2): no register is written, no wait. L2 is where
// every SM's loads and stores meet (the GPU's point of coherence), so a line prefetched there is never stale: a later
// store by any kernel updates it. That makes it safe before griddepcontrol_wait even for data the primary writes;
// a load into registers, shared memory (cp.async) or L1 of such data is not.
__device__ __forceinline__ void prefetch_l2(const void* p) {
#ifdef __CUDA_ARCH__
    asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
#else
    kl_emu::prefetch_l2(p);
#endif
}
