"""Programmatic dependent launch (PDL) on the GPU: kernellab's pdl=True launch (cuLaunchKernelEx with
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) and tutorial 09's decode step behind its producer
(decode_append, then decode_attention(pdl=True)), through the tutorial's own `%%cuda` and `# launchers` cells.

The producer spins before it writes (spin=, clock cycles) so that a consumer reading its output before
griddepcontrol.wait would see stale data: the PDL results must equal the plain launches' bit for bit, eagerly, through
the registered op and replayed from a captured CUDA graph. A control kernel that does NOT wait shows that PDL really
lets the consumer run during the producer (else the other tests would prove nothing). On a GPU below sm_90 pdl=True is
a plain launch: the equalities still hold and the control is skipped."""
import pytest

from notebook_cells import load_tutorial

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
import kernellab  # noqa: E402
from kernellab.run.launch.launch import deferred_sync  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SPIN = 2_000_000           # about 1 ms at 1.7-2 GHz: far longer than a decode launch takes to start
ROUNDING = {"bf16": 1.2e-2, "fp16": 2e-3}


def hopper():
    return torch.cuda.get_device_capability() >= (9, 0)


@pytest.fixture(scope="module")
def t09():
    return load_tutorial("09-attention-inference.py")


PAIR = r'''
#include <kl/pdl.cuh>
extern "C" __global__ void producer(const float* x, float* y, int n, long long spin) {
    griddepcontrol_launch_dependents();
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
extern "C" __global__ void consumer(const float* y, float* z, int n) {
    griddepcontrol_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = y[i] + 1.0f;
}
extern "C" __global__ void consumer_no_wait(const float* y, float* z, int n) {     // the control: reads too early
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = y[i] + 1.0f;
}
'''


@pytest.fixture(scope="module")
def pair():
    return kernellab.compile_cuda(PAIR, name="pdl_pair")


def test_a_pdl_launch_waits_for_its_producer_and_the_control_shows_it_overlaps(pair):
    n = 4096
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    for launch_pdl in (False, True):
        y, z = torch.zeros(n, device="cuda"), torch.full((n,), -1.0, device="cuda")
        pair.producer[n // 256, 256](x, y, n, SPIN, sync=False)
        pair.consumer[n // 256, 256](y, z, n, pdl=launch_pdl, sync=False)
        torch.cuda.synchronize()
        assert torch.equal(z, 2 * x + 1), f"pdl={launch_pdl}: the consumer read y before the producer wrote it"
    if not hopper():
        pytest.skip("below sm_90 pdl=True is a plain launch: no overlap to show")
    y, z = torch.zeros(n, device="cuda"), torch.full((n,), -1.0, device="cuda")
    pair.producer[n // 256, 256](x, y, n, SPIN, sync=False)
    pair.consumer_no_wait[n // 256, 256](y, z, n, pdl=True, sync=False)
    torch.cuda.synchronize()
    stale = (z == 1.0).float().mean().item()          # y read as 0: before the producer's write
    assert stale > 0.5, (f"a consumer without griddepcontrol.wait launched with pdl=True read the producer's output "
                         f"after it was written ({stale:.0%} stale): the launch did not overlap the producer, so PDL "
                         f"is not in effect (driver, attribute or capture)")


def step_inputs(B, Hq, Hkv, nq, L, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    Nmax = L + 7
    kc, vc = (torch.randn(B, Hkv, Nmax, d, generator=g).to(dtype).cuda() for _ in range(2))
    qkv = torch.randn(B, Hq + 2 * Hkv, nq, d, generator=g).to(dtype).cuda()
    old = torch.tensor([max(0, L - nq - 3 * b) for b in range(B)], dtype=torch.int32, device="cuda")
    return qkv, kc, vc, old


def run_step(t09, qkv, kc, vc, old, pdl, spin=SPIN, op=False, q=None, seqlens=None):
    """The producer (decode_append, spinning `spin` cycles before it writes), then the decode behind it, both queued
    without waiting (deferred_sync: at the top level a launch would wait for its kernel, and the decode would never
    meet a running producer)."""
    with deferred_sync():
        q, sl = t09["decode_append"](qkv, kc, vc, old, spin=spin, q=q, seqlens=seqlens)
        if op:
            return (torch.ops.kl.decode_attention_pdl if pdl else torch.ops.kl.decode_attention)(q, kc, vc, sl), q, sl
        return t09["decode_attention"](q, kc, vc, sl, pdl=pdl), q, sl


def poison(q, sl, kc, vc, old, nq):
    """What a read before the producer's writes would see: q NaN, cache_seqlens 0, the new K/V rows NaN."""
    q.fill_(float("nan"))
    sl.zero_()
    for b, n in enumerate(old.tolist()):
        kc[b, :, n:n + nq] = float("nan")
        vc[b, :, n:n + nq] = float("nan")


@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("d, L, B, nq", [(128, 1024, 1, 1), (128, 8192, 1, 1), (64, 1031, 3, 2), (128, 4097, 2, 4)])
def test_the_pdl_decode_step_equals_the_plain_one(t09, dname, d, L, B, nq):
    """decode_attention(pdl=True) behind a producer that writes q, the new K/V rows and cache_seqlens late (into
    buffers holding NaN and 0 until then): the same output bit for bit as the plain launch on the same state, and
    within the float64 reference's bar."""
    dtype = DTYPES[dname]
    qkv, kc, vc, old = step_inputs(B, 32, 8, nq, L, d, dtype, seed=L + d + B)
    plain, q, sl = run_step(t09, qkv, kc, vc, old, pdl=False)
    for pdl in (False, True):                   # the plain step again after the poison (the control), then PDL's
        poison(q, sl, kc, vc, old, nq)
        out, q2, sl2 = run_step(t09, qkv, kc, vc, old, pdl=pdl, q=q, seqlens=sl)
        torch.cuda.synchronize()
        assert torch.equal(sl2, sl) and torch.equal(q2, qkv[:, :32]) and q2.data_ptr() == q.data_ptr()
        assert torch.equal(out, plain), (
            f"{dname} d={d} L={L} B={B} nq={nq} pdl={pdl}: the decode differs from the first step by "
            f"{(out.double() - plain.double()).abs().nan_to_num(float('inf')).max().item():.3e}: it read something "
            f"of the producer's (q, cache_seqlens or the new K/V rows) before griddepcontrol.wait")
    ref = t09["decode_reference"](q, kc, vc, sl)
    assert (plain.double() - ref).abs().max().item() < ROUNDING[dname]
    assert all((c == 0).all() for c in t09["_DEC_COUNTERS"].values())          # reset by the last blocks


def test_the_pdl_op_and_a_captured_cuda_graph_give_the_plain_result(t09):
    """torch.ops.kl.decode_attention_pdl behind the producer, eagerly and replayed from a CUDA graph captured with
    both launches (the graph keeps the programmatic edge); new inputs copied in before a replay are used."""
    qkv, kc, vc, old = step_inputs(1, 32, 8, 1, 8192, 128, torch.bfloat16, seed=3)
    want, _, _ = run_step(t09, qkv, kc, vc, old, pdl=False, op=True)
    eager, _, _ = run_step(t09, qkv, kc, vc, old, pdl=True, op=True)
    assert torch.equal(eager, want)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_step(t09, qkv, kc, vc, old, pdl=True, op=True)           # warm-up on the capturing stream
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured, _, _ = run_step(t09, qkv, kc, vc, old, pdl=True, op=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, want)
    g = torch.Generator().manual_seed(11)
    qkv.copy_(torch.randn(qkv.shape, generator=g).to(qkv.dtype))     # a new token: q and the new K/V row change
    graph.replay()
    again, _, _ = run_step(t09, qkv, kc, vc, old, pdl=False, op=True)
    torch.cuda.synchronize()
    assert not torch.equal(again, want) and torch.equal(captured, again)
