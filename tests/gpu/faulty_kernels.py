"""Small CUDA kernels with known faults (out of bounds, misaligned, a race, a divergent barrier, uninitialised reads, a
hang), written as a `%%cuda` cell's body, for the GPU tests of the isolated worker and compute-sanitizer
(test_tools_gpu.py, test_sanitizer_pool_gpu.py).

- `SRC`: the cell's source; `compile_faulty()` compiles it as the magic would (first_line=2, filename cell.cu).
- `line_of(fragment)`: the cell line of the source line holding `fragment`, as a finding reports it.
- `save(name, text)`: a raw tool output kept under $KERNELLAB_ARTIFACTS (to refresh the hand-written fixtures).
"""
import os
import pathlib

import kernellab

# Cell-style source: line 1 would be the %%cuda line, so the first line of SRC is line 2.
SRC = r"""extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
extern "C" __global__ void oob_write(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i + n] = 1.0f;
}
extern "C" __global__ void misaligned(float* x) {
    float* p = (float*)((char*)x + 2);
    p[threadIdx.x] = 1.0f;
}
extern "C" __global__ void trap_now(float* x) {
    if (threadIdx.x == 0) __trap();
    x[threadIdx.x] = 1.0f;
}
extern "C" __global__ void spin(int* flag) {
    while (atomicAdd(flag, 0) == 0) { }
}
extern "C" __global__ void racy_reverse(const float* x, float* y) {
    __shared__ float tile[64];
    tile[threadIdx.x] = x[blockIdx.x * 64 + threadIdx.x];
    y[blockIdx.x * 64 + threadIdx.x] = tile[63 - threadIdx.x];
}
extern "C" __global__ void divergent_barrier(float* x) {
    if (threadIdx.x < 16) __syncthreads();
    x[threadIdx.x] = 1.0f;
}
extern "C" __global__ void reads_scratch(const float* scratch, float* y) {
    y[threadIdx.x] = scratch[threadIdx.x] + 1.0f;
}
extern "C" __global__ void scale2(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i];
}
extern "C" __global__ void transpose32(const float* in, float* out, int n) {
    __shared__ float tile[32][32];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x; y = blockIdx.x * 32 + threadIdx.y;
    out[y * n + x] = tile[threadIdx.x][threadIdx.y];
}
"""
LINE = {text.strip(): i + 2 for i, text in enumerate(SRC.splitlines())}


def line_of(fragment: str) -> int:
    return next(n for text, n in LINE.items() if fragment in text)


def save(name: str, text: str) -> None:
    out = os.environ.get("KERNELLAB_ARTIFACTS")
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(out) / name).write_text(text)


def compile_faulty():
    """SRC compiled as a `%%cuda` cell: its first line is the cell's line 2."""
    return kernellab.compile_cuda(SRC, first_line=2, filename="cell.cu")
