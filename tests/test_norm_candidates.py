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
