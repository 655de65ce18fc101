"""kernellab.check on a real GPU: CUDA tensors, TF32 and half-precision matmuls, and a compiled kernel's tail."""
import pytest

import kernellab
from kernellab.run.measure.check import check

pytestmark = pytest.mark.gpu

VADD = r"""
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
extern "C" __global__ void vadd_no_tail(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n / 256 * 256) c[i] = a[i] + b[i];   // forgets the last partial block
}
"""


@pytest.fixture(scope="module")
def torch():
    import torch

    return torch


def test_cuda_tensors_pass_and_a_bad_element_is_located(torch):
    def inputs(g):
        return torch.randn(257, 129, generator=g).cuda(), torch.randn(129, 65, generator=g).cuda()

    assert check(torch.matmul, torch.matmul, inputs, precision="tf32").passed

    def wrong(a, b):
        out = a @ b
        out[200, 7] += 1.0
        return out

    r = check(wrong, torch.matmul, inputs, precision="tf32")
    assert not r.passed and r.worst[0] == (200, 7) and r.mismatches == 1


def test_a_cuda_generator_draws_on_the_device(torch):
    inputs = lambda g: (torch.randn(100_003, generator=g, device="cuda"),)  # noqa: E731
    r = check(lambda x: x * 2, lambda x: x + x, inputs, generator_device="cuda")
    assert r.passed and r.generator_device == "cuda"
    bad = check(lambda x: x * 2.001, lambda x: x + x, inputs, generator_device="cuda", seed=5)
    assert bad.reproduce == "args = inputs(torch.Generator('cuda').manual_seed(5))"


def test_tf32_matmul_needs_the_tf32_tolerance(torch):
    def inputs(g):
        return torch.randn(513, 1031, generator=g).cuda(), torch.randn(1031, 257, generator=g).cuda()

    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        strict = check(torch.matmul, torch.matmul, inputs)
        loose = check(torch.matmul, torch.matmul, inputs, precision="tf32")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert not strict.passed and "precision='tf32'" in strict.message
    assert loose.passed and loose.reference_precision == "float64"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_matmul_passes_with_default_tolerances(torch, dtype):
    dt = getattr(torch, dtype)

    def inputs(g):
        return (torch.randn(333, 1025, generator=g).to("cuda", dt), torch.randn(1025, 97, generator=g).to("cuda", dt))

    r = check(torch.matmul, torch.matmul, inputs)
    assert r.passed and r.precision == dtype and r.reference_precision == "float64", str(r)

    def accumulate_in_output_dtype(a, b):   # rounds the running sum to 8 or 11 bits after every product
        acc = torch.zeros(a.shape[0], b.shape[1], device="cuda", dtype=dt)
        for k in range(a.shape[1]):
            acc = acc + a[:, k:k + 1] * b[k:k + 1, :]
        return acc

    naive = check(accumulate_in_output_dtype, torch.matmul, inputs, trials=1)
    assert not naive.passed, str(naive)


def test_a_compiled_kernel_that_skips_its_tail_is_caught(torch):
    mod = kernellab.compile_cuda(VADD)
    n = 100_003

    def launcher(kernel):
        def run(a, b, c):
            kernel[(n + 255) // 256, 256](a, b, c, n)
            return c
        return run

    def inputs(g):
        return (torch.randn(n, generator=g).cuda(), torch.randn(n, generator=g).cuda(), torch.empty(n, device="cuda"))

    assert check(launcher(mod.vadd), lambda a, b, c: a + b, inputs).passed
    r = check(launcher(mod.vadd_no_tail), lambda a, b, c: a + b, inputs)
    assert not r.passed and r.output_arguments == (2,)
    assert r.mismatches == n - n // 256 * 256 and min(r.worst)[0] >= n // 256 * 256


def test_input_mutation_on_the_gpu(torch):
    def candidate(x):
        x[5] = 0
        return x * 2

    r = check(candidate, lambda x: x * 2, lambda g: (torch.randn(1000, generator=g).cuda(),))
    assert not r.passed and r.mutated_inputs == ("argument 0",)


def test_a_result_in_recycled_torch_empty_memory_must_be_written(torch):
    """The candidate allocates its result with torch.empty and skips its tail: the block it gets back from torch's
    caching allocator last held the right answer (its own probe run on the same inputs, a moment earlier). Filling
    the free blocks with NaN before each run makes the unwritten elements fail."""
    mod = kernellab.compile_cuda(VADD)
    n = 1_000_003

    def candidate(a, b):
        c = torch.empty_like(a)
        mod.vadd_no_tail[(n + 255) // 256, 256](a, b, c, n)
        return c

    def inputs(g):
        return torch.randn(n, generator=g).cuda(), torch.randn(n, generator=g).cuda()

    r = check(candidate, torch.add, inputs)
    assert not r.passed and r.mismatches == n % 256
    assert all(v != v for _, v, _, _ in r.worst_values)       # the unwritten elements hold NaN
    assert r.free_memory_filled_bytes > 0 and "free GPU memory filled with NaN" in str(r)


def test_filling_free_memory_fills_only_free_blocks_and_is_cheap(torch):
    import time

    from kernellab.run.measure.check import fill_free_memory

    keep = torch.ones(1 << 20, device="cuda")
    scratch = torch.ones(1 << 22, device="cuda")
    del scratch                                          # its block is free but cached
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    filled = fill_free_memory({0})
    elapsed_s = time.perf_counter() - t0
    assert filled >= 4 << 22
    assert keep.eq(1).all()                              # live tensors untouched
    again = torch.empty(1 << 22, device="cuda")          # a cached block comes back, full of NaN
    assert again.isnan().all()
    print(f"filled {filled / 2**20:.1f} MiB in {elapsed_s * 1e3:.2f} ms")


def test_the_float64_reference_out_of_memory_is_said(torch):
    """A reference whose workspace fits in float16 but not in float64 on the device: the check still runs, against
    the reference in the inputs' dtype, and the report says why."""
    free_bytes, _ = torch.cuda.mem_get_info()
    scratch_elems = int(free_bytes * 0.4) // 2           # 0.4 of free memory in float16, 1.6 in float64

    def reference(a):
        scratch = torch.empty(scratch_elems, dtype=a.dtype, device=a.device)
        scratch[:1] = 0
        return a * 2

    r = check(lambda a: a * 2, reference, lambda g: (torch.randn(1024, generator=g).half().cuda(),), trials=2)
    torch.cuda.empty_cache()
    assert r.passed and r.reference_precision == "float16"
    assert "could not run in float64 (it raised OutOfMemoryError" in r.reference_note
