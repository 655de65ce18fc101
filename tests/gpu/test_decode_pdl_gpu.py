"""Programmatic dependent launch (PDL) on the GPU: kernellab's pdl=True launch (cuLaunchKernelEx with
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) and tutorial 09's decode step behind its producer
(decode_append, then decode_attention(pdl=True)), through the tutorial's own `%%cuda` and `# launchers` cells.

The producer spins before it writes (spin=, clock cycles) so that a consumer reading its output before
griddepcontrol.wait would see stale data: the PDL results must equal the plain launches' bit for bit, eagerly, through
the registered op and replayed from a captured CUDA graph. A control kernel that does NOT wait shows that PDL really
lets the consumer run during the producer (else the other tests would prove nothing). On a GPU below sm_90 pdl=True is
a plain launch: the equalities still hold and the control is skipped."""
import time

import pytest

from notebook_cells import load_tutorial

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
import kernellab  # noqa: E402
from kernellab.run.launch.launch import RECENT_LAUNCHES, deferred_sync  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SPIN = 2_000_000           # about 1 ms at 1.7-2 GHz: far longer than a decode launch takes to start
SPIN_CONTROL = 40_000_000  # about 20 ms: the overlap control's producer (CUDA's own PDL test spins 50 ms)
ROUNDING = {"bf16": 1.2e-2, "fp16": 2e-3}


def hopper():
    return torch.cuda.get_device_capability() >= (9, 0)


@pytest.fixture(scope="module")
def t09():
    return load_tutorial("09-attention-inference.py")


PAIR = r"""
#include <kl/pdl.cuh>
__device__ __forceinline__ long long now_ns() {                   // %globaltimer: ns, one clock for every SM
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// t: [2 * blocks] int64, each block's start and end (ns)
extern "C" __global__ void producer(const float* x, float* y, int n, long long spin, long long* t) {
    griddepcontrol_launch_dependents();
    const long long start = now_ns(), t0 = clock64();
    while (clock64() - t0 < spin) {}
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
    __syncthreads();
    if (threadIdx.x == 0) { t[2 * blockIdx.x] = start; t[2 * blockIdx.x + 1] = now_ns(); }
}
// t: [blocks] int64, each block's start (ns): for consumer after its wait, for the control first thing
extern "C" __global__ void consumer(const float* y, float* z, int n, long long* t) {
    griddepcontrol_wait();
    if (threadIdx.x == 0) t[blockIdx.x] = now_ns();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = y[i] + 1.0f;
}
extern "C" __global__ void consumer_no_wait(const float* y, float* z, int n, long long* t) {   // the control
    if (threadIdx.x == 0) t[blockIdx.x] = now_ns();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = y[i] + 1.0f;
}
"""
N, BLOCK = 4096, 256


@pytest.fixture(scope="module")
def pair():
    return kernellab.compile_cuda(PAIR, name="pdl_pair")


def pair_run(mod, consumer, pdl, stream=None, spin=SPIN):
    """The producer (spinning `spin` cycles, then y = 2 x, x = 1 .. n), then `consumer` launched with pdl=, both
    without waiting on `stream` (None: torch's current one). Returns what the consumer saw and when it ran: the
    fraction of z read before the producer's write (y still 0: z == 1), the first consumer block's start against the
    last producer block's end (us; negative: it started while the producer ran), the producer's span (us) and the
    host's time between the two launch calls (us)."""
    x = torch.arange(1, N + 1, dtype=torch.float32, device="cuda")
    y, z = torch.zeros(N, device="cuda"), torch.full((N,), -1.0, device="cuda")
    tp = torch.zeros(2 * (N // BLOCK), dtype=torch.int64, device="cuda")
    tc = torch.zeros(N // BLOCK, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream if stream is not None else torch.cuda.current_stream()):
        h0 = time.perf_counter()
        mod.producer[N // BLOCK, BLOCK](x, y, N, spin, tp, sync=False)
        h1 = time.perf_counter()
        mod[consumer][N // BLOCK, BLOCK](y, z, N, tc, pdl=pdl, sync=False)
    torch.cuda.synchronize()
    starts, ends = tp[0::2], tp[1::2]
    return {"z": z, "x": x, "stale": (z == 1.0).float().mean().item(),
            "start_vs_end_us": (tc.min() - ends.max()).item() / 1e3,
            "producer_us": (ends.max() - starts.min()).item() / 1e3, "host_gap_us": (h1 - h0) * 1e6,
            "stream": stream_name(stream)}


def stream_name(stream) -> str:
    handle = (stream if stream is not None else torch.cuda.current_stream()).cuda_stream
    return (f"{'torch.cuda.Stream()' if stream is not None else 'current stream'} {handle:#x}"
            + (" = the legacy default stream" if handle == 0 else ""))


def describe(rows: dict) -> str:
    return "; ".join(f"{name} [{r['stream']}]: {r['stale']:.0%} stale, first consumer block "
                     f"{r['start_vs_end_us']:+.1f} us after the producer's end (producer {r['producer_us']:.0f} us, "
                     f"launch calls {r['host_gap_us']:.0f} us apart)" for name, r in rows.items())


def test_a_pdl_launch_waits_for_its_producer_and_the_control_shows_it_overlaps(pair):
    """consumer (griddepcontrol.wait first) reads the producer's output, plain and with pdl=True; the control without
    the wait, launched with pdl=True, starts while the producer spins (globaltimer stamps) and reads y stale, on
    torch's default stream and on a torch.cuda.Stream(). Every kernel has been launched once before (warm): a kernel's
    first launch loads it (cuModuleGetFunction; CUDA's lazy loading may synchronise the context) and builds its launch
    on the host, which alone may outlast the producer. A fresh copy's cold first launch is reported, not asserted."""
    side = torch.cuda.Stream()
    for stream in (None, side):                 # warm: every kernel, both configurations, both streams
        for consumer in ("consumer", "consumer_no_wait"):
            for launch_pdl in (False, True):
                pair_run(pair, consumer, launch_pdl, stream, spin=0)
    for stream in (None, side):
        for launch_pdl in (False, True):
            r = pair_run(pair, "consumer", launch_pdl, stream)
            assert torch.equal(r["z"], 2 * r["x"] + 1), (
                f"pdl={launch_pdl} on {r['stream']}: the consumer read y before the producer wrote it "
                f"({r['stale']:.0%} stale): griddepcontrol.wait did not wait")
            assert r["start_vs_end_us"] >= 0, (f"pdl={launch_pdl} on {r['stream']}: a consumer block passed its "
                                               f"wait before the producer ended")
    if not hopper():
        pytest.skip("below sm_90 pdl=True is a plain launch: no overlap to show")
    overlapped = lambda r: r["stale"] > 0.5 and r["start_vs_end_us"] < 0
    rows = {}
    for name, stream in (("control, pdl=True", None), ("control, pdl=True, side stream", side)):
        for attempt in range(3):            # the overlap is opportunistic (the driver promises none): up to 3 tries
            rows[name] = pair_run(pair, "consumer_no_wait", True, stream, spin=SPIN_CONTROL)
            rows[name]["stream"] += f", try {attempt + 1}"
            if overlapped(rows[name]):
                break
    rows["control, plain"] = pair_run(pair, "consumer_no_wait", False, spin=SPIN_CONTROL)
    cold = kernellab.compile_cuda(PAIR + "\n// a fresh module: its kernels not yet loaded\n", name="pdl_pair_cold")
    cold.producer[N // BLOCK, BLOCK](torch.ones(N, device="cuda"), torch.zeros(N, device="cuda"), N, 0,
                                     torch.zeros(2 * (N // BLOCK), dtype=torch.int64, device="cuda"))
    rows["control, pdl=True, its first launch"] = pair_run(cold, "consumer_no_wait", True, spin=SPIN)
    print("PDL overlap: " + describe(rows))
    plain = rows["control, plain"]
    assert plain["stale"] == 0 and plain["start_vs_end_us"] >= 0, (
        "a plain launch overlapped its producer: " + describe(rows))
    missed = [name for name in ("control, pdl=True", "control, pdl=True, side stream")
              if not overlapped(rows[name])]
    assert not missed, (f"{' and '.join(missed)} did not overlap the producer (PDL not in effect there): "
                        + describe(rows))


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


def launched(n=2):
    """The last n launches that did not wait, as kernellab recorded them: (kernel, grid, block, shared bytes, pdl)."""
    return [(e[0], e[1].grid, e[1].block, e[1].shared_bytes, e[1].pdl) for e in list(RECENT_LAUNCHES)[-n:]]


def every_way_in(t09, qkv, kc, vc, old, nq):
    """The step through the launcher and the op, plain and with PDL, each twice: on the same q and cache_seqlens
    buffers poisoned first (an early read sees NaN / 0) and on fresh ones (torch.empty: an early read sees whatever
    the allocator's block held). {(way, pdl, buffers, repeat): (out, the two launches)}, and the first plain output."""
    base, q, sl = run_step(t09, qkv, kc, vc, old, pdl=False)
    torch.cuda.synchronize()
    rows = {}
    for buffers in ("poisoned", "fresh"):
        for way in ("launcher", "op"):
            for pdl in (False, True):
                for rep in (1, 2):
                    if buffers == "poisoned":
                        poison(q, sl, kc, vc, old, nq)
                    out, _, _ = run_step(t09, qkv, kc, vc, old, pdl=pdl, op=way == "op",
                                         **({"q": q, "seqlens": sl} if buffers == "poisoned" else {}))
                    torch.cuda.synchronize()
                    rows[(way, pdl, buffers, rep)] = (out, launched())
    return base, q, sl, rows


def diagnosis(t09, base, q, kc, vc, sl, rows, shape) -> str:
    """What each way in launched and how its output compares with the first plain step's and the float64 reference's."""
    B, Hq, Hkv, nq, d = shape
    plan = t09["decode_plan"](B, Hkv, Hq // Hkv, nq, kc.shape[2], d, t09["SMS"])
    ref = t09["decode_reference"](q, kc, vc, sl)
    lines = [f"plan {plan} on {t09['SMS']} SMs; the first plain step: {(base.double() - ref).abs().max().item():.2e} "
             f"from float64"]
    for (way, pdl, buffers, rep), (out, launches) in rows.items():
        diff = (out.double() - base.double()).abs().nan_to_num(float("inf"))
        heads = sorted({int(h) for h in (diff.amax(dim=(0, 2, 3)) > 0).nonzero().flatten()})
        err = (out.double() - ref).abs().nan_to_num(float("inf")).max().item()
        lines.append(f"{way} pdl={pdl} {buffers} #{rep}: {'equal' if torch.equal(out, base) else 'DIFFERS'} "
                     f"(max {diff.max().item():.2e}, heads {heads}; {err:.2e} from float64), launched {launches}")
    return "\n".join(lines)


def test_the_pdl_op_and_a_captured_cuda_graph_give_the_plain_result(t09):
    """torch.ops.kl.decode_attention_pdl behind the producer, eagerly and replayed from a CUDA graph captured with
    both launches (the graph keeps the programmatic edge); new inputs copied in before a replay are used. Eagerly,
    every way in (launcher and op, plain and PDL, twice, on poisoned and on fresh buffers) is compared with the first
    plain step; on a difference the message lists what each launched (kernel, grid, pdl) and its error."""
    qkv, kc, vc, old = step_inputs(1, 32, 8, 1, 8192, 128, torch.bfloat16, seed=3)
    base, q, sl, rows = every_way_in(t09, qkv, kc, vc, old, 1)
    text = diagnosis(t09, base, q, kc, vc, sl, rows, (1, 32, 8, 1, 128))
    print(text)
    assert all(torch.equal(out, base) for out, _ in rows.values()), "the decode step differs by way in:\n" + text
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
