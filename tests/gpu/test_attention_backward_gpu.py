"""Tutorial 08's attention backward on the GPU, as the notebook launches it (its `# launchers` cells, load_tutorial).

Every variant ((a) dQ by atomics, (b) dQ in its own pass, the ladder's rungs 3-9, step 3's Hopper backward
"hopper": wgmma + TMA at d = 64 and 128 on sm_90, the atomic_w8 rung elsewhere, and step 3b's "hopper_rows"), dtype,
head dim and mask on
N = 1, 63, 65, 1000, 1031, 4097: dQ, dK, dV into NaN-filled outputs against the float64 reference, our max error at most 2x SDPA's own (SDPA's
backward in the same dtype, same inputs, same reference). The forward's LSE against float64; the op's loss.backward()
against float64 beside SDPA's, eager and under torch.compile(fullgraph=True).
"""
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
from notebook_cells import load_tutorial  # noqa: E402

NB = "08-attention-backward.py"


@pytest.fixture(scope="module")
def t08():
    return load_tutorial(NB)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("variant", ["atomic", "pass", "atomic_v2", "pass_w8", "atomic_w8", "pass_lean",
                                     "atomic_lean", "pass_2d", "atomic_2d", "atomic_2d_ilp", "atomic_fa2",
                                     "hopper", "hopper_rows"])   # (a), (b), the ladder, steps 3 and 3b
def test_gradients_within_twice_sdpas_own_error(t08, variant, dtype, d, causal):
    rows = [t08["check_backward"](variant, t08["DTYPES"][dtype], d, causal, N) for N in t08["CHECK_N"]]
    for r in rows:
        print(f"{variant} {dtype} d={d} causal={causal} N={r['N']}: error {r['error']:.3e}, SDPA's own "
              f"{r['sdpa_error']:.3e}")
    bad = [r for r in rows if not r["passed"]]
    assert not bad, bad


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_step3_runs_the_hopper_kernel_and_agrees_with_step2(t08, dtype, d, causal):
    """On an sm_90 GPU variant "hopper" is step 3's kernel itself (not the fallback) at d = 64 and 128: its 384-thread
    block launches (three warpgroups, 168 registers at launch, setmaxnreg 24 / 240; at d = 128 165 KB of shared memory
    and dQ split by columns over the warpgroups), and its gradients agree with step 2's atomic_w8 on the same inputs
    (both are checked against float64 above). The op takes it where BWD_OP_HOPPER is on, at BWD_OP_HOPPER_DIMS (d = 64
    and 128, each measured faster than atomic_w8 on an H100)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("step 3's kernels are sm_90a (Hopper) only")
    dt = t08["DTYPES"][dtype]
    g = torch.Generator().manual_seed(7)
    q, k, v, grad_o = (torch.randn(3, 2, 1031, d, generator=g).to(dt).cuda() for _ in range(4))
    assert t08["hopper_backward_applies"](q) and t08["HBWD_THREADS"] == 384
    assert (t08["BWD_OP_VARIANT"][d, causal] == "hopper") == (t08["BWD_OP_HOPPER"] and d in t08["BWD_OP_HOPPER_DIMS"])
    for name in (f"hbwd_bf16_d{d}", f"hbwd_bf16_d{d}_causal"):
        print(name, t08["attn_bwd_h"][name].resources)       # the log says what launched (or failed to)
    o, lse = t08["attention_forward"](q, k, v, causal)
    nan = [torch.full_like(q, float("nan")) for _ in range(3)]
    ours = t08["attention_backward_hopper"](q, k, v, o, lse, grad_o, causal, *nan)
    step2 = t08["attention_backward"](q, k, v, o, lse, grad_o, causal, "atomic_w8")
    want = t08["attention_backward_reference"](q, k, v, grad_o, causal)[2:]
    for name, a, b, w in zip(("dq", "dk", "dv"), ours, step2, want):
        err, err2 = (a.double() - w).abs().max().item(), (b.double() - w).abs().max().item()
        print(f"hopper {dtype} d={d} causal={causal} {name}: error {err:.3e}, atomic_w8's {err2:.3e}")
        assert torch.isfinite(a).all(), f"{name}: rows left unwritten"
        assert err <= 2 * err2 + 1e-6, f"{name}: step 3 {err:.3e} against float64, step 2's atomic_w8 {err2:.3e}"


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("N", [63, 1000, 1031, 4096, 4097])
def test_atomic_2d_ilp_with_aligned_and_shifted_lse_alike(t08, N, d):
    """Rung 9 copies a step's LSE and Dv rows by 16-byte cp.async (N % 4 == 0 and a 16-byte aligned LSE: N = 1000 with
    a short last query tile, 4096), else the launcher runs rung 8 (N = 63, 1031, 4097; an LSE 4 bytes into its storage,
    a contiguous view at offset 1). The same inputs both ways give the same dK and dV bit for bit (no reductions in
    them) and dQ within fp32 reordering; both match float64 within 2x SDPA's own error."""
    g = torch.Generator().manual_seed(N + d)
    q, k, v, grad_o = (torch.randn(2, 2, N, d, generator=g).to(torch.bfloat16).cuda() for _ in range(4))
    o, lse = t08["attention_forward"](q, k, v, False)
    shifted = torch.empty(lse.numel() + 1, device="cuda")[1:].view_as(lse)
    shifted.copy_(lse)
    assert lse.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 == 4 and shifted.is_contiguous()
    a = t08["attention_backward"](q, k, v, o, lse, grad_o, False, "atomic_2d_ilp")
    b = t08["attention_backward"](q, k, v, o, shifted, grad_o, False, "atomic_2d_ilp")
    two = t08["attention_backward"](q, k, v, o, lse, grad_o, False, "atomic_2d")
    want = t08["attention_backward_reference"](q, k, v, grad_o, False)[2:]
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*leaves)
    sdpa = torch.autograd.grad(out, leaves, grad_o)
    for name, x, y, z, w, s in zip(("dq", "dk", "dv"), a, b, two, want, sdpa):
        errs = [(t.double() - w).abs().max().item() for t in (x, y, z, s)]
        print(f"atomic_2d_ilp d={d} N={N} {name}: aligned {errs[0]:.3e}, shifted LSE {errs[1]:.3e}, "
              f"atomic_2d {errs[2]:.3e}, SDPA {errs[3]:.3e}")
        assert torch.isfinite(x).all() and torch.isfinite(y).all(), f"{name}: rows left unwritten"
        if name != "dq":
            assert torch.equal(x, y), f"{name}: the two LSE copies differ"
        else:
            assert (x.float() - y.float()).abs().max().item() <= 2 ** -7 * max(1.0, w.abs().max().item()), name
        assert errs[0] <= 2 * errs[3] + 1e-6 and errs[1] <= 2 * errs[3] + 1e-6, (name, errs)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_forward_lse_matches_float64(t08, dtype):
    dt = t08["DTYPES"][dtype]
    for d in (64, 128):
        for causal in (False, True):
            for N in t08["CHECK_N"]:
                g = torch.Generator().manual_seed(N)
                q, k, v = (torch.randn(1, 2, N, d, generator=g).to(dt).cuda() for _ in range(3))
                lse = torch.full((1, 2, N), float("nan"), device="cuda")
                o, lse = t08["attention_forward"](q, k, v, causal, lse=lse)
                o_ref, lse_ref, *_ = t08["attention_backward_reference"](q, k, v, torch.zeros_like(q), causal)
                err = (lse.double() - lse_ref).abs().max().item()
                assert err < 1e-4 * max(1.0, lse_ref.abs().max().item()), (d, causal, N, err)   # fp32 sums
                o_err = (o.double() - o_ref).abs().max().item()
                assert o_err < (3.2e-2 if dtype == "bf16" else 4e-3), (d, causal, N, o_err)


def test_forward_without_lse_still_runs_as_tutorial_07_launches_it(t08):
    """07's launchers pass None for the LSE: nothing is stored, O is the same."""
    mod = t08["_tutorial07_step2"]()
    q, k, v = (torch.randn(1, 2, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o_none = torch.empty_like(q)
    mod["fa2_bf16_d64"][(3, 2), 128, (128 + 4 * 64) * 64 * 2](q, k, v, o_none, None, 300, 0.125)
    o, _ = t08["attention_forward"](q, k, v, False)
    assert torch.equal(o, o_none)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_loss_backward_through_the_op(t08, compiled):
    F = torch.nn.functional
    f = t08["kl_flash_attention"]
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(2, 12, 1000, 64, generator=g).bfloat16().cuda() for _ in range(4))
    want = t08["attention_backward_reference"](q, k, v, w, True)[2:]

    def grads(attention):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        (attention(*leaves) * w).float().sum().backward()
        return [x.grad for x in leaves]
    ours_fn = (lambda *x: f(*x, True))
    if compiled:
        ours_fn = torch.compile(ours_fn, fullgraph=True)
    ours = grads(ours_fn)
    theirs = grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=True))
    for name, a, b, r in zip(("dq", "dk", "dv"), ours, theirs, want):
        err, own = (a.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        assert err <= 2 * own + 1e-6, f"{name}: ours {err:.3e}, SDPA's {own:.3e}"


def test_the_op_takes_a_models_transposed_heads(t08):
    """q, k, v as a model makes them ([B, N, H, d] projections viewed as [B, H, N, d]): the same gradients as on
    contiguous copies."""
    f = t08["kl_flash_attention"]
    x = torch.randn(3, 2, 300, 4, 64, device="cuda", dtype=torch.bfloat16)            # [qkv, B, N, H, d]
    w = torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16)

    def grads(make):
        leaf = x.detach().requires_grad_()
        q, k, v = make(leaf)
        (f(q, k, v, False) * w).float().sum().backward()
        return leaf.grad
    views = grads(lambda t: [t[i].transpose(1, 2) for i in range(3)])
    copies = grads(lambda t: [t[i].transpose(1, 2).contiguous() for i in range(3)])
    torch.testing.assert_close(views, copies, rtol=2e-2, atol=2e-2)   # dQ by atomics: the order of its sums varies


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("N", [65, 4097])
def test_step3b_hopper_rows_runs_its_kernels_and_agrees_with_step3(t08, dtype, d, causal, N):
    """On an sm_90 GPU variant "hopper_rows" is step 3b's kernels themselves (hbwd_pre_*, hbwd_rows_*: the LSE and Dv
    copied by the producer's TMA from rows padded to 64, into shared memory; full tiles' dQ reductions without a row
    test): its dQ, dK, dV at one row past a tile and at 64 full tiles and one row past them (both reduction paths,
    the padding read) are finite, within 2x step 3's error against float64 (+ 1e-6), and the op takes it only where
    BWD_OP_HOPPER_ROWS is on. (test_gradients_within_twice_sdpas_own_error checks it on every CHECK_N.)"""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("step 3b's kernels are sm_90a (Hopper) only")
    dt = t08["DTYPES"][dtype]
    g = torch.Generator().manual_seed(11 + N)
    q, k, v, grad_o = (torch.randn(2, 3, N, d, generator=g).to(dt).cuda() for _ in range(4))
    assert t08["hopper_backward_applies"](q)
    for name in (f"hbwd_pre_bf16_d{d}", f"hbwd_rows_bf16_d{d}", f"hbwd_rows_bf16_d{d}_causal"):
        print(name, t08["attn_bwd_h"][name].resources)
    o, lse = t08["attention_forward"](q, k, v, causal)
    nan = [torch.full_like(q, float("nan")) for _ in range(3)]
    rows = t08["attention_backward_hopper"](q, k, v, o, lse, grad_o, causal, *nan, rows=True)
    step3 = t08["attention_backward_hopper"](q, k, v, o, lse, grad_o, causal)
    want = t08["attention_backward_reference"](q, k, v, grad_o, causal)[2:]
    for name, a, b, w in zip(("dq", "dk", "dv"), rows, step3, want):
        err, err3 = (a.double() - w).abs().max().item(), (b.double() - w).abs().max().item()
        print(f"hopper_rows {dtype} d={d} causal={causal} N={N} {name}: error {err:.3e}, step 3's {err3:.3e}")
        assert torch.isfinite(a).all(), f"{name}: rows left unwritten"
        assert err <= 2 * err3 + 1e-6, f"{name}: step 3b {err:.3e} against float64, step 3's {err3:.3e}"
    run = t08["_op_backward_launcher"](q, causal)
    assert getattr(run, "keywords", {}).get("rows", False) == t08["BWD_OP_HOPPER_ROWS"], run
