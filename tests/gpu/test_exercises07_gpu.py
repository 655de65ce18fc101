"""Tutorial 07's exercises on a GPU, beyond tests/gpu/test_exercises_gpu.py (which grades every solution and variant):
the findings name what the real kernels did (a NaN from exp(-inf - (-inf)), a row-major tile), and Nsight Compute
measures why the swizzle is asked for: the reference's ldmatrix loads are conflict-free, the row-major tile's are not."""
import numpy as np
import pytest

import kernellab
from exercises.solutions_lib import load_kernel, solution_path, variants
from kernellab.teach import exercise

pytestmark = pytest.mark.gpu


def _variant(ex_id, name):
    ex = exercise(ex_id)
    [v] = [v for v in variants(ex_id) if v.name == name]
    return load_kernel(ex, v.path)


def test_an_unguarded_minus_inf_shows_as_a_nan_the_kernel_wrote():
    r = kernellab.grade("07-online-softmax", _variant("07-online-softmax", "no_inf_guard"), speed=False, seed=5)
    kinds = [f.kind for f in r.findings]
    assert "wrong_values" in kinds and "unwritten" not in kinds, str(r)
    [f] = [f for f in r.findings if f.kind == "wrong_values"]
    assert "NaN where the reference has" in f.message, str(r)


def test_a_row_major_tile_has_right_fragments_and_is_named_a_copy_of_q():
    r = kernellab.grade("07-ldmatrix-swizzle", _variant("07-ldmatrix-swizzle", "no_swizzle"), speed=False, seed=5)
    [f] = r.findings
    assert f.kind == "input_copy" and "`image` holds a copy of `q`" in f.message, str(r)


def _ldmatrix_wavefronts(kernel, tiles=1024, block=128):
    """Nsight Compute's counters for the kernel's ldmatrix line: (instructions, wavefronts, excess wavefronts)."""
    import torch

    q = torch.from_numpy(np.random.default_rng(0).integers(0, 0xFFFF, (tiles, 16, 64), dtype=np.uint16)).cuda()
    frag = torch.empty((tiles, 4, 32, 4), dtype=torch.uint32, device="cuda")
    image = torch.empty_like(q)
    rep = kernel.profile_banks((tiles * 32 + block - 1) // block, block, q, frag, image, tiles)
    if not rep.measured:
        pytest.skip(f"Nsight Compute counters not available: {rep.reason}")
    lines = [c for c in rep.lines if any("LDSM" in s for s in c.sass) or "ldmatrix" in c.source]
    assert len(lines) == 1, str(rep)
    [c] = lines
    return c.instructions, c.wavefronts, c.excess_wavefronts


def test_the_swizzle_removes_the_ldmatrix_bank_conflicts():
    """Swizzled: no excess wavefront (4 per ldmatrix.x4, one per 8 x 8 matrix); row-major: the 8 rows a matrix reads
    at one column share 4 banks, 8 times the wavefronts (kernellab's bank model: tests/test_exercises_07.py)."""
    ex = exercise("07-ldmatrix-swizzle")
    n_ref, w_ref, excess_ref = _ldmatrix_wavefronts(load_kernel(ex, solution_path(ex.id)))
    n_bad, w_bad, excess_bad = _ldmatrix_wavefronts(_variant(ex.id, "no_swizzle"))
    assert n_ref == n_bad == 1024 * 4, (n_ref, n_bad)                      # 4 ldmatrix.x4 per tile
    assert excess_ref == 0 and excess_bad > 0, (excess_ref, excess_bad)
    assert w_bad >= 4 * w_ref, (w_bad, w_ref)                              # the model says 8x
