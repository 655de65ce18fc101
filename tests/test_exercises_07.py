"""Tutorial 07's exercises on the CPU, beyond what tests/test_teach.py proves for every exercise: the references are the
PTX ISA's fragment table (and what ldmatrix.x4 delivers at the tutorial's lane addresses) and the online softmax's
definition with fully masked rows; the inputs hold every case the task names; and the wrong variants only a GPU can
run fail with the finding their file names when the grader's GPU path runs a NumPy model of them (a fake GPU, as in
tests/test_teach.py). tests/gpu/test_exercises_gpu.py runs the real kernels."""
import numpy as np
import pytest

import kernellab
from exercises.solutions_lib import load_kernel, solution_path, variants
from kernellab.teach import Exercise, exercise, register, unregister
from kernellab.teach import ex07_fused_attention as ex07

INF = np.float32(np.inf)


# --- 07-online-softmax: the reference and the inputs ------------------------------------------------------------

def test_softmax_reference_defines_masked_rows_and_never_overflows():
    x = np.array([[0, 0, 0], [-INF, -INF, -INF], [1, -INF, -INF], [1000, 999, -INF], [-50, -INF, -49]], np.float32)
    with np.errstate(all="raise"):                     # no NaN, no overflow on the way
        m, l = ex07.softmax_stats_reference(x)
    assert m.dtype == l.dtype == np.float32
    np.testing.assert_array_equal(m, [0, -INF, 1, 1000, -49])
    np.testing.assert_allclose(l, [3, 0, 1, 1 + np.exp(-1), 1 + np.exp(-1)], rtol=1e-7)
    live = l > 0                                       # softmax = exp(x - m) / l sums to 1 on every row with a key
    with np.errstate(invalid="ignore"):
        p = np.exp(x[live].astype(np.float64) - m[live, None]) / l[live, None]
    np.testing.assert_allclose(p.sum(axis=1), 1, rtol=1e-6)


def test_softmax_inputs_hold_every_kind_of_row():
    rng = np.random.default_rng(3)
    x = ex07.softmax_rows((13, 100), rng)
    masked = np.isneginf(x)
    assert masked.all(axis=1).any(), "a fully masked row"
    partly = masked.any(axis=1) & ~masked.all(axis=1)
    assert partly.sum() >= 2, "rows with masked keys and a window of keys"
    assert (x.max(axis=1) > 88.8).any(), "scores whose exp overflows fp32 unless the max is subtracted"
    finite = ~masked.any(axis=1)
    assert any(np.all(r == r[0]) for r in x[finite]), "a constant row (ties)"
    # one-row shapes draw a kind at random: over a few launches each appears
    kinds = set()
    for seed in range(40):
        r = ex07.softmax_rows((1, 50), np.random.default_rng(seed))[0]
        kinds.add("masked" if np.isneginf(r).all() else "partial" if np.isneginf(r).any() else
                  "large" if r.max() > 88.8 else "constant" if np.all(r == r[0]) else "scores")
    assert kinds == {"masked", "partial", "large", "constant", "scores"}, kinds


# --- 07-ldmatrix-swizzle: the reference against the PTX table, ldmatrix and the bank model ------------------------

def test_fragment_map_is_the_ptx_table_for_the_a_operand_of_m16n8k16():
    rows, cols = ex07.a_fragment_map()                 # [kc, lane, register]
    # from the PTX ISA's figure, (row, columns) within a 16 x 16 piece: lane 0 holds (0, 0..1), (8, 0..1), (0, 8..9),
    # (8, 8..9); lane 5 (g = 1, t = 1) (1, 2..3), (9, 2..3), (1, 10..11), (9, 10..11); lane 31 (g = 7, t = 3) ends
    # at (15, 14..15), which in the last piece (kc = 3) is column 62
    assert list(zip(rows[0, 0], cols[0, 0])) == [(0, 0), (8, 0), (0, 8), (8, 8)]
    assert list(zip(rows[0, 5], cols[0, 5])) == [(1, 2), (9, 2), (1, 10), (9, 10)]
    assert list(zip(rows[3, 31], cols[3, 31])) == [(7, 54), (15, 54), (7, 62), (15, 62)]
    # every value of the 16 x 64 tile is in exactly one register half
    cells = {(r, c + h) for r, c in zip(rows.ravel(), cols.ravel()) for h in (0, 1)}
    assert len(cells) == 16 * 64 == 2 * rows.size
    q = np.arange(16 * 64, dtype=np.uint16).reshape(1, 16, 64)
    frag = ex07.fragments_reference(q)
    assert frag[0, 0, 5, 3] == (9 * 64 + 10) | (9 * 64 + 11) << 16      # low half: the lower column


def ldmatrix_x4(image: np.ndarray, row_bytes: np.ndarray) -> np.ndarray:
    """What ldmatrix.x4 gives each lane (PTX ISA): lanes 8i .. 8i + 7 give the byte offsets of the 8 rows of matrix i
    (16 bytes each); register i of lane l is bytes 4 (l % 4) .. + 3 of row l / 4 of matrix i. image: [tiles, 2048]
    bytes; row_bytes: [32] offsets. Returns [tiles, 32, 4] uint32."""
    lane = np.arange(32)
    offsets = row_bytes[8 * np.arange(4)[None, :] + (lane // 4)[:, None]] + 4 * (lane % 4)[:, None]   # [32, 4]
    b = image[:, offsets[..., None] + np.arange(4)].astype(np.uint32)                              # [tiles, 32, 4, 4]
    return b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16 | b[..., 3] << 24


def _offset(row, chunk, swizzled=True):
    return row * 128 + 16 * (ex07.swizzled_chunk(row, chunk) if swizzled else chunk)


LANE = np.arange(32)
A_ORDER = (LANE % 16, LANE // 16)                        # lane l: row l % 16, chunk 2 kc + l / 16 (the Q load)
B_ORDER = (LANE % 8 + 8 * (LANE // 16), (LANE // 8) % 2)  # the tutorial's K load: matrices 1 and 2 swapped for A


def fragments_model(q, *, write_swizzled=True, read_swizzled=True, order=A_ORDER):
    """(frag, image) of the exercise's kernel as NumPy: the tile stored (swizzled or not), ldmatrix.x4 per k-chunk."""
    image = ex07.swizzled_image(q) if write_swizzled else q.copy()
    raw = np.ascontiguousarray(image).view(np.uint8).reshape(q.shape[0], -1)
    rows, chunks = order
    frag = np.stack([ldmatrix_x4(raw, _offset(rows, 2 * kc + chunks, read_swizzled)) for kc in range(ex07.KC)], 1)
    return frag, image


def test_the_reference_is_what_ldmatrix_gives_at_the_tutorials_lane_addresses():
    q = np.random.default_rng(0).integers(0, 0xFFFF, size=(5, 16, 64), dtype=np.uint16)
    frag, image = fragments_model(q)
    np.testing.assert_array_equal(frag, ex07.fragments_reference(q))
    np.testing.assert_array_equal(image, ex07.swizzled_image(q))
    k_order, _ = fragments_model(q, order=B_ORDER)       # the K-load order gives a0, a2, a1, a3
    np.testing.assert_array_equal(k_order[..., [0, 2, 1, 3]], frag)
    assert not np.array_equal(k_order, frag)


def test_the_swizzle_makes_each_ldmatrix_conflict_free_in_the_bank_model():
    for kc in range(ex07.KC):
        rows, chunks = A_ORDER
        swz = kernellab.analyze_access(list(_offset(rows, 2 * kc + chunks)), 16)
        plain = kernellab.analyze_access(list(_offset(rows, 2 * kc + chunks, swizzled=False)), 16)
        assert swz.wavefronts == swz.ideal_wavefronts == 4, swz
        assert plain.wavefronts == 8 * plain.ideal_wavefronts, plain     # 8 rows of 128 bytes: the same 4 banks
    # and the image is each row's 8 chunks permuted: nothing lost, nothing doubled
    q = np.arange(16 * 64, dtype=np.uint16).reshape(1, 16, 64)
    image = ex07.swizzled_image(q)
    assert all(sorted(image[0, r]) == list(q[0, r]) for r in range(16))


# --- the grader's GPU path on NumPy models of the solutions and of the variants only a GPU can run ---------------

def softmax_model(x, *, guard_inf=True, rescale=True, shift_max=True, last_key=True):
    """(m, l) of the exercise's kernel as NumPy in fp32, lane by lane: lane i walks keys i, i + 32, ... with the
    online update, then five butterfly merges. The switches turn off what the wrong variants leave out."""
    rows, n = x.shape
    keys = n if last_key else n - 1
    mi = np.full((rows, 32), -INF, np.float32)
    li = np.zeros((rows, 32), np.float32)
    with np.errstate(all="ignore"):
        for j0 in range(0, max(keys, 0), 32):
            valid = (j0 + LANE) < keys                                   # [32] lanes with a key in this tile
            v = np.full((rows, 32), -INF, np.float32)
            v[:, valid] = x[:, j0 + LANE[valid]]
            mn = np.maximum(mi, v)
            if shift_max:
                new = li * np.exp(mi - mn) + np.exp(v - mn)
                if guard_inf:
                    new = np.where(mn == -INF, li, new)
            else:
                new = li + np.exp(v)
            li = np.where(valid, new, li).astype(np.float32)
            mi = np.where(valid, mn, mi)
        for o in (16, 8, 4, 2, 1):
            mo, lo = mi[:, LANE ^ o], li[:, LANE ^ o]
            mn = np.maximum(mi, mo)
            if not shift_max:
                new = li + lo
            elif not rescale:
                new = np.where(mn == -INF, li, li + lo)
            else:
                new = li * np.exp(mi - mn) + lo * np.exp(mo - mn)
                if guard_inf:
                    new = np.where(mn == -INF, li, new)
            li, mi = new.astype(np.float32), mn
        m, l = mi[:, 0], li[:, 0]
        if not shift_max:
            l = np.where(m == -INF, 0, l * np.exp(-m)).astype(np.float32)
    return m, l


def fragments_launch(**switches):
    def launch(grid, block, q, frag, image, tiles, **kw):
        done = min(tiles, grid[0] * (block[0] // 32))                    # one warp per tile, the rest return
        frag[:done], image[:done] = fragments_model(q[:done], **switches)
    return launch


def softmax_launch(**switches):
    def launch(grid, block, x, m, l, rows, n, **kw):
        done = min(rows, grid[0] * block[1])                             # one warp per row, the rest return
        m[:done], l[:done] = softmax_model(x[:done], **switches)
    return launch


MODELS = {
    "07-online-softmax": {None: softmax_launch(), "no_inf_guard": softmax_launch(guard_inf=False),
                          "no_rescale": softmax_launch(rescale=False), "no_max_shift": softmax_launch(shift_max=False),
                          "skip_last": softmax_launch(last_key=False)},
    "07-ldmatrix-swizzle": {None: fragments_launch(), "plain_read": fragments_launch(read_swizzled=False),
                            "k_order": fragments_launch(order=B_ORDER),
                            "no_swizzle": fragments_launch(write_swizzled=False, read_swizzled=False)},
}
SMALL_SHAPES = {"07-online-softmax": ((1, 1), (1, 31), (7, 1), (3, 33), (13, 100), (65, 257), (33, 1000)),
                "07-ldmatrix-swizzle": ((1,), (3,), (7,), (33,), (1000,))}


def _grade_model(monkeypatch, ex_id, launch):
    """Grade the solution's compiled kernel with its launches run by `launch` (NumPy) on a fake GPU."""
    from kernellab.run.launch import device
    from kernellab.run.nvtools.sanitize import report_from_text
    from kernellab.teach import grader

    monkeypatch.setattr(device, "gpu_status", lambda: (True, "1 GPU (a NumPy model)"))
    monkeypatch.setattr(grader, "_to_device", lambda args: tuple(args))
    monkeypatch.setattr(grader, "_to_host", lambda a: a)
    ex = exercise(ex_id)
    k = load_kernel(ex, solution_path(ex_id))
    monkeypatch.setattr(k, "launch", launch, raising=False)
    monkeypatch.setattr(k, "sanitize", lambda *a, tool="memcheck", **kw: report_from_text(
        "========= ERROR SUMMARY: 0 errors\n", tool=tool, kernel=ex.kernel), raising=False)
    small = register(Exercise(**{**ex.__dict__, "hints": dict(ex.hints), "id": f"t-{ex_id}",
                                 "shapes": SMALL_SHAPES[ex_id]}))
    try:
        return kernellab.grade(small.id, k, speed=False, seed=11)
    finally:
        unregister(small.id)


def test_every_gpu_only_variant_of_tutorial_07_has_a_model():
    for ex_id, models in MODELS.items():
        gpu_only = {v.name for v in variants(ex_id) if v.where == "gpu"}
        assert gpu_only and gpu_only <= set(models), (ex_id, gpu_only - set(models))


@pytest.mark.parametrize("ex_id", list(MODELS))
def test_the_solutions_model_passes_on_the_gpu_path(monkeypatch, ex_id):
    r = _grade_model(monkeypatch, ex_id, MODELS[ex_id][None])
    assert r.passed and r.complete, str(r)
    n = sum(len(exercise(ex_id).launch.configs(s)) for s in SMALL_SHAPES[ex_id])
    assert f"{n} launches on {len(SMALL_SHAPES[ex_id])} shapes (GPU)" in [c.what for c in r.checks], r.checks


@pytest.mark.parametrize("variant", [v for ex_id in MODELS for v in variants(ex_id) if v.where == "gpu"], ids=str)
def test_a_gpu_only_variants_model_fails_with_its_finding(monkeypatch, variant):
    r = _grade_model(monkeypatch, variant.exercise, MODELS[variant.exercise][variant.name])
    kinds = [f.kind for f in r.findings]
    assert not r.passed and set(variant.kinds) <= set(kinds), str(r)
    assert "internal" not in kinds and "spec" not in kinds
    found = next(f for f in r.findings if f.kind == variant.kinds[0])
    assert found.hint == exercise(variant.exercise).hints[variant.kinds[0]]


def test_a_nan_from_an_unguarded_minus_inf_is_named_as_a_wrong_value(monkeypatch):
    """exp(-inf - (-inf)) is NaN: the finding shows it (not "never written": the kernel wrote that NaN)."""
    r = _grade_model(monkeypatch, "07-online-softmax", MODELS["07-online-softmax"]["no_inf_guard"])
    [f] = [f for f in r.findings if f.kind == "wrong_values"]
    assert "NaN where the reference has" in f.message and "-inf" in f.hint, str(r)
    assert "unwritten" not in [f.kind for f in r.findings]


def test_a_row_major_tile_is_named_as_a_copy_of_q(monkeypatch):
    r = _grade_model(monkeypatch, "07-ldmatrix-swizzle", MODELS["07-ldmatrix-swizzle"]["no_swizzle"])
    [f] = r.findings                                   # the fragments are right: only the layout is wrong
    assert f.kind == "input_copy" and f.message == "`image` holds a copy of `q`, element for element", str(r)
