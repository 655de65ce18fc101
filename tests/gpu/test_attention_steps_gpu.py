"""Tutorial 07's steps 2 (mma.sync), 3 (wgmma + TMA) and 3b (persistent; fa3p_sched: with ping-pong scheduling) against
SDPA on awkward shapes, as the notebook launches them.

Every (step, dtype, head dim, mask) on N = 1, 63, 65, 1000, 1031, 4097: `kernellab.check` against SDPA in float64,
with the tutorial's tolerance, and our error at most 2x SDPA's own error on the same inputs.
"""
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
from attention_steps import attention_benchmark  # noqa: E402

A = attention_benchmark()


@pytest.fixture(scope="module")
def launchers():
    families, configs = A.load_families(None, None)
    return {fam: A.launcher(ks, configs[fam]) for fam, ks in families.items()}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("step", ["fa2", "fa3", "fa3p", "fa3p_sched"])
def test_step_matches_sdpa_within_twice_its_own_error(launchers, step, dtype, d, causal):
    if step != "fa2" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("step 3 uses wgmma and TMA: sm_90 only")
    attention = launchers[step]
    rows = A.run_checks(step, attention, quick=False, dtypes=(dtype,), dims=(d,), masks=(causal,))
    assert len(rows) == len(A.CHECK_N)
    bad = [r for r in rows if not (r["passed"] and r["within_2x"])]
    assert not bad, bad


@pytest.mark.parametrize("step", ["fa2", "fa3", "fa3p", "fa3p_sched"])
def test_peaky_scores_exercise_lazy_rescaling(launchers, step):
    """Scores of tens: the running max jumps by more than the lazy-rescaling threshold from tile to tile.

    The bound is SDPA's own error plus one bf16 rounding of the dominant P times |v| (|v| < 5 here): with lazy
    rescaling the running max lags the true one, so the dominant key's P is 2^(s - m) rather than exactly 1.0 and is
    rounded to 16 bits before P V, where SDPA's is exact (step 2 measured 2.33e-2 against SDPA's own 8.14e-3 on an
    H100, 2.9x). A wrong rescale (a missed alpha, a stale l) gives errors of order |v|, far above it."""
    import kernellab

    if step != "fa2" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("steps 3 and 3b use wgmma and TMA: sm_90 only")
    F = torch.nn.functional
    attention = launchers[step]

    def inputs(g):
        q, k, v = (torch.randn(1, 2, 1500, 64, generator=g) for _ in range(3))
        q = 6 * q + torch.linspace(0, 8, 1500).view(1, 1, 1500, 1)     # growing scores along the keys too
        return q.bfloat16().cuda(), (k * 3).bfloat16().cuda(), v.clamp(-5, 5).bfloat16().cuda(), torch.empty(
            1, 2, 1500, 64, dtype=torch.bfloat16, device="cuda")
    for causal in (False, True):
        rep = kernellab.check(lambda q, k, v, o: attention(q, k, v, o, causal),
                              lambda q, k, v, o: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                              inputs, trials=2, atol=A.TOL["bf16"], rtol=A.TOL["bf16"])
        own = rep.reference_own_error or 0.0
        assert rep.passed and rep.max_abs_error <= own + 2 ** -8 * 5 + 1e-6, (step, causal, rep)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("step", ["fa3p", "fa3p_sched"])
def test_persistent_step_on_7_ctas_wraps_every_barrier_phase(step, d, causal):
    """Step 3b on 7 CTAs: each walks dozens of work items (both heights at d = 64: N = 1031 causal takes 128 rows,
    4097 takes 192; fa3p_sched 192 at both, its warpgroups' turns running on across items of different lengths), and
    the work counter is back at 0 after every launch."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("step 3b uses wgmma and TMA: sm_90 only")
    families, configs = A.load_families(None, None)
    cfg = configs[step]
    attention = A.make_persistent_launcher(families[step], {d_: cfg[f"BN{d_}"] for d_ in (64, 128)},
                                           {d_: cfg.get(f"ST{d_}", 2) for d_ in (64, 128)}, ctas=7)
    rows = A.run_checks(f"{step}@7", attention, quick=False, dtypes=("bf16",), dims=(d,), masks=(causal,))
    bad = [r for r in rows if not (r["passed"] and r["within_2x"])]
    assert not bad, bad
