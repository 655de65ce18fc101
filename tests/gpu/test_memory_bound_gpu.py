"""Tutorials 03 and 04 on a GPU: every kernel against PyTorch on awkward shapes, -inf rows and a large mean.

The kernels and launchers are the notebooks' own (their named %%cuda cells and `# launchers` cells, loaded by
notebook_cells.load_tutorial). References run in float64 (kernellab.check upcasts); tolerances are the output
dtype's, except where a test says why.
"""
import pytest

import kernellab
from notebook_cells import load_tutorial

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
EPS = 1e-5


@pytest.fixture(scope="module")
def t03():
    return load_tutorial("03-reductions-softmax.py")


@pytest.fixture(scope="module")
def t04():
    return load_tutorial("04-layernorm.py")


# --- sums ---------------------------------------------------------------------------------------------------------

SUM_SIZES = [1, 2, 255, 256, 257, 1003, 4099, 100_003, 2**20 + 3, 2**24 + 1]


@pytest.mark.parametrize("n", SUM_SIZES)
@pytest.mark.parametrize("name", ["sum_atomic", "sum_tree_interleaved", "sum_tree_sequential", "sum_shuffle",
                                  "sum_vec4", "sum_single_pass"])
def test_sums(t03, name, n):
    if name == "sum_atomic" and n > 100_003:
        pytest.skip("a float32 sum in arbitrary order drifts past any tight tolerance at this size")
    report = kernellab.check(t03["SUMS"][name], lambda x: x.sum().reshape(1),
                             lambda g: (torch.randn(n, generator=g).cuda(),), trials=2, atol=5e-5 * n ** 0.5, rtol=0)
    assert report.passed, report


def test_single_pass_is_deterministic_and_resets_its_counter(t03):
    x = torch.randn(2**22 + 5, device="cuda")
    results = [t03["sum_single_pass"](x).item() for _ in range(4)]
    assert len(set(results)) == 1, results                  # the same bits every time: partials added in order
    assert abs(results[0] - x.double().sum().item()) < 1e-3 * x.abs().sum().item() ** 0.5
    assert t03["_DONE"][x.device].item() == 0


# --- softmax ------------------------------------------------------------------------------------------------------


def with_specials(rows, cols, dtype):
    """N(0, 3) rows, then: fully masked, half masked, huge (1e37), very negative (-1e30) and one +inf."""
    def make(g):
        x = 3 * torch.randn(rows, cols, generator=g)
        specials = [lambda r: r.fill_(float("-inf")), lambda r: r[::2].fill_(float("-inf")),
                    lambda r: r.mul_(1e37), lambda r: r.sub_(1e30),
                    lambda r: r[r.numel() // 2:][:1].fill_(float("inf"))]
        for i, fill in enumerate(specials[:max(0, rows - 1)]):
            fill(x[i + 1])
        return x.to(dtype).cuda(), torch.empty(rows, cols, dtype=dtype, device="cuda")
    return make


# Every plan: a warp per row with 1, 2, 4 and 8 packs per thread, a block per row, clusters of 2, 4 and 8,
# misaligned rows (cols not a multiple of the pack), rows of one element, and rows past the registers (fallback).
SOFTMAX_SHAPES = [(1, 1), (3, 7), (5, 100), (9, 200), (7, 500), (1000, 1031), (6, 2049), (5, 4099), (33, 16385),
                  (70, 6000), (40, 20000), (20, 20000), (7, 20000), (3, 100003), (1, 262144), (2, 262147),
                  (2, 300007)]     # (70, 6000): 16-bit rows over 8 KB in a block, 64 values a thread


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_softmax(t03, shape, dtype):
    report = kernellab.check(t03["softmax"], lambda x, y: torch.softmax(x, -1), with_specials(*shape, dtype),
                             trials=2)
    assert report.passed, report


def test_softmax_shapes_reach_every_kernel(t03):
    """The shapes above launch every softmax_rows instantiation of the cell."""
    used = set()
    for dtype in DTYPES:
        for r, c in SOFTMAX_SHAPES:
            kernel, _ = t03["softmax_kernel_for"](r, c, dtype)
            if kernel is not None:
                used.add(kernel.signature.display)
    assert used == {k.signature.display for k in t03["softmax_kernels"].kernels}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["softmax_three_pass", "softmax_online"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (6, 1031), (4, 5000), (3, 100003)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_softmax_ladder(t03, name, shape, dtype):
    report = kernellab.check(t03[name], lambda x, y: torch.softmax(x, -1), with_specials(*shape, dtype), trials=2)
    assert report.passed, report


@pytest.mark.parametrize("shape", [(4, 1024), (4, 1031), (4, 40000)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_fully_masked_rows_give_nan_like_torch(t03, shape):
    x = torch.randn(*shape, device="cuda")
    x[1] = float("-inf")
    x[2, 1:] = float("-inf")                                 # one finite element: 1 there, 0 elsewhere
    y = t03["softmax"](x)
    assert torch.isnan(y[1]).all() and torch.isnan(torch.softmax(x, -1)[1]).all()
    assert y[2, 0].item() == 1.0 and (y[2, 1:] == 0).all()
    assert not torch.isnan(y[0]).any() and not torch.isnan(y[3]).any()


def test_unaligned_views_are_refused(t03):
    x = torch.randn(4 * 1031 + 1, device="cuda")[1:].view(4, 1031)    # 4 bytes past a 16-byte boundary
    with pytest.raises(AssertionError, match="16-byte aligned"):
        t03["softmax"](x)


# --- LayerNorm and RMSNorm -----------------------------------------------------------------------------------------

# Tutorial 04's own plans: the same kinds, and 9 x 6001 for a bf16 block of 8 packs per thread (rows over 8 KB);
# bf16 rows of 300007 fit a cluster of 8 x 1024 threads x 8 packs, float ones fall back.
NORM_SHAPES = [(1, 1), (3, 7), (5, 100), (9, 200), (7, 500), (1000, 1031), (6, 2049), (5, 4099), (9, 6001),
               (33, 16385), (40, 20000), (20, 20000), (7, 20000), (3, 100003), (1, 262144), (2, 262147),
               # enough rows not to be spread (>= 66): 8 packs a thread in blocks and in clusters of 2, 4 and 8
               (70, 6000), (70, 40000), (66, 70000), (66, 140000)]
# bf16 only (in float the rows are over 1 MB): few rows over 512 KB take 8 packs a thread in clusters of 8 x 1024
NORM_SHAPES_BF16 = [(2, 400000)]


def norm_shapes(dtype):
    return NORM_SHAPES + (NORM_SHAPES_BF16 if dtype == torch.bfloat16 else [])


def ln_inputs(rows, cols, dtype, mean=0.0):
    """x ~ N(mean, 2), w ~ N(1, 0.5), b ~ N(0, 1), and an output buffer."""
    def make(g):
        x = (2 * torch.randn(rows, cols, generator=g) + mean).to(dtype)
        w = (1 + 0.5 * torch.randn(cols, generator=g)).to(dtype)
        b = torch.randn(cols, generator=g).to(dtype)
        return x.cuda(), w.cuda(), b.cuda(), torch.empty(rows, cols, dtype=dtype, device="cuda")
    return make


def layernorm_ref(x, w, b, y):
    return F.layer_norm(x, (x.shape[1],), w, b, EPS)


@pytest.mark.parametrize("dtype,shape", [(d, s) for d in (torch.float32, torch.bfloat16)
                                         for s in norm_shapes(d) + [(2, 300007)]],
                         ids=lambda v: f"{v[0]}x{v[1]}" if isinstance(v, tuple) else str(v))
def test_layernorm(t04, shape, dtype):
    report = kernellab.check(lambda x, w, b, y: t04["layernorm"](x, w, b, y, EPS), layernorm_ref,
                             ln_inputs(*shape, dtype), trials=2)
    assert report.passed, report


@pytest.mark.parametrize("dtype,shape", [(d, s) for d in (torch.float32, torch.bfloat16) for s in norm_shapes(d)],
                         ids=lambda v: f"{v[0]}x{v[1]}" if isinstance(v, tuple) else str(v))
def test_rmsnorm(t04, shape, dtype):
    report = kernellab.check(lambda x, w, b, y: t04["rmsnorm"](x, w, y, EPS),
                             lambda x, w, b, y: F.rms_norm(x, (x.shape[1],), w, EPS),
                             ln_inputs(*shape, dtype, mean=1.0), trials=2)
    assert report.passed, report


def test_norm_shapes_reach_every_kernel(t04):
    used = set()
    for kind in ("layernorm", "rmsnorm"):
        for dtype in (torch.float32, torch.bfloat16):
            for r, c in norm_shapes(dtype):
                kernel, _ = t04["norm_kernel_for"](kind, r, c, dtype)
                used.add(kernel.signature.display)
    assert used == {k.signature.display for k in t04["norm_kernels"].kernels}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["layernorm_sumsq", "layernorm_welford"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (6, 1031), (4, 5000), (3, 100003)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_layernorm_ladder(t04, name, shape, dtype):
    report = kernellab.check(lambda x, w, b, y: t04[name](x, w, b, y, EPS), layernorm_ref, ln_inputs(*shape, dtype),
                             trials=2)
    assert report.passed, report


@pytest.mark.parametrize("shape", [(256, 4096), (7, 1031), (3, 100003)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_large_mean_breaks_only_the_sum_of_squares(t04, shape):
    """Rows of mean 1e4, spread 2, float32. float32 resolves 1e4 to about 1e-3, so any float32 kernel is that far
    from the float64 answer; 5e-3 absolute admits it. The sum of squares misses by far more than the spread."""
    results = {name: kernellab.check(lambda x, w, b, y, fn=fn: fn(x, w, b, y, EPS), layernorm_ref,
                                     ln_inputs(*shape, torch.float32, mean=1e4), trials=2, atol=5e-3, rtol=0)
               for name, fn in t04["LAYERNORMS"].items()}
    assert results["layernorm_welford"].passed, results["layernorm_welford"]
    assert results["layernorm"].passed, results["layernorm"]
    if shape[1] > 1000:
        assert not results["layernorm_sumsq"].passed and results["layernorm_sumsq"].max_abs_error > 0.1


# --- the cluster exchange (st.async into the other blocks' shared memory, counted on their mbarriers) ---------------

SANITIZED = [(op, dtype, tool) for op in ("softmax", "layernorm", "rmsnorm") for dtype in (torch.float32, torch.bfloat16)
             for tool in ("memcheck", "racecheck", "synccheck")]


@pytest.mark.parametrize("op,dtype,tool", SANITIZED, ids=[f"{o}-{str(d)[6:]}-{t}" for o, d, t in SANITIZED])
def test_cluster_kernels_are_clean_under_compute_sanitizer(t03, t04, op, dtype, tool):
    """Three rows of 20000 (clusters of 4-8 blocks: every block pushes to the others and exits without a closing
    cluster barrier) under memcheck, racecheck (the slots written by st.async, read after the mbarrier) and synccheck."""
    rows, cols = 3, 20000
    x, w, b, y = ln_inputs(rows, cols, dtype)(torch.Generator().manual_seed(3))
    if op == "softmax":
        kernel, plan = t03["softmax_kernel_for"](rows, cols, dtype)
        args = (x, y, rows, cols)
    else:
        kernel, plan = t04["norm_kernel_for"](op, rows, cols, dtype)
        args = (x, w, b, y, rows, cols, EPS) if op == "layernorm" else (x, w, y, rows, cols, EPS)
    assert plan.cluster > 1, plan
    report = kernel.sanitize(plan.grid, plan.block, *args, tool=tool)
    assert report.ok, str(report)
