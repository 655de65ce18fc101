"""Tutorial 09's kernels on the GPU: grouped-query attention and flash-decoding, through the tutorial's own
`%%cuda` and `# launchers` cells (notebooks/09-attention-inference.py, compiled as the magic compiles them), against
attention in float64 and SDPA (enable_gqa=True) in the same dtype, on awkward shapes: N = 1, 63, 65, 1000, 1031,
4097; GQA ratios 1, 4, 8 and MQA; bf16 and fp16; d = 64 and 128; causal and not; decode batches of different cache
lengths (0, 1, partial tiles, long), 1 and several query tokens; decoding in one launch (the last block merges the
partials) against its two-kernel step, across split counts, repeated calls, two streams and a CUDA graph. The bar:
our error at most twice SDPA's own plus one rounding of the output in the dtype; rows that see no key are zeros (SDPA
leaves them NaN)."""
import pytest

from notebook_cells import load_tutorial

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ROUNDING = {"bf16": 8e-3, "fp16": 1e-3}            # about two units in the last place at |o| ~ 1


@pytest.fixture(scope="module")
def t09():
    return load_tutorial("09-attention-inference.py")


def within(ours, sdpa, dname):
    return ours <= 2 * sdpa + ROUNDING[dname]


def gqa_case(t09, dname, d, Hq, Hkv, N, causal, B=None, amplitude=1.0, seed=0, launcher="gqa_attention_mma"):
    dtype = DTYPES[dname]
    B = B or (1 if N > 2000 else 2)
    g = torch.Generator().manual_seed(seed)
    q = (amplitude * torch.randn(B, Hq, N, d, generator=g)).to(dtype).cuda()
    k, v = (torch.randn(B, Hkv, N, d, generator=g).to(dtype).cuda() for _ in range(2))
    ref = t09["gqa_reference"](q, k, v, causal)
    out = t09[launcher](q, k, v, causal)
    sd = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert torch.isfinite(out).all()
    return (out.double() - ref).abs().max().item(), (sd.double() - ref).abs().max().item()


@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("Hq, Hkv", [(8, 8), (32, 8), (32, 4), (8, 1)], ids=["ratio1", "ratio4", "ratio8", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa_matches_sdpa_on_awkward_lengths(t09, dname, d, Hq, Hkv, causal):
    failures = []
    for N in (1, 63, 65, 1000, 1031, 4097):
        ours, theirs = gqa_case(t09, dname, d, Hq, Hkv, N, causal)
        if not within(ours, theirs, dname):
            failures.append(f"N={N}: error {ours:.2e} vs float64, SDPA's {theirs:.2e}")
    assert not failures, f"{dname} d={d} Hq={Hq} Hkv={Hkv} causal={causal}: " + "; ".join(failures)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa_peaky_softmax_and_many_heads(t09, causal):
    """Scores of a few tens (the running max moves between tiles) and gridDim.y = B * Hkv = 64."""
    ours, theirs = gqa_case(t09, "bf16", 128, 32, 8, 777, causal, amplitude=4.0)
    assert within(ours, theirs, "bf16"), (ours, theirs)
    ours, theirs = gqa_case(t09, "fp16", 64, 32, 8, 100, causal, B=8)
    assert within(ours, theirs, "fp16"), (ours, theirs)


hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                            reason="the wgmma step needs sm_90 (H100/H200)")


@hopper
@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("Hq, Hkv", [(8, 8), (32, 8), (32, 4), (8, 1)], ids=["ratio1", "ratio4", "ratio8", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_wgmma_gqa_step_matches_sdpa_on_awkward_lengths(t09, dname, d, Hq, Hkv, causal):
    """gqa_attention_wgmma (tutorial 07's wgmma consumer, K/V at KV head h / G through the TMA coordinates)."""
    failures = []
    for N in (1, 63, 65, 1000, 1031, 4097):
        ours, theirs = gqa_case(t09, dname, d, Hq, Hkv, N, causal, launcher="gqa_attention_wgmma")
        if not within(ours, theirs, dname):
            failures.append(f"N={N}: error {ours:.2e} vs float64, SDPA's {theirs:.2e}")
    assert not failures, f"{dname} d={d} Hq={Hq} Hkv={Hkv} causal={causal}: " + "; ".join(failures)


@hopper
def test_the_wgmma_gqa_step_with_peaky_scores_and_many_kv_heads(t09):
    ours, theirs = gqa_case(t09, "bf16", 128, 32, 8, 777, True, B=3, amplitude=4.0, launcher="gqa_attention_wgmma")
    assert within(ours, theirs, "bf16"), (ours, theirs)


def test_gqa_attention_launches_the_step_gqa_step_names(t09):
    """The op's kernel per shape: on sm_90 the wgmma step from GQA_WGMMA_FROM_N, elsewhere the mma.sync kernel; the
    op's output is that launcher's, bit for bit."""
    hopper = torch.cuda.get_device_capability() == (9, 0)
    g = torch.Generator().manual_seed(11)
    for d, N in ((64, 512), (64, 1024), (128, 100), (128, 2000)):
        q = torch.randn(1, 8, N, d, generator=g).bfloat16().cuda()
        k, v = (torch.randn(1, 2, N, d, generator=g).bfloat16().cuda() for _ in range(2))
        want = "wgmma" if hopper and N >= t09["GQA_WGMMA_FROM_N"][d] else "mma.sync"
        assert t09["gqa_step"](q, N, d) == want
        launcher = t09["gqa_attention_wgmma" if want == "wgmma" else "gqa_attention_mma"]
        assert torch.equal(t09["gqa_attention"](q, k, v, True), launcher(q, k, v, True)), (d, N, want)


def decode_case(t09, dname, d, Hq, Hkv, nq, lens, seed=1, Nmax=None):
    dtype = DTYPES[dname]
    g = torch.Generator().manual_seed(seed)
    B, Nmax = len(lens), Nmax or max(lens) + 5
    q = torch.randn(B, Hq, nq, d, generator=g).to(dtype).cuda()
    kc, vc = (torch.randn(B, Hkv, Nmax, d, generator=g).to(dtype).cuda() for _ in range(2))
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    ref = t09["decode_reference"](q, kc, vc, sl)
    out = t09["decode_attention"](q, kc, vc, sl).double()
    mask = t09["decode_mask"](sl, nq, Nmax)
    seen = mask.any(-1, keepdim=True).expand_as(ref)
    sd = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True).double()
    empty_ok = bool((out[~seen] == 0).all())
    return (out - ref).abs().max().item(), (sd - ref)[seen].abs().max().item(), empty_ok


@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("Hq, Hkv", [(32, 8), (64, 8), (8, 8), (16, 1)], ids=["ratio4", "ratio8", "ratio1", "mqa16"])
@pytest.mark.parametrize("nq", [1, 4])
def test_decode_matches_sdpa_on_a_batch_of_cache_lengths(t09, dname, d, Hq, Hkv, nq):
    lens = (0, 1, 31, 33, 63, 65, 1000, 1031, 4097, 20000)
    ours, theirs, empty_ok = decode_case(t09, dname, d, Hq, Hkv, nq, lens)
    assert empty_ok, "a token with no key must give zeros"
    assert within(ours, theirs, dname), f"error {ours:.2e} vs float64, SDPA's {theirs:.2e}"


@pytest.mark.parametrize("L", [1, 1024, 8191, 65537, 131072])
def test_decode_long_caches_one_sequence(t09, L):
    """B = 1 with many splits per head: the combine merges up to a wave's worth of partials."""
    ours, theirs, _ = decode_case(t09, "bf16", 128, 32, 8, 1, (L,))
    assert within(ours, theirs, "bf16"), (L, ours, theirs)


def test_decode_lengths_above_nmax_read_as_nmax(t09):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 8, 1, 64, generator=g).bfloat16().cuda()
    kc, vc = (torch.randn(2, 2, 100, 64, generator=g).bfloat16().cuda() for _ in range(2))
    over = t09["decode_attention"](q, kc, vc, torch.tensor([100, 500], dtype=torch.int32, device="cuda"))
    full = t09["decode_attention"](q, kc, vc, torch.tensor([100, 100], dtype=torch.int32, device="cuda"))
    assert torch.equal(over, full)


def test_the_ops_compile_and_capture(t09):
    """torch.ops.kl.gqa_attention / decode_attention eagerly, under torch.compile(fullgraph=True) and in a CUDA
    graph give the launchers' results."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 32, 300, 128, generator=g).bfloat16().cuda()
    k, v = (torch.randn(2, 8, 300, 128, generator=g).bfloat16().cuda() for _ in range(2))
    want = t09["gqa_attention"](q, k, v, True)
    assert torch.equal(torch.ops.kl.gqa_attention(q, k, v, True), want)
    f = torch.compile(lambda q, k, v: torch.ops.kl.gqa_attention(q, k, v, True), fullgraph=True)
    assert torch.equal(f(q, k, v), want)
    qd = torch.randn(3, 32, 1, 128, generator=g).bfloat16().cuda()
    kc, vc = (torch.randn(3, 8, 5000, 128, generator=g).bfloat16().cuda() for _ in range(2))
    sl = torch.tensor([5000, 17, 2600], dtype=torch.int32, device="cuda")
    want = t09["decode_attention"](qd, kc, vc, sl)
    assert torch.equal(torch.ops.kl.decode_attention(qd, kc, vc, sl), want)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        torch.ops.kl.decode_attention(qd, kc, vc, sl)             # warm-up on the capturing stream
        with torch.cuda.graph(graph, stream=stream):
            captured = torch.ops.kl.decode_attention(qd, kc, vc, sl)
    torch.cuda.current_stream().wait_stream(stream)
    sl.copy_(torch.tensor([4000, 1, 0], dtype=torch.int32))       # the graph reads the new lengths
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, t09["decode_attention"](qd, kc, vc, sl))


# --- flash-decoding in one launch (decode_attention: the combine in the last block) against the two-kernel step ----

def decode_inputs(B, Hq, Hkv, nq, Nmax, d, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, nq, d, generator=g).to(dtype).cuda()
    kc, vc = (torch.randn(B, Hkv, Nmax, d, generator=g).to(dtype).cuda() for _ in range(2))
    return q, kc, vc


@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_the_two_kernel_step_matches_sdpa_and_the_fused_kernel(t09, dname, d):
    """decode_attention_two_kernels (split kernel + combine kernel) on the awkward batch, and the one-launch op
    against it: the same partials merged by the same formula in another order, so at most one unit in the last place
    of the output apart."""
    lens = (0, 1, 31, 33, 63, 65, 1000, 1031, 4097, 20000)
    q, kc, vc = decode_inputs(len(lens), 32, 8, 4, max(lens) + 5, d, seed=7, dtype=DTYPES[dname])
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    ref = t09["decode_reference"](q, kc, vc, sl)
    two = t09["decode_attention_two_kernels"](q, kc, vc, sl).double()
    fused = t09["decode_attention"](q, kc, vc, sl).double()
    mask = t09["decode_mask"](sl, 4, kc.shape[2])
    seen = mask.any(-1, keepdim=True).expand_as(ref)
    sd = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True).double()
    theirs = (sd - ref)[seen].abs().max().item()
    assert within((two - ref).abs().max().item(), theirs, dname)
    ulp = torch.finfo(DTYPES[dname]).eps * two.abs().clamp(min=1.0)           # one unit in the last place, or more
    assert ((fused - two).abs() <= 1.01 * ulp).all(), (fused - two).abs().max().item()


@pytest.mark.parametrize("L", [512, 1000, 1031, 2048, 4097])
def test_the_fused_decode_at_the_plans_default_floor(t09, L):
    """The op's default split floor (decode_floor: 16 to 64 keys a warp on short caches) on awkward cache lengths,
    B = 1 and a batch of different lengths, GQA 4: against float64 as closely as SDPA, and against min_keys 64."""
    for lens in ((L,), (L, 1, 63, 65)):
        q, kc, vc = decode_inputs(len(lens), 32, 8, 1, L, 128, seed=L + len(lens))
        sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        ref = t09["decode_reference"](q, kc, vc, sl)
        out = t09["decode_attention"](q, kc, vc, sl).double()
        sd = F.scaled_dot_product_attention(q, kc, vc, attn_mask=t09["decode_mask"](sl, 1, L), enable_gqa=True)
        seen = t09["decode_mask"](sl, 1, L).any(-1, keepdim=True).expand_as(ref)
        theirs = (sd.double() - ref)[seen].abs().max().item()
        assert within((out - ref).abs().max().item(), theirs, "bf16"), (lens, t09["decode_floor"](len(lens), 8, 1, L))
        at64 = t09["decode_attention"](q, kc, vc, sl, min_keys=64).double()
        assert within((at64 - ref).abs().max().item(), theirs, "bf16"), lens


@pytest.mark.parametrize("min_keys", [16, 32, 64, 128])
@pytest.mark.parametrize("L", [8192, 8191, 33000])
def test_the_fused_decode_for_split_counts_the_benchmark_sweeps(t09, min_keys, L):
    """B = 1 and one different-length batch with each min_keys the benchmark times: every plan merges right (from
    1 to a wave's worth of block partials per head)."""
    for lens in ((L,), (L, 1, 0, L // 3)):
        q, kc, vc = decode_inputs(len(lens), 32, 8, 1, L, 128, seed=L + min_keys)
        sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        ref = t09["decode_reference"](q, kc, vc, sl)
        out = t09["decode_attention"](q, kc, vc, sl, min_keys=min_keys).double()
        sd = F.scaled_dot_product_attention(q, kc, vc, attn_mask=t09["decode_mask"](sl, 1, L), enable_gqa=True)
        seen = t09["decode_mask"](sl, 1, L).any(-1, keepdim=True).expand_as(ref)
        theirs = (sd.double() - ref)[seen].abs().max().item()
        assert within((out - ref).abs().max().item(), theirs, "bf16"), (lens, min_keys)


@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("L", [1024, 8191, 33000])               # 4, 32 and 33 block partials at B = 1
def test_the_merge_variant_with_16_loads_matches_the_default(t09, dname, L):
    """decode_attention(merge_loads=16), the decode profile's variant (the last block keeps 16 partial loads in
    flight): against float64 and SDPA's error on one full cache and a batch of different lengths, and within one
    unit in the last place of the default (the same sums in the same order)."""
    for lens in ((L,), (L, 1, 0, L // 3)):
        q, kc, vc = decode_inputs(len(lens), 32, 8, 1, L, 128, seed=L + 16, dtype=DTYPES[dname])
        sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        ref = t09["decode_reference"](q, kc, vc, sl)
        out = t09["decode_attention"](q, kc, vc, sl, merge_loads=16)
        sd = F.scaled_dot_product_attention(q, kc, vc, attn_mask=t09["decode_mask"](sl, 1, L), enable_gqa=True)
        seen = t09["decode_mask"](sl, 1, L).any(-1, keepdim=True).expand_as(ref)
        theirs = (sd.double() - ref)[seen].abs().max().item()
        assert within((out.double() - ref).abs().max().item(), theirs, dname), (lens, L)
        default = t09["decode_attention"](q, kc, vc, sl).double()
        ulp = torch.finfo(DTYPES[dname]).eps * default.abs().clamp(min=1.0)
        assert ((out.double() - default).abs() <= 1.01 * ulp).all(), (lens, L)


@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("Hq, Hkv", [(8, 8), (32, 8), (64, 8)], ids=["ratio1", "ratio4", "ratio8"])
@pytest.mark.parametrize("lens", [(1,), (63,), (65,), (1000,), (1031,), (4097,), (33000,),
                                  (4097, 1, 0, 65, 1031)], ids=lambda x: "-".join(map(str, x)))
def test_the_online_merge_matches_sdpa_and_the_default(t09, dname, Hq, Hkv, lens):
    """decode_attention(merge="online"), the decode profile's variant (the last block merges the partials in one
    pass, a running max): against float64 and SDPA's error on awkward cache lengths (one block a head up to 65 keys,
    then 4, 16 and 33 block partials at 1k, 4k and 33k) and a batch of different lengths (6 partials a head, most of
    the short sequences' empty), GQA ratios 1, 4 and 8; zeros where a token sees no key; the default merge's output up
    to rounding (the same partials, summed in another order)."""
    L = max(lens) + 5
    q, kc, vc = decode_inputs(len(lens), Hq, Hkv, 1, L, 128, seed=sum(lens) + Hq, dtype=DTYPES[dname])
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    ref = t09["decode_reference"](q, kc, vc, sl)
    out = t09["decode_attention"](q, kc, vc, sl, merge="online")
    mask = t09["decode_mask"](sl, 1, L)
    sd = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
    seen = mask.any(-1, keepdim=True).expand_as(ref)
    theirs = (sd.double() - ref)[seen].abs().max().item()
    assert within((out.double() - ref).abs().max().item(), theirs, dname), lens
    assert (out[~seen] == 0).all(), lens
    default = t09["decode_attention"](q, kc, vc, sl).double()
    ulp = torch.finfo(DTYPES[dname]).eps * default.abs().clamp(min=1.0)
    assert ((out.double() - default).abs() <= 2.01 * ulp).all(), lens
    assert torch.equal(t09["decode_attention"](q, kc, vc, sl, merge="online"), out)      # counters reset, same sums


@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("merge", ["shared", "online"])
@pytest.mark.parametrize("Hq, Hkv", [(8, 8), (32, 8), (64, 8)], ids=["ratio1", "ratio4", "ratio8"])
@pytest.mark.parametrize("lens, extra", [((1,), 0), ((63,), 0), ((1000,), 0), ((1031,), 3), ((4097,), 0),
                                         ((33000,), 5), ((4097, 1, 0, 65, 1031), 0)],
                         ids=lambda x: "-".join(map(str, x)) if isinstance(x, tuple) else f"nmax+{x}")
def test_the_early_first_tile_matches_sdpa_and_the_default(t09, dname, merge, Hq, Hkv, lens, extra):
    """decode_attention(early=True), the decode profile's variant (each warp asks for its first tile before
    cache_seqlens arrives, guessing a full cache): with NaN in the cache past every sequence's length, against float64
    and SDPA's error (both on the cleaned cache), guesses right (full caches), right with rows past L (L = Nmax - 3,
    Nmax - 5) and wrong (the batch's short sequences); bitwise the launch without the guess (the same tiles)."""
    L = max(lens) + extra
    q, kc, vc = decode_inputs(len(lens), Hq, Hkv, 1, L, 128, seed=sum(lens) + Hq + 7, dtype=DTYPES[dname])
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    ref = t09["decode_reference"](q, kc, vc, sl)
    mask = t09["decode_mask"](sl, 1, L)
    sd = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
    seen = mask.any(-1, keepdim=True).expand_as(ref)
    theirs = (sd.double() - ref)[seen].abs().max().item()
    for b, n in enumerate(lens):
        kc[b, :, n:], vc[b, :, n:] = float("nan"), float("nan")
    out = t09["decode_attention"](q, kc, vc, sl, merge=merge, early=True)
    assert not out.isnan().any(), lens
    assert within((out.double() - ref).abs().max().item(), theirs, dname), lens
    assert torch.equal(out, t09["decode_attention"](q, kc, vc, sl, merge=merge)), lens


def test_the_fused_decode_is_deterministic_and_resets_its_counters(t09):
    """Which block draws the last ticket changes from call to call, the merge order does not: 300 calls give the
    same bits (a block merging before every partial is written would not). After them every counter is 0 again, and
    a call with another plan in between (other counters in use) changes nothing."""
    q, kc, vc = decode_inputs(2, 32, 8, 1, 40000, 128, seed=21)
    sl = torch.tensor([40000, 17001], dtype=torch.int32, device="cuda")
    first = t09["decode_attention"](q, kc, vc, sl)
    plan = t09["decode_plan"](2, 8, 4, 1, 40000, 128, t09["SMS"], t09["DEC_MIN_KEYS"])
    assert plan.splits // 4 > 1, plan                                        # the ticket path, not one block a head
    q2, kc2, vc2 = decode_inputs(5, 16, 2, 2, 3000, 64, seed=22)
    sl2 = torch.tensor([3000, 2999, 5, 0, 1500], dtype=torch.int32, device="cuda")
    other = t09["decode_attention"](q2, kc2, vc2, sl2)
    differ = 0
    for i in range(300):
        differ += not torch.equal(t09["decode_attention"](q, kc, vc, sl), first)
        if i == 150:
            assert torch.equal(t09["decode_attention"](q2, kc2, vc2, sl2), other)
    torch.cuda.synchronize()
    assert differ == 0, f"{differ} of 300 calls differ from the first"
    assert all(int(c.abs().sum()) == 0 for c in t09["_DEC_COUNTERS"].values())


def test_the_fused_decode_on_two_streams_at_once(t09):
    """Calls queued on two streams run concurrently; each stream has its own counters, so both are right."""
    q, kc, vc = decode_inputs(1, 32, 8, 1, 65536, 128, seed=23)
    sl = torch.tensor([65536], dtype=torch.int32, device="cuda")
    want = t09["decode_attention"](q, kc, vc, sl)
    streams = [torch.cuda.Stream() for _ in range(2)]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    for _ in range(20):
        for s in streams:
            with torch.cuda.stream(s):
                outs.append(t09["decode_attention"](q, kc, vc, sl))
    torch.cuda.synchronize()
    assert all(torch.equal(o, want) for o in outs)


def test_the_fused_decode_captured_without_a_warm_up(t09):
    """Captured on a stream that never ran it (the kernel loaded by a call on the default stream): the counters are
    made (zeroed) inside the graph, so every replay starts from zeros; replays follow new lengths."""
    q, kc, vc = decode_inputs(3, 32, 8, 1, 9000, 128, seed=24)
    sl = torch.tensor([9000, 4000, 1], dtype=torch.int32, device="cuda")
    t09["decode_attention"](q, kc, vc, sl)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            captured = t09["decode_attention"](q, kc, vc, sl)
    torch.cuda.current_stream().wait_stream(stream)
    for lens in ((9000, 4000, 1), (100, 8999, 0), (9000, 4000, 1)):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, t09["decode_attention"](q, kc, vc, sl)), lens
