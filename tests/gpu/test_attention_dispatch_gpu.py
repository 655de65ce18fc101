"""Tutorial 07's entry point (`attention` and the `kl::attention` op, loaded from the notebook's launcher cell as a
model would call them) and its short-sequence variant (fa3p_*_bm64) on the GPU.

- the variant, forced through the entry point, on N = 1, 63, 65, 1000, 1031, 4097, bf16 and fp16, causal or not:
  `kernellab.check` against SDPA in float64, our error at most 2x SDPA's own;
- the entry point's output equals, bit for bit, that of the kernel its plan names, on shapes chosen so that every
  candidate the model has is picked by at least one of them (the test says which shape picked what);
- the op passes torch.library.opcheck.
"""
import pathlib
import sys

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from attention_steps import attention_benchmark  # noqa: E402

A = attention_benchmark()


@pytest.fixture(scope="module")
def tutorial():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the entry point's Hopper kernels use wgmma and TMA: sm_90 only")
    from notebook_cells import load_tutorial

    return load_tutorial("07-fused-attention.py")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_short_sequence_variant_matches_sdpa(tutorial, dtype, causal):
    attention = tutorial["attention"]
    rows = A.run_checks("fa3p_bm64", lambda q, k, v, o, c: attention(q, k, v, o, c, kernel="fa3p_bm64"),
                        quick=False, dtypes=(dtype,), dims=(64,), masks=(causal,))
    assert len(rows) == len(A.CHECK_N)
    bad = [r for r in rows if not (r["passed"] and r["within_2x"])]
    assert not bad, bad


@pytest.mark.parametrize("ctas", [None, 7], ids=["plan", "7-ctas"])
def test_the_variant_launched_again_and_on_few_ctas(tutorial, ctas):
    """Three launches in a row on the same inputs (each must leave the work counter at 0 for the next), with items of
    65 key tiles (N = 4097: the 3 K/V stages' barriers wrap 21 times within an item) and a causal N = 1031; on the
    plan's CTAs, and on 7 CTAs that each walk 10-19 items (every barrier's phase counted across items)."""
    attention = tutorial["attention"]
    F = torch.nn.functional
    for N, causal in ((4097, False), (1031, True)):
        q, k, v = (torch.randn(1, 2, N, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for _ in range(3):
            out = attention(q, k, v, causal=causal, kernel="fa3p_bm64", ctas=ctas)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        own = (F.scaled_dot_product_attention(q, k, v, is_causal=causal).double() - ref).abs().max().item()
        err = (out.double() - ref).abs().max().item()
        assert err <= 2 * own + 1e-6, (N, causal, err, own)
        assert int(tutorial["_attention_counters"][q.device]) == 0


# Shapes chosen so that each candidate is the model's choice for one of them with the H100's constants and with the
# H200's (132 SMs; B*H = 256, N = 128 is step 2's with both); on another GPU the choices may differ, and the test still
# compares the entry point with whatever its plan names.
SHAPES = [(4, 16, 4096, 64, False), (16, 32, 1024, 64, True), (32, 16, 512, 64, True), (1, 16, 128, 64, False),
          (2, 8, 1031, 128, True), (1, 16, 16384, 128, True), (2, 3, 1000, 64, False), (1, 2, 1, 128, True),
          (1, 16, 512, 128, False), (16, 16, 128, 64, False)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_entry_point_runs_the_kernel_its_plan_names(tutorial, dtype):
    from kernellab.teach.attention_plan import constants_for

    attention, plan_for = tutorial["attention"], tutorial["attention_plan"]
    picked = {}
    for B, H, N, d, causal in SHAPES:
        q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=dtype) for _ in range(3))
        plan = plan_for(q, causal)
        assert plan.constants == constants_for(torch.cuda.get_device_name()).note   # the device's own table
        picked.setdefault(plan.kernel, (B, H, N, d, causal))
        got = attention(q, k, v, causal=causal)
        want = attention(q, k, v, causal=causal, kernel=plan.kernel)
        assert torch.equal(got, want), (plan, (got.float() - want.float()).abs().max().item())
        op = tutorial["kl_attention"](q, k, v, causal)
        assert torch.equal(op, want), plan
        del q, k, v, got, want, op
    print("the entry point's choices:", picked, "with the", plan.constants)
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert set(picked) == {"fa3p", "fa3p_bm128", "fa3p_bm64", "fa3", "fa2"}, picked


def test_the_op_passes_opcheck(tutorial):
    op = tutorial["kl_attention"]
    for causal in (False, True):
        q, k, v = (torch.randn(2, 3, 200, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        op.opcheck(q, k, v, causal)
