"""Compare a kernel's outputs with the reference and say what is wrong in words: which rows were never written,
whether the answer is all zeros, a copy of an input, or the reference shifted by one. Pure NumPy, no GPU."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A NaN with a payload no arithmetic produces by chance: an element still holding it was never written.
_POISON_BITS = {np.dtype(np.float32): (np.uint32, 0x7FC0DEAD), np.dtype(np.float64): (np.uint64, 0x7FF8DEADDEADDEAD),
                np.dtype(np.float16): (np.uint16, 0x7E5A)}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one output: a finding kind and a sentence."""

    kind: str          # "unwritten", "wrong_values", "off_by_one", "zero_output", "input_copy", "shape"
    message: str


def poison_(a: np.ndarray) -> np.ndarray:
    """Fill `a` in place with the poison value (a marked NaN; the largest value for integers); return it."""
    bits = _POISON_BITS.get(a.dtype)
    if bits is not None:
        a.view(bits[0])[...] = bits[1]
    elif np.issubdtype(a.dtype, np.integer):
        a[...] = np.iinfo(a.dtype).max
    else:
        a[...] = np.nan
    return a


def unwritten(a: np.ndarray) -> np.ndarray:
    """Boolean mask of the elements that still hold the poison value."""
    bits = _POISON_BITS.get(a.dtype)
    if bits is not None:
        return np.ascontiguousarray(a).view(bits[0]) == bits[1]
    if np.issubdtype(a.dtype, np.integer):
        return a == np.iinfo(a.dtype).max
    return np.isnan(a)


_CHUNK = 1 << 20          # elements a pass of the tolerance test handles: its float64 temporaries stay in cache


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays hold the same bytes in the same shape and dtype (NaN payloads and signed zeros included),
    compared in cache-sized pieces without the full-size temporaries of np.array_equal."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    x = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    y = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    step = _CHUNK * 4
    return all(np.array_equal(x[i:i + step], y[i:i + step]) for i in range(0, x.size, step))


def mismatches(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """Boolean mask of elements out of tolerance (NaN or Inf where the reference is finite always is). An output
    equal to the reference bit for bit has none; large arrays are tested a piece at a time (the same test)."""
    if np.issubdtype(out.dtype, np.integer) or out.dtype == bool:
        return out != ref
    ref = np.asarray(ref)
    if same_bytes(out, ref):
        return np.zeros(out.shape, dtype=bool)
    if out.shape != ref.shape or out.size <= _CHUNK:
        return _mismatches(out, ref, rtol, atol)
    o, r = np.ascontiguousarray(out).reshape(-1), np.ascontiguousarray(ref).reshape(-1)
    bad = np.empty(o.size, dtype=bool)
    for i in range(0, o.size, _CHUNK):
        bad[i:i + _CHUNK] = _mismatches(o[i:i + _CHUNK], r[i:i + _CHUNK], rtol, atol)
    return bad.reshape(out.shape)


def _mismatches(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    # invalid ignored: a signalling NaN in the output (bits a kernel copied as they were) warns in the cast and is a
    # NaN all the same; -inf - -inf where both are -inf is settled by same_special below
    with np.errstate(invalid="ignore"):
        o = out.astype(np.float64)
        r = np.asarray(ref, dtype=np.float64)
        ok = np.abs(o - r) <= atol + rtol * np.abs(r)
    same_special = (o == r) | (np.isnan(o) & np.isnan(r))
    return ~np.where(np.isfinite(r), ok & np.isfinite(o), same_special)


def compare(out: np.ndarray, ref: np.ndarray, name: str, *, rtol: float, atol: float,
            inputs: dict[str, np.ndarray] | None = None) -> list[Problem]:
    """What is wrong with output `name` (empty when it matches): unwritten elements first, then wrong values."""
    ref = np.asarray(ref)
    if out.shape != ref.shape:
        return [Problem("shape", f"`{name}` has shape {out.shape}, the reference {ref.shape}")]
    bad = mismatches(out, ref, rtol, atol)
    if not bad.any():
        return []
    problems = []
    never = unwritten(out) & bad
    if never.any():
        problems.append(Problem("unwritten", describe_unwritten(never, name, out.dtype)))
    wrong = bad & ~never
    if wrong.any() or not never.any():
        problems.append(_wrong(out, ref, wrong, name, rtol, atol, inputs or {}))
    return problems


def describe_unwritten(mask: np.ndarray, name: str, dtype=None) -> str:
    """"rows 17..31 of `out` were never written", "elements 256..999 (744 of 1,000) of `c` ...", ...; `dtype` (the
    output's) names the poison value: a NaN, or for integers their largest value."""
    total, n = mask.size, int(mask.sum())
    if n == total:
        held = "element still holds" if total == 1 else f"{total:,} elements still hold"
        poison = "NaN" if dtype is None or not np.issubdtype(dtype, np.integer) else \
            f"largest {np.dtype(dtype).name} ({np.iinfo(dtype).max:,})"
        return f"no element of `{name}` was written (its {held} the {poison} the grader put there)"
    if mask.ndim == 1:
        return f"{_runs(np.flatnonzero(mask), 'element')} of `{name}` ({n:,} of {total:,}) were never written"
    if mask.ndim == 2:
        rows = np.flatnonzero(mask.all(axis=1))
        cols = np.flatnonzero(mask.all(axis=0))
        parts = []
        if rows.size:
            parts.append(_runs(rows, "row"))
        if cols.size:
            parts.append(_runs(cols, "column"))
        covered = np.zeros_like(mask)
        covered[rows, :] = True
        covered[:, cols] = True
        rest = mask & ~covered
        named = rows.size + cols.size
        text = f"{' and '.join(parts)} of `{name}` {'was' if named == 1 else 'were'} never written" if parts else ""
        if rest.any():
            r, c = np.nonzero(rest)
            where = (f"{int(rest.sum()):,} element{'s' if rest.sum() != 1 else ''} of `{name}` "
                     f"{'was' if rest.sum() == 1 else 'were'} never written, in rows {_span(r)}, columns {_span(c)}"
                     f" (first at ({r[0]}, {c[0]}))")
            text = f"{text}; {where}" if text else where
        return f"{text} ({n:,} of {total:,} elements)"
    first = tuple(int(v) for v in np.argwhere(mask)[0])
    whole = np.flatnonzero(mask.reshape(mask.shape[0], -1).all(axis=1))
    lead = f"{_runs(whole, 'matrix' if mask.ndim == 3 else 'slice')} (along the first axis) of `{name}` " \
           f"{'was' if whole.size == 1 else 'were'} never written; " if whole.size else ""
    return f"{lead}{n:,} of {total:,} elements of `{name}` were never written, first at {first}"


def _wrong(out, ref, wrong, name, rtol, atol, inputs) -> Problem:
    """The wrong-values problem, named by its pattern where one fits."""
    n, total = int(wrong.sum()), wrong.size
    idx = tuple(int(v) for v in np.argwhere(wrong)[0]) if wrong.ndim else ()
    first = (f"first at {idx[0] if len(idx) == 1 else idx}: {_fmt(out[idx])} where the reference has "
             f"{_fmt(ref[idx])}") if wrong.any() else ""
    ref_nonzero = bool(np.any(np.asarray(ref) != 0))
    if ref_nonzero and out.size and np.all(out == 0):
        return Problem("zero_output", f"`{name}` is all zeros")
    for in_name, arr in inputs.items():
        if arr.size >= out.size and arr.dtype == out.dtype and not np.array_equal(arr.reshape(-1)[:out.size],
                                                                                  ref.reshape(-1)):
            if np.array_equal(out.reshape(-1), arr.reshape(-1)[:out.size]):
                return Problem("input_copy", f"`{name}` holds a copy of `{in_name}`, element for element")
    shift = _shifted(out, ref, wrong, rtol, atol)
    if shift:
        return Problem("off_by_one", f"`{name}` matches the reference shifted by one {shift} at {n:,} of {total:,} "
                                     f"wrong elements ({first}): an index is off by one")
    return Problem("wrong_values", f"{n:,} of {total:,} elements of `{name}` differ from the reference, {first}")


def _shifted(out, ref, wrong, rtol, atol) -> str | None:
    """"element", "row" or "column" when the wrong elements equal the reference one step along an axis."""
    where = np.argwhere(wrong)
    if len(where) == 0:
        return None
    labels = ["element"] if out.ndim == 1 else ["row", "column"] if out.ndim == 2 else []
    for axis, label in enumerate(labels):
        for step in (1, -1):
            src = where.copy()
            src[:, axis] += step
            inside = (src[:, axis] >= 0) & (src[:, axis] < out.shape[axis])
            if inside.sum() < max(1, 0.9 * len(where)):
                continue
            o = out[tuple(where[inside].T)]
            r = np.asarray(ref)[tuple(src[inside].T)]
            if not mismatches(o, r, rtol, atol).any():
                return label
    return None


def _runs(indices: np.ndarray, noun: str, limit: int = 3) -> str:
    """'rows 17..31', 'element 0 and elements 256..511', with at most `limit` runs named."""
    runs = []
    start = prev = int(indices[0])
    for v in indices[1:]:
        v = int(v)
        if v != prev + 1:
            runs.append((start, prev))
            start = v
        prev = v
    runs.append((start, prev))
    plural = noun[:-1] + "ces" if noun.endswith("ix") else noun + "s"
    text = [f"{noun} {a}" if a == b else f"{plural} {a}..{b}" for a, b in runs[:limit]]
    more = f" and {len(runs) - limit} more runs" if len(runs) > limit else ""
    return ", ".join(text) + more


def _span(v: np.ndarray) -> str:
    lo, hi = int(v.min()), int(v.max())
    return str(lo) if lo == hi else f"{lo}..{hi}"


def _fmt(v) -> str:
    v = v.item() if hasattr(v, "item") else v
    if isinstance(v, float):
        if np.isnan(v):
            return "NaN"
        return f"{v:.6g}"
    return str(v)
