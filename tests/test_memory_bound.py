"""Tutorials 03 and 04 without a GPU: every kernel compiles to what was meant (registers, no local memory,
16-byte accesses, cluster barriers), the launch plans cover every row, and the tutorials' own launchers, run on
the CPU emulation of their kernels (kernellab.run.sim.cuda), match PyTorch on awkward shapes, -inf rows and a large mean.
benchmarks/memory_bound.py's table and ladders run too, on the emulated kernels with a fake clock."""
import pathlib
import re
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))

sys.path.insert(0, str(HERE.parent / "benchmarks"))
sys.path.insert(0, str(HERE))
from notebook_cells import launcher_cells, load_tutorial, named_cuda_cells  # noqa: E402

import kernellab  # noqa: E402

torch = pytest.importorskip("torch")
F = torch.nn.functional

T03, T04 = "03-reductions-softmax.py", "04-layernorm.py"
CELLS = [(nb, name) for nb in (T03, T04) for name in named_cuda_cells(nb)]
ROW_KERNELS = ("softmax_rows", "softmax_rows_cluster", "layernorm_rows", "layernorm_rows_cluster", "rmsnorm_rows",
               "rmsnorm_rows_cluster")


def compile_cell(nb, name):
    return kernellab.compile_cuda(named_cuda_cells(nb)[name], arch="sm_90", first_line=2, filename="cell.cu")


@pytest.fixture(scope="module")
def modules():
    return {name: compile_cell(nb, name) for nb, name in CELLS}


_SASS: dict[bytes, dict[str, str]] = {}


def function_sass(kernel) -> str:
    """A kernel's SASS, from one disassembly of its module's cubin (one cuobjdump per module, not per kernel)."""
    from kernellab.compile.disasm import sass

    cubin = kernel.module.cubin
    if cubin not in _SASS:
        parts = re.split(r"\n\s*Function : (\S+)\n", sass(cubin))
        _SASS[cubin] = dict(zip(parts[1::2], parts[2::2]))
    return _SASS[cubin][kernel.symbol]


def sass_ops(kernel):
    """Opcode counts of a kernel's SASS (the first word of each instruction, predicates dropped)."""
    ops = {}
    for line in function_sass(kernel).splitlines():
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    return ops


def test_every_cell_is_named_and_compiles(modules):
    assert set(modules) == {"reductions", "softmax_simple", "softmax_kernels", "layernorm_simple", "norm_kernels",
                            "norm_backward"}
    assert all(m.kernels for m in modules.values())


@pytest.mark.parametrize("nb,name", CELLS, ids=[n for _, n in CELLS])
def test_no_spills_and_no_local_memory(modules, nb, name):
    for k in modules[name].kernels:
        r = k.resources
        assert not r.spills and r.local_bytes == 0, (k.signature.display, r)
        ops = sass_ops(k)
        assert not any(op.startswith(("LDL", "STL")) for op in ops), (k.signature.display, ops)


def test_row_kernels_use_16_byte_loads_and_stores_within_64_registers(modules):
    row = [k for name in ("softmax_kernels", "norm_kernels") for k in modules[name].kernels]
    assert {k.name for k in row} == set(ROW_KERNELS)
    for k in row:
        ops = sass_ops(k)
        assert ops.get("LDG.E.128.CONSTANT", 0) + ops.get("LDG.E.128", 0) >= 1, (k.signature.display, ops)
        assert ops.get("STG.E.128", 0) >= 1, (k.signature.display, ops)
        assert k.resources.registers <= 64 and k.resources.max_threads_per_block == 1024, k.resources
        clustered = k.name.endswith("_cluster")
        assert (ops.get("UCGABAR_ARV", 0) > 0) == clustered and (ops.get("UCGABAR_WAIT", 0) > 0) == clustered


def test_packs_per_thread_hold_at_most_128_bytes_within_64_registers(modules):
    """softmax: 32 values a thread (float packs up to 8, bf16/fp16 packs up to 4, their exps kept in fp32
    registers) or 8 bf16/fp16 packs (64 values, kept packed). LayerNorm/RMSNorm: up to 8 packs of either (128
    bytes: 32 float or 64 bf16 values), 64 bf16 values in the 32 registers of their packs. All within the 64
    registers of a 1024-thread block and without spills."""
    for name in ("softmax_kernels", "norm_kernels"):
        for k in modules[name].kernels:
            m = re.fullmatch(r"\w+<(\w+), (?:\d+, )?(\d+)>", k.signature.display)
            per_pack = 4 if m.group(1) == "float" else 8
            if name == "softmax_kernels" and not k.name.endswith("_cluster"):
                assert int(m.group(2)) * per_pack <= 32 or int(m.group(2)) == 8, k.signature.display
            elif name == "norm_kernels":
                assert int(m.group(2)) <= 8, k.signature.display
    wide = [k for k in modules["norm_kernels"].kernels if re.search(r"__nv_bfloat16, (\d+, )?8>", k.signature.display)]
    assert len(wide) == 10, [k.signature.display for k in wide]      # rows<bf16, 8>, clusters of 2, 4, 8, 16: x2
    # softmax: 64 bf16 / fp16 values a thread in the rows kernel and every cluster kernel
    wide += [k for k in modules["softmax_kernels"].kernels
             if re.search(r"<__(nv_bfloat16|half), 8>|_cluster<__(nv_bfloat16|half)", k.signature.display)]
    assert len(wide) == 10 + 8, [k.signature.display for k in wide]
    for k in wide + list(modules["softmax_kernels"].kernels):
        assert k.resources.registers <= 64 and not k.resources.spills and k.resources.local_bytes == 0, \
            (k.signature.display, k.resources)


def test_layernorm_reads_w_and_b_in_16_byte_packs_too(modules):
    ops = sass_ops(modules["norm_kernels"]["layernorm_rows<float, 8>"])
    loads = ops.get("LDG.E.128.CONSTANT", 0) + ops.get("LDG.E.128", 0)
    assert loads >= 3 * 8, ops       # 8 packs of x, and 8 of each of w and b on the aligned path


def test_sum_ladder_kernels(modules):
    m = modules["reductions"]
    for name in ("sum_vec4", "sum_single_pass"):
        k = m[name]
        ops = sass_ops(k)
        assert ops.get("LDG.E.128.CONSTANT", 0) + ops.get("LDG.E.128", 0) >= 4, ops   # four loads in flight
        assert k.occupancy(256).blocks_per_sm == 8, k.resources     # __launch_bounds__(256, 8): one wave is 8/SM
    assert any(op.startswith(("RED", "ATOM")) for op in sass_ops(m["sum_atomic"]))
    assert m["sum_tree_interleaved"].resources.shared_bytes == 1024
    assert "SHFL.BFLY" in sass_ops(m["sum_shuffle"])


# --- the launch plans ------------------------------------------------------------------------------------------


SHAPES = [(r, c) for r in (1, 3, 40, 1000, 4096) for c in (1, 7, 127, 128, 1024, 1031, 2049, 4096, 16384, 16385,
                                                             32768, 100003, 131072, 262144, 262147, 524288, 600000)]


ROW_LAUNCHERS = {T03: "# launchers: softmax", T04: "# launchers: layernorm, rmsnorm ("}


def launchers(nb, **modules):
    """A tutorial's row-kernel launcher cell run with the given compiled modules bound (the kernels looked up by
    name)."""
    ns = dict(modules)
    cell = next(c for c in launcher_cells(nb) if c.startswith(ROW_LAUNCHERS[nb]))
    exec(compile(cell, nb, "exec"), ns)
    return ns


def check_plan_covers(p, r, c, vec):
    """p launches every row of an r x c matrix: its threads hold the row's whole packs, its grid every row."""
    assert p.row_threads * p.vpt * p.cluster >= c // vec, (r, c, p)
    assert p.block <= 1024 and p.block % p.row_threads == 0, (r, c, p)
    assert p.row_threads >= 32 and p.row_threads & (p.row_threads - 1) == 0, (r, c, p)
    if p.cluster == 1:
        assert p.grid * (p.block // p.row_threads) >= r > (p.grid - 1) * (p.block // p.row_threads), (r, c, p)
    else:
        assert p.cluster in (2, 4, 8, 16) and p.block == p.row_threads and p.grid == r * p.cluster, (r, c, p)


@pytest.mark.parametrize("itemsize", [4, 2])
def test_softmax_plans_hold_32_values_per_thread_up_to_8_kb_rows_then_128_bytes(modules, itemsize):
    """Tutorial 03's plan: 32 values a thread (8 float packs, 4 bf16) in rows up to 8 KB, 8 packs (128 bytes: 64
    bf16 values) in longer rows, as tutorial 04's norms; 64-value plans give each row its own block (the kernel
    relies on it); every plan's kernel is in the cell."""
    ns = launchers(T03, softmax_kernels=modules["softmax_kernels"])
    dtype = {4: torch.float32, 2: torch.bfloat16}[itemsize]
    vec = 16 // itemsize
    for r, c in SHAPES:
        p = ns["plan_rows"](r, c, itemsize)
        row_bytes = c // vec * 16
        if p is None:
            assert row_bytes > 8 * 1024 * 128, (r, c)                # only rows beyond a cluster's registers
            continue
        check_plan_covers(p, r, c, vec)
        if row_bytes <= 8192:
            assert p.vpt * vec <= 32, (r, c, p)
        else:
            assert p.vpt == 8 and p.row_threads >= 128, (r, c, p)
            assert p.cluster > 1 or p.block == p.row_threads, (r, c, p)   # one row a block
        kernel, plan = ns["softmax_kernel_for"](r, c, dtype)     # a KeyError here: the cell lacks the kernel
        assert plan == p and kernel is not None


@pytest.mark.parametrize("itemsize", [4, 2])
def test_norm_plans_cover_every_row_with_their_kernels_in_the_cell(modules, itemsize):
    """Tutorial 04's plan (measured on an H100 against every other plan): 4 packs (64 bytes) per thread in rows up
    to 8 KB, 8 packs (128 bytes) beyond (but 4 for few bf16 rows); a warp per row up to 2 KB (float rows up to 4 KB:
    8 packs a lane, w/b through the ring), a block of up to 512 threads up to 64 KB (float: 1024 up to 128 KB), then
    clusters of up to 8 blocks, 16 (of half the threads) for many rows over 256 KB; every plan's kernel is
    instantiated in the norm_kernels cell."""
    ns = launchers(T04, norm_kernels=modules["norm_kernels"])
    dtype = {4: torch.float32, 2: torch.bfloat16}[itemsize]
    vec = 16 // itemsize
    for r, c in SHAPES:
        p = ns["plan_rows"](r, c, itemsize)
        row_bytes = c // vec * 16
        if p is None:
            assert row_bytes > 8 * 1024 * 128, (r, c)                # only rows beyond a cluster's registers
            assert ns["norm_kernel_for"]("rmsnorm", r, c, dtype) == (None, None)
            continue
        check_plan_covers(p, r, c, vec)
        if row_bytes <= 2048 or (itemsize == 4 and row_bytes <= 4096):   # a warp, the fewest packs that hold it
            assert p.row_threads == 32 and p.vpt == next(v for v in (1, 2, 4, 8) if 32 * v * 16 >= row_bytes), (r, c, p)
        else:                                                        # few bf16 rows: 4 packs (w early, no ring)
            wide = row_bytes > 8192 and (itemsize == 4 or r >= 132 // 2 or row_bytes > 8 * 1024 * 64)
            assert p.row_threads > 32 and p.vpt == (8 if wide else 4), (r, c, p)
        if p.cluster == 1:                                           # float rows: a block of 1024 up to 128 KB
            assert p.row_threads <= (1024 if itemsize == 4 else 512), (r, c, p)
        assert (p.cluster == 16) == (row_bytes > 256 * 1024 and r >= 132 // 2), (r, c, p)   # 2-4 blocks an SM
        assert p.cluster < 16 or p.row_threads <= 512, (r, c, p)
        for kind in ("layernorm", "rmsnorm"):
            kernel, plan = ns["norm_kernel_for"](kind, r, c, dtype)  # a KeyError here: the cell lacks the kernel
            assert plan == p and kernel.name == (f"{kind}_rows" if p.cluster == 1 else f"{kind}_rows_cluster")


def test_the_norm_plans_are_the_measured_winners():
    """The plans found fastest on an H100 among the candidates (2026-11-23, 16-block clusters on 2026-11-27;
    benchmarks/NOTES-memory-bound.md)."""
    plan = launchers(T04)["plan_rows"]
    text = {}
    for itemsize, r, c in ((2, 4096, 32768), (2, 1024, 262144), (2, 4096, 4096), (2, 4096, 1024), (4, 1000, 1031),
                           (4, 4096, 1024), (4, 4096, 32768), (4, 3, 100003), (2, 3, 100003), (4, 1024, 262144)):
        p = plan(r, c, itemsize, sms=132)
        text[(itemsize, r, c)] = (f"c{p.cluster} x {p.row_threads} x {p.vpt}" if p.cluster > 1
                                  else f"{p.row_threads} x {p.vpt} / {p.block}")
    assert text == {(2, 4096, 32768): "512 x 8 / 512", (2, 1024, 262144): "c16 x 256 x 8",
                    (4, 1024, 262144): "c16 x 512 x 8",
                    (2, 4096, 4096): "128 x 4 / 128", (2, 4096, 1024): "32 x 4 / 128",
                    (4, 1000, 1031): "128 x 4 / 128", (4, 4096, 1024): "32 x 8 / 128",
                    (4, 4096, 32768): "1024 x 8 / 1024",
                    (4, 3, 100003): "c8 x 512 x 8", (2, 3, 100003): "c8 x 512 x 4"}


def test_the_gpu_tests_shapes_reach_every_kernel_of_the_cells(modules):
    """tests/gpu/test_memory_bound_gpu.py's shape lists launch every row kernel of the two cells (its own
    test_*_shapes_reach_every_kernel checks the same there; this one fails here first, on the CPU)."""
    gpu = pytest.importorskip("test_memory_bound_gpu")
    ns03 = launchers(T03, softmax_kernels=modules["softmax_kernels"])
    ns04 = launchers(T04, norm_kernels=modules["norm_kernels"])
    used = {ns03["softmax_kernel_for"](r, c, dt)[0].signature.display for dt in gpu.DTYPES
            for r, c in gpu.SOFTMAX_SHAPES if ns03["softmax_kernel_for"](r, c, dt)[0] is not None}
    assert used == {k.signature.display for k in modules["softmax_kernels"].kernels}
    used = {ns04["norm_kernel_for"](kind, r, c, dt)[0].signature.display for kind in ("layernorm", "rmsnorm")
            for dt in (torch.float32, torch.bfloat16) for r, c in gpu.norm_shapes(dt)}
    assert used == {k.signature.display for k in modules["norm_kernels"].kernels}


def test_few_long_rows_are_spread_over_a_cluster():
    plan03 = launchers(T03)["plan_rows"]
    assert plan03(3, 100003, 4).cluster == 8 and plan03(3, 100003, 2).cluster == 8
    assert plan03(4096, 1024, 4).row_threads == 32                   # a warp per row
    assert plan03(4096, 100003, 4).cluster == 8                      # long rows need 8 blocks anyway
    assert plan03(4096, 4096, 4).cluster == 1                        # enough rows: one block each


# --- the kernels, run on the CPU --------------------------------------------------------------------------------

from kernellab.run.sim.cuda import emulate  # noqa: E402
needs_cxx = pytest.mark.skipif(emulate.compiler() is None, reason="no host C++ compiler (g++) for the emulation")


@pytest.fixture(scope="module")
def t03():
    return load_tutorial(T03, compile=emulate.compile_host)


@pytest.fixture(scope="module")
def t04():
    return load_tutorial(T04, compile=emulate.compile_host)


def with_specials(rows, cols, dtype):
    """inputs(g) for softmax: N(0, 3), then a fully masked row, a half-masked row, huge and very negative rows."""
    def make(g):
        x = 3 * torch.randn(rows, cols, generator=g)
        for i, fill in enumerate([lambda r: r.fill_(float("-inf")), lambda r: r[::2].fill_(float("-inf")),
                                  lambda r: r.mul_(1e37), lambda r: r.sub_(1e30)][:max(0, rows - 1)]):
            fill(x[i + 1])
        return x.to(dtype), torch.empty(rows, cols, dtype=dtype)
    return make


# warp, block, clusters of 4 and 8, and bf16 / fp16 rows over 8 KB: 8 packs (64 values) per thread in a block
EMU_SHAPES = [(1, 1), (3, 7), (6, 1031), (5, 4099), (3, 9000), (2, 40000), (3, 6001)]
# and the w/b ring of float rows: every thread's 8 packs whole in a block (4096), in a warp (1024), in clusters
NORM_EMU_SHAPES = EMU_SHAPES + [(3, 4096), (5, 1024), (2, 65536)]


@needs_cxx
@pytest.mark.parametrize("dtype", [torch.float32] + [pytest.param(t, marks=pytest.mark.slow)
                                   for t in (torch.bfloat16, torch.float16)], ids=str)
def test_softmax_on_the_emulator(t03, dtype):
    for name, fn in t03["SOFTMAXES"].items():
        for r, c in EMU_SHAPES + ([(2, 300007)] if name == "softmax" and dtype == torch.float32 else []):
            report = kernellab.check(fn, lambda x, y: torch.softmax(x, -1), with_specials(r, c, dtype), trials=1)
            assert report.passed, (name, r, c, report)


@needs_cxx
def test_a_fully_masked_row_is_nan_as_in_torch(t03):
    x = torch.randn(3, 1031)
    x[1] = float("-inf")
    y = t03["softmax"](x)
    assert torch.isnan(y[1]).all() and torch.isnan(torch.softmax(x, -1)[1]).all()
    assert not torch.isnan(y[0]).any() and not torch.isnan(y[2]).any()


@needs_cxx
@pytest.mark.parametrize("cols", [1031, 20000])
def test_a_row_holding_inf_is_nan_everywhere_as_in_torch(t03, cols):
    """One +inf and otherwise -inf (as fp16 rows of huge values become): torch's sum is NaN, so the whole row is NaN,
    including the threads whose own elements are all -inf (on an H100 those once gave 0)."""
    x = torch.randn(3, cols)
    x[1] = float("-inf")
    x[1, cols // 2] = float("inf")
    y = t03["softmax"](x)
    assert torch.isnan(torch.softmax(x, -1)[1]).all()
    assert torch.isnan(y[1]).all(), f"{int((~torch.isnan(y[1])).sum())} elements not NaN"
    assert not torch.isnan(y[0]).any() and not torch.isnan(y[2]).any()


def ln_inputs(rows, cols, dtype, mean=0.0):
    def make(g):
        x = (2 * torch.randn(rows, cols, generator=g) + mean).to(dtype)
        w = (1 + 0.5 * torch.randn(cols, generator=g)).to(dtype)
        return x, w, torch.randn(cols, generator=g).to(dtype), torch.empty(rows, cols, dtype=dtype)
    return make


@needs_cxx
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_layernorm_and_rmsnorm_on_the_emulator(t04, dtype):
    for name, fn in t04["LAYERNORMS"].items():
        for r, c in NORM_EMU_SHAPES:
            report = kernellab.check(lambda x, w, b, y, fn=fn: fn(x, w, b, y, 1e-5),
                                     lambda x, w, b, y: F.layer_norm(x, (x.shape[1],), w, b, 1e-5),
                                     ln_inputs(r, c, dtype), trials=1)
            assert report.passed, (name, r, c, report)
    for r, c in NORM_EMU_SHAPES:
        report = kernellab.check(lambda x, w, b, y: t04["rmsnorm"](x, w, y, 1e-5),
                                 lambda x, w, b, y: F.rms_norm(x, (x.shape[1],), w, 1e-5),
                                 ln_inputs(r, c, dtype, mean=1.0), trials=1)
        assert report.passed, ("rmsnorm", r, c, report)


@needs_cxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_clusters_of_16_blocks_on_the_emulator(t04, dtype):
    """The 16-block cluster kernels (many rows over 256 KB), at a size the emulation can run: blocks of 32 threads x
    8 packs, so a cluster holds 16 x 32 x 8 packs; rows one pack short of that (the last thread's last pack is past
    the row) and a mean of 1e4 (the statistics stay exact)."""
    ct = "float" if dtype == torch.float32 else "__nv_bfloat16"
    vec = 16 // dtype.itemsize
    rows, cols = 3, (16 * 32 * 8 - 1) * vec
    x, w, b, y = ln_inputs(rows, cols, dtype, mean=1e4)(torch.Generator().manual_seed(16))
    ln = t04["norm_kernels"][f"layernorm_rows_cluster<{ct}, 16, 8>"]
    ln[rows * 16, 32](x, w, b, y, rows, cols, 1e-5)
    ref = F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3                 # float32 resolves 1e4 to about 1e-3
    assert torch.allclose(y.double(), ref, atol=tol, rtol=tol), (y.double() - ref).abs().max()
    rms = t04["norm_kernels"][f"rmsnorm_rows_cluster<{ct}, 16, 8>"]
    y.fill_(float("nan"))
    rms[rows * 16, 32](x, w, y, rows, cols, 1e-5)
    ref = F.rms_norm(x.double(), (cols,), w.double(), 1e-5)
    assert torch.allclose(y.double(), ref, atol=tol, rtol=tol), (y.double() - ref).abs().max()


@needs_cxx
def test_only_the_sum_of_squares_fails_on_a_large_mean(t04):
    results = {name: kernellab.check(lambda x, w, b, y, fn=fn: fn(x, w, b, y, 1e-5),
                                     lambda x, w, b, y: F.layer_norm(x, (x.shape[1],), w, b, 1e-5),
                                     ln_inputs(4, 4096, torch.float32, mean=1e4), trials=1, atol=5e-3, rtol=0)
               for name, fn in t04["LAYERNORMS"].items()}
    assert not results["layernorm_sumsq"].passed and results["layernorm_sumsq"].max_abs_error > 1
    assert results["layernorm_welford"].passed and results["layernorm"].passed


@needs_cxx
def test_sums_on_the_emulator(t03):
    for name, fn in t03["SUMS"].items():
        for n in (1, 255, 257, 10_003):
            report = kernellab.check(fn, lambda x: x.sum().reshape(1), lambda g, n=n: (torch.randn(n, generator=g),),
                                     trials=1, atol=5e-5 * n ** 0.5, rtol=0)
            assert report.passed, (name, n, report)


@needs_cxx
@pytest.mark.slow
def test_the_benchmark_script_runs_its_checks_and_table(t03, t04, monkeypatch, capsys):
    import memory_bound as mb
    from test_bench import FakeClock

    monkeypatch.setattr(mb, "DEVICE", "cpu")
    monkeypatch.setattr(mb, "SUM_N", 3000)
    monkeypatch.setattr(mb, "SUM_CHECK_SIZES", (257, 3001))
    monkeypatch.setattr(mb, "LADDER_SHAPE", (8, 1031))
    monkeypatch.setattr(mb, "compiled", lambda torch, fn, name, run, *args: fn)   # no Inductor on the CPU here
    run = mb.Run(None)
    opts = dict(warmup_ms=1, rep_ms=3, rounds=3, min_reps=3, timer=FakeClock(lambda out: 1.0))
    for ladder, ns in ((mb.sum_ladder, t03), (mb.softmax_ladder, t03), (mb.layernorm_ladder, t04)):
        ladder(run, ns, 3000.0, opts)
    mb.table(run, t03, t04, 3000.0, opts, [(5, 1031), (2, 9000)], (torch.bfloat16,),
             ["softmax", "layernorm", "rmsnorm"])
    mb.summary(run, 3000.0, "fake")
    out = capsys.readouterr().out
    assert "NOT AS EXPECTED" not in out and "FAILED" not in out and "!" not in out, out
    table = [r for r in run.records if r["section"] == "table"]
    assert len(table) == 6 and all(r["check"] == "passed" for r in table)
    assert {r["op"] for r in run.records if r["section"] == "ladder"} == {"sum", "softmax", "layernorm"}
    assert "large mean (1e4): layernorm_sumsq failed" in out and "layernorm_welford passed" in out


# --- the exercises' solutions and the variants only a GPU can catch, run on the emulator ------------------------

EXERCISES = ("03-block-sum", "03-softmax-warp", "04-rmsnorm-block", "04-layernorm-block")


@needs_cxx
@pytest.mark.parametrize("ex_id", EXERCISES)
def test_exercise_solution_passes_and_gpu_variants_fail_on_the_emulator(ex_id):
    """What tests/gpu/test_exercises_gpu.py grades on a GPU, here on the emulated kernels: the reference solution
    matches on every small shape, and each `on gpu` wrong variant shows the finding it promises."""
    import numpy as np

    from exercises.solutions_lib import solution_path, variants
    from kernellab.teach import compare, exercise

    ex = exercise(ex_id)

    def findings(path):
        kernel = emulate.compile_host(path.read_text())[ex.kernel]
        found = set()
        for si, shape in enumerate(ex.shapes):
            if np.prod(shape) > 100_000:
                continue
            for grid, block in ex.launch.configs(shape):
                args = list(ex.make_args(shape, np.random.default_rng([7, si])))
                expected = ex.reference(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])
                for i in ex.outputs:
                    compare.poison_(args[i])
                kernel[grid[0], block[0]](*[torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args])
                for j, i in enumerate(ex.outputs):
                    found |= {p.kind for p in compare.compare(args[i], expected[j], ex.arg_name(i), rtol=ex.rtol,
                                                              atol=ex.atol)}
        return found

    assert findings(solution_path(ex_id)) == set()
    for v in variants(ex_id):
        if v.where == "gpu":
            assert set(v.kinds) <= findings(v.path), v
