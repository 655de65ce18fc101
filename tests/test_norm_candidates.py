"""Issue 14's fp32 norm candidate that tools/gpu/try_norms.py times (tools/gpu/norm_variants/norm_tworead.cu,
"2read"; session 5's "pipe" is the notebook's ring_store now, tested with the cell), without a GPU: NVRTC compiles them beside the notebook's cell to what was meant
(registers, no spills, 16-byte accesses, the L2 hints), and try_norms' own launchers, run on the CPU emulation,
match PyTorch on aligned and misaligned rows, blocks and clusters, and a large mean."""
import pathlib
import re
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))
sys.path.insert(0, str(HERE / "emu"))
sys.path.insert(0, str(HERE.parent / "tools" / "gpu"))
from notebook_cells import named_cuda_cells  # noqa: E402

import kernellab  # noqa: E402

torch = pytest.importorskip("torch")
F = torch.nn.functional
try_norms = pytest.importorskip("try_norms")

TWOREAD = ["layernorm_tworead<float, 2, 1>", "rmsnorm_tworead<float, 4, 2>"]


def source():
    return named_cuda_cells("04-layernorm.py")["norm_kernels"] + "".join(p.read_text() for p in try_norms.EXTRA_SOURCES)


@pytest.fixture(scope="module")
def module():
    return kernellab.compile_cuda(source(), arch="sm_90", first_line=2, filename="cell.cu")


def test_candidates_fit_their_registers_without_spills(module):
    for name in TWOREAD:
        res = module[name].resources
        assert res.local_bytes == 0 and res.spill_store_bytes == 0, (name, str(res))
        # __launch_bounds__(1024, 2): two blocks of 1024 an SM
        assert res.registers <= 32, (name, res.registers)


def test_candidates_move_16_byte_packs_and_2read_hints_the_caches(module):
    for name in TWOREAD:
        sass = module[name].sass
        assert "STG.E.128" in sass and "LDG.E.128" in sass, name
        assert not re.search(r"\b(LDL|STL)\b", sass), name
    for name in TWOREAD:      # pass 2's x: L1::no_allocate; both passes carry an L2 policy
        assert "LDG.E.NA.128" in module[name].sass, name


emulate = pytest.importorskip("emulate")
needs_cxx = pytest.mark.skipif(emulate.compiler() is None, reason="no host C++ compiler (g++) for the emulation")


def ln_inputs(rows, cols, mean):
    def make(g):
        x = 2 * torch.randn(rows, cols, generator=g) + mean
        return x, 1 + 0.5 * torch.randn(cols, generator=g), torch.randn(cols, generator=g), torch.empty(rows, cols)
    return make


# (spec, rows, cols): 2read with several chunks a thread and spare rows in the last block.
CASES = [(try_norms.TWO(64, 128), 3, 4096), (try_norms.TWO(128, 128), 2, 1028)]


@pytest.fixture(scope="module")
def emulated():
    return emulate.compile_host(source())


@needs_cxx
@pytest.mark.parametrize("mean", [0.0, 1e4])
@pytest.mark.parametrize("spec, rows, cols", CASES, ids=lambda v: v.text() if hasattr(v, "text") else str(v))
def test_candidates_match_torch_on_the_emulator(emulated, spec, rows, cols, mean):
    assert spec.covers(cols, 4) or spec.family != "2read"
    ln = try_norms.make_launcher(emulated, "layernorm", "float", spec, True)
    rms = try_norms.make_launcher(emulated, "rmsnorm", "float", spec, True)
    tol = {} if mean == 0.0 else {"atol": 5e-3, "rtol": 0}    # fp32 x near 1e4: ulp 1e-3 (test_memory_bound's)
    rep = kernellab.check(ln, lambda x, w, b, y: F.layer_norm(x, (cols,), w, b, try_norms.EPS),
                          ln_inputs(rows, cols, mean), trials=1, **tol)
    assert rep.passed, ("layernorm", spec.text(), rows, cols, mean, rep)
    rep = kernellab.check(lambda x, w, b, y: rms(x, w, y), lambda x, w, b, y: F.rms_norm(x, (cols,), w, try_norms.EPS),
                          ln_inputs(rows, cols, 1.0 if mean == 0.0 else mean), trials=1)   # relative: no cancellation
    assert rep.passed, ("rmsnorm", spec.text(), rows, cols, mean, rep)


# --- norm_wide (tools/gpu/norm_variants/norm_wide.cu): bf16 LayerNorm under a 512-thread bound, x widened once
# (wide), w and b next to x (early), or both (wideb) ---

WIDE = ["layernorm_rows_x<__nv_bfloat16, 4, true, 0, 512, 1>", "layernorm_rows_x<__nv_bfloat16, 8, true, 0, 512, 1>",
        "layernorm_rows_cluster_x<__nv_bfloat16, 16, 8, true, 0, 512, 1>",
        "layernorm_rows_cluster_x<__nv_bfloat16, 8, 8, true, 0, 512, 1>"]
EARLY = ["layernorm_rows_x<__nv_bfloat16, 4, true, 1, 512, 1>", "layernorm_rows_x<__nv_bfloat16, 4, false, 1, 512, 1>",
         "layernorm_rows_x<__nv_bfloat16, 8, false, 1, 512, 1>", "layernorm_rows_cluster_x<__nv_bfloat16, 16, 8, false, 1, 512, 1>"]


def test_wide_keeps_x_widened_within_its_512_thread_bound(module):
    """Fewer widenings than the cell's kernel at the same plan (its SASS has fewer bf16 shifts and masks), more
    registers (the 32-64 widened values), no spills; the early ones load all their w and b packs before the
    reduction's first barrier."""
    def widenings(sass):
        return len(re.findall(r"\b(SHF\.L\.U32|LOP3\.LUT|IMAD\.U32)\b", sass))
    for name in WIDE + EARLY:
        res = module[name].resources
        assert res.registers <= 128 and not res.spills and res.local_bytes == 0, (name, str(res))
    assert module[WIDE[0]].resources.registers > 64
    assert widenings(module[WIDE[0]].sass) < widenings(module["layernorm_rows<__nv_bfloat16, 4>"].sass)
    for name, vpt in zip(EARLY, (4, 4, 8, 8)):
        before_barrier = module[name].sass.split("BAR.SYNC")[0]
        assert before_barrier.count("LDG.E.128") >= 3 * vpt, name      # x, w and b


@needs_cxx
@pytest.mark.parametrize("mean", [0.0, 1e4])
@pytest.mark.parametrize("spec, rows, cols", [(try_norms.W(128, 4, 1, 128), 3, 4096),
                                              (try_norms.W(32, 4, 1, 128), 5, 1031),
                                              (try_norms.W(32, 8, 16), 2, 16 * 32 * 8 * 8 - 8),
                                              (try_norms.WB(128, 4, 1, 128), 3, 4096),
                                              (try_norms.WB(32, 4, 1, 128), 5, 1031),
                                              (try_norms.E(64, 4, 1, 128), 3, 2048),
                                              (try_norms.E(32, 8, 1, 128), 5, 2051),
                                              (try_norms.E(32, 8, 16), 2, 16 * 32 * 8 * 8 - 8)],
                         ids=lambda v: v.text() if hasattr(v, "text") else str(v))
def test_wide_matches_torch_on_the_emulator(emulated, spec, rows, cols, mean):
    ln = try_norms.make_launcher(emulated, "layernorm", "__nv_bfloat16", spec, True)

    def inputs(g):
        x, w, b, y = ln_inputs(rows, cols, mean)(g)
        return x.bfloat16(), w.bfloat16(), b.bfloat16(), y.bfloat16()
    rep = kernellab.check(ln, lambda x, w, b, y: F.layer_norm(x, (cols,), w, b, try_norms.EPS), inputs, trials=1,
                          atol=2e-2, rtol=2e-2)
    assert rep.passed, (spec.text(), rows, cols, mean, rep)


# --- session 9's norm_resident_x (tools/gpu/norm_variants/norm_resident_x.cu): session 7's resident clusters with the
# st.async exchange, double-buffered by row parity ---

RESIDENT_X_SOURCE = HERE.parent / "tools" / "gpu" / "norm_variants" / "norm_resident_x.cu"


def resident_x_source():
    return named_cuda_cells("04-layernorm.py")["norm_kernels"] + RESIDENT_X_SOURCE.read_text()


def test_resident_x_fits_64_registers_and_has_no_cluster_barrier_per_row():
    """No spills; w and b from shared memory; one cluster barrier (the start), the rows exchanged by st.async."""
    m = kernellab.compile_cuda(resident_x_source(), arch="sm_90")
    ks = [k for k in m.kernels if k.name == "norm_resident_x"]
    assert len(ks) == 12
    for k in ks:
        assert k.resources.registers <= 64 and not k.resources.spills, (k.signature, k.resources)
        assert "LDS.128" in k.sass and k.sass.count("UCGABAR_ARV") == 1, k.signature
        assert "MEMBAR" not in k.sass, k.signature


@needs_cxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_resident_x_clusters_take_rows_in_turn_on_the_emulator(kind, dtype):
    """norm_resident_x at small sizes: blocks of 32 threads (4 packs each), clusters of 3, 2 clusters over 5 and 7
    rows (several turns of each parity's mbarrier, one cluster a row more), rows with packs left over past the last
    block's, one cluster alone, and a mean of 1e4 (LayerNorm: the two-pass sums and Chan across the blocks)."""
    k = emulate.compile_host(resident_x_source())[
        f"norm_resident_x<{'true' if kind == 'layernorm' else 'false'}, "
        f"{'float' if dtype == torch.float32 else '__nv_bfloat16'}, 3>"]
    vec = 16 // dtype.itemsize
    for rows, packs, clusters, mean in ((5, 3 * 32 * 4 - 5, 2, 3.0), (7, 3 * 32 * 4, 2, 1e4), (3, 200, 1, 0.0)):
        cols = packs * vec
        g = torch.Generator().manual_seed(rows)
        x = (2 * torch.randn(rows, cols, generator=g) + mean).to(dtype)
        w = (1 + 0.5 * torch.randn(cols, generator=g)).to(dtype)
        b = torch.randn(cols, generator=g).to(dtype)
        y = torch.full((rows, cols), float("nan"), dtype=dtype)
        k.launch(clusters * 3, 32, x, w, b if kind == "layernorm" else w, y, rows, cols, 1e-5,
                 shared_bytes=(2 if kind == "layernorm" else 1) * 4 * 32 * 16)
        ref = (F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5) if kind == "layernorm"
               else F.rms_norm(x.double(), (cols,), w.double(), 1e-5))
        tol = (1e-5 if mean < 100 else 5e-3) if dtype == torch.float32 else 2e-2
        assert torch.allclose(y.double(), ref, atol=tol, rtol=tol), (rows, cols, (y.double() - ref).abs().max())


def test_try_exchange_can_still_build_its_baselines():
    """tools/gpu/try_exchange.py makes its "before" cells from the notebooks' by text changes that assert they found
    what they replace: each still applies, and does what its name says."""
    try_exchange = pytest.importorskip("try_exchange")
    cells = {"softmax_kernels": named_cuda_cells("03-reductions-softmax.py")["softmax_kernels"],
             "norm_kernels": named_cuda_cells("04-layernorm.py")["norm_kernels"]}
    for baseline, changes in try_exchange.BASELINES.items():
        for name, change in changes.items():
            assert change(cells[name]) != cells[name], (baseline, name)
    for name, src in cells.items():
        barrier = try_exchange.barrier_variant(src)
        assert "exchange_open<" in src and "exchange_open<" not in barrier and "cluster_map(&block_part" in barrier
        assert barrier.count("    cluster_wait();\n}") == src.count("    exchange_open<")
        spun = try_exchange.spin_variant(src)
        assert "if (warp == 0) exchange_wait" in src and "if (warp == 0) exchange_wait" not in spun
    chan = try_exchange.chan_variant(cells["norm_kernels"])
    assert "block_merge<0>(SumCount" not in chan and "row_merge<CLUSTER>(Welford{n, mean, m2}" in chan


def test_staged_rows_fit_64_registers_and_bring_x_by_bulk_copies():
    """Session 10's norm_staged (tools/gpu/try_staged.py): 4 packs a thread in 64 registers without spills, x brought
    into shared memory by cp.async.bulk (UBLKCP: the prologue's STAGES and one refill), read back as 16-byte shared
    loads, y stored as 16-byte packs; no global loads of x in the loop (only w and b, once)."""
    staged = HERE.parent / "tools" / "gpu" / "norm_variants" / "norm_staged.cu"
    m = kernellab.compile_cuda(named_cuda_cells("04-layernorm.py")["norm_kernels"] + staged.read_text(),
                               arch="sm_90", first_line=2, filename="cell.cu")
    ks = [k for k in m.kernels if k.name == "norm_staged"]
    assert len(ks) == 10
    for k in ks:
        stages = int(str(k.signature).split("<")[1].split(",")[2])
        assert k.resources.registers <= 64 and not k.resources.spills, (k.signature, k.resources)
        sass = k.sass
        assert sass.count("UBLKCP") == stages + 1, (k.signature, sass.count("UBLKCP"))
        assert "LDS.128" in sass and "STG.E.128" in sass, k.signature
        ln = str(k.signature).split(">")[0].endswith("true")
        assert sass.count("LDG.E.128") == (2 if ln else 1) * 4, (k.signature, sass.count("LDG.E.128"))


def test_copy_probes_keep_their_cache_qualifiers():
    """tools/gpu/small_rows.py's copy probes compile to what their names say: 16-byte loads and stores, L1
    no_allocate (.NA) or evict-first (.EF, from .cs) where asked, an L2 policy (set up in uniform registers: the
    instructions differ from the same probe without it) where asked, nothing spilled."""
    probe = HERE.parent / "tools" / "gpu" / "norm_variants" / "copy_probe.cu"
    m = kernellab.compile_cuda(probe.read_text(), arch="sm_90")
    sass = {str(k.signature).split("(")[0][len("copy_probe"):]: k.sass for k in m.kernels}
    assert len(sass) == 13
    for k in m.kernels:
        assert not k.resources.spills and "STG.E" in k.sass and "LDG.E" in k.sass, k.signature

    def memory_ops(text):
        return re.findall(r"\b(LDG\.\S+|STG\.\S+)", text)

    def opcodes(text):                     # the instructions with their operands, without addresses
        return [ln.split("*/", 1)[1].split(";")[0].strip()
                for ln in text.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/\s", ln)]
    assert set(memory_ops(sass["<4, 0, 0>"])) == {"LDG.E.128.CONSTANT", "STG.E.128"}
    assert set(memory_ops(sass["<4, 1, 0>"])) == {"LDG.E.NA.128.CONSTANT", "STG.E.128"}
    assert set(memory_ops(sass["<4, 3, 0>"])) == {"LDG.E.EF.128", "STG.E.128"}
    assert set(memory_ops(sass["<4, 0, 1>"])) == {"LDG.E.128.CONSTANT", "STG.E.EF.128"}
    for policy, plain in (("<4, 2, 0>", "<4, 1, 0>"), ("<4, 0, 2>", "<4, 0, 0>"), ("<4, 0, 3>", "<4, 0, 2>")):
        assert opcodes(sass[policy]) != opcodes(sass[plain]), (policy, plain)


def test_small_rows_store_variant_still_applies():
    """tools/gpu/small_rows.py rewrites the cell's 16-byte stores of y to go through an L2 policy: it still finds all
    four, and the result compiles to kernels whose stores carry the policy (their instructions differ)."""
    small_rows = pytest.importorskip("small_rows")
    cell = named_cuda_cells("04-layernorm.py")["norm_kernels"]
    hinted = small_rows.store_variant(cell, "evict_last")
    assert hinted.count("store_hint(") == 5 and "= from_floats<T>(out);" not in hinted.split("store_hint")[-1]
    name = "rmsnorm_rows<__nv_bfloat16, 4>"
    plain = kernellab.compile_cuda(cell, arch="sm_90", first_line=2, filename="cell.cu")[name].sass
    policy = kernellab.compile_cuda(hinted, arch="sm_90", first_line=2, filename="cell.cu")[name].sass
    assert plain.count("STG.E.128") == policy.count("STG.E.128") > 0
    assert policy.count("UMOV") > plain.count("UMOV")
