"""Exercises of tutorial 09 (attention for inference): the merge of flash-decoding's split partials (o, lse), with
-inf splits, empty rows and large lse handled, then the scores of grouped-query decoding: each query head reading its
KV head, keys past a sequence's cache length masked."""
from __future__ import annotations

import numpy as np

from . import register
from .spec import Exercise, Launch, SpeedBar, ceil_div

TUTORIAL = "09-attention-inference"


# --- 09-split-combine: o = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M), one block per row ---------------------------

def combine_inputs(shape, rng) -> tuple[np.ndarray, np.ndarray]:
    """o_part [rows, splits, d] ~ N(0, 1) and lse [rows, splits] in log2 units: N(0, 3), with a random third of the
    splits empty (-inf), every fourth row's lse near +-200 (2^200 overflows fp32 unless the max is subtracted), and,
    from 3 rows on, one row with every split empty."""
    rows, splits, d = shape
    o = rng.standard_normal((rows, splits, d)).astype(np.float32)
    lse = (3 * rng.standard_normal((rows, splits))).astype(np.float32)
    lse[::4] += np.float32(200 * (1 if rng.random() < 0.5 else -1))
    lse[rng.random((rows, splits)) < 1 / 3] = -np.inf
    if rows >= 3:
        lse[int(rng.integers(rows))] = -np.inf
    return o, lse


def combine_reference(o_part: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """The merged rows in float64, as fp32: weights 2^(lse_s - max_s lse_s); a row whose splits are all empty is 0."""
    lse_d = lse.astype(np.float64)
    m = lse_d.max(axis=1, keepdims=True)                               # [rows, 1]; -inf for an empty row
    w = np.where(np.isfinite(m), np.exp2(lse_d - np.where(np.isfinite(m), m, 0.0)), 0.0)      # [rows, splits]
    total = w.sum(axis=1, keepdims=True)
    out = (w[:, :, None] * o_part.astype(np.float64)).sum(axis=1) / np.where(total > 0, total, 1.0)
    return out.astype(np.float32)


def _combine_args(shape, rng):
    rows, splits, d = shape
    o, lse = combine_inputs(shape, rng)
    return o, lse, np.empty((rows, d), np.float32), rows, splits, d


def _torch_combine(o_part, lse, out, rows, splits, d):
    """The baseline: the same merge in PyTorch (softmax of lse over the splits as weights, then a weighted sum)."""
    import torch

    w = torch.softmax(lse * 0.6931471805599453, dim=1).nan_to_num(0.0)
    return (w[:, :, None] * o_part).sum(1)


register(Exercise(
    id="09-split-combine",
    tutorial=TUTORIAL,
    title="Merge flash-decoding's split partials",
    tests="the log-sum-exp merge of partial softmax states, -inf (empty) splits, an empty row, large lse without "
          "overflow, a block-stride loop over the columns",
    kind="cuda",
    kernel="combine_splits",
    signature="const float* o_part, const float* lse, float* out, int rows, int splits, int d",
    task="Row r of the decode has `splits` partial results: o_part[r][s][0 .. d-1] (fp32, [rows, splits, d] row-major) "
         "and lse[r][s] (fp32, log2 units; -inf for a split that saw no key). Write out[r][c] = sum_s w_s "
         "o_part[r][s][c] / sum_s w_s with w_s = exp2f(lse[r][s] - M) and M = max_s lse[r][s]; a row whose splits are "
         "all -inf gets 0 (never NaN). lse reaches +-200, so subtract M before exp2f. Block blockIdx.x takes row "
         "blockIdx.x; its threads take columns threadIdx.x, threadIdx.x + blockDim.x, ... < d. The grader launches "
         "blocks of 32, 128 and 256 threads, grid = rows, on up to 64 splits and d up to 128. Speed bar: at least "
         "50 % of the same merge in PyTorch.",
    make_args=_combine_args,
    outputs=(2,),
    reference=lambda o_part, lse, out, rows, splits, d: (combine_reference(o_part, lse),),
    launch=Launch(grid=lambda shape, block: shape[0], blocks=(32, 128, 256)),
    shapes=((1, 1, 1), (3, 2, 5), (7, 5, 64), (33, 17, 128), (130, 64, 128)),
    sanitize_shape=(7, 5, 64),
    guards=("d",),
    rtol=1e-4,                 # sums of up to 64 weighted terms in another order than the float64 reference
    atol=1e-5,
    speed=SpeedBar(fraction=0.5, baseline="the merge in PyTorch", run_baseline=_torch_combine,
                   shape=(4096, 32, 128), bytes=lambda shape: 4 * shape[0] * shape[1] * (shape[2] + 1)
                   + 4 * shape[0] * shape[2]),
    hints={
        "wrong_values": "three things go wrong here. Take M = max over the row's splits first and weight each split "
                        "by exp2f(lse - M): without the shift, lse = 200 overflows to inf and inf / inf is NaN. A row "
                        "whose splits are all -inf has M = -inf and exp2f(-inf - (-inf)) = NaN: write 0 there. And "
                        "divide by the sum of the weights, not by the number of splits",
        "unwritten": "every column c < d of every row is written: step c by blockDim.x, not by a fixed number",
        "missing_guard": "the block's threads step over the columns while c < d: read d",
        "out_of_bounds": "a thread's column must stay below d: blockDim.x may be more than d",
    },
))


# --- 09-gqa-scores: s[b, h, j] = scale q[b, h] . k[b, h / G, j] for keys below the cache length, -inf past it -------

def _scores_args(shape, rng):
    B, Hq, Hkv, nmax, d = shape
    q = rng.standard_normal((B, Hq, d)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, nmax, d)).astype(np.float32)
    seqlens = rng.integers(0, nmax + 1, size=B).astype(np.int32)       # an empty cache and a full one, where B allows
    seqlens[0] = nmax
    if B > 1:
        seqlens[1] = 0
    return q, k, seqlens, np.empty((B, Hq, nmax), np.float32), B, Hq, Hkv, nmax, d, np.float32(d ** -0.5)


def scores_reference(q, k, seqlens, s, B, Hq, Hkv, nmax, d, scale):
    """[B, Hq, nmax]: the dot products in float64 with query head h on KV head h // (Hq / Hkv); -inf past the cache."""
    G = Hq // Hkv
    kk = np.repeat(k.astype(np.float64), G, axis=1)                     # [B, Hq, nmax, d]
    dots = np.einsum("bhd,bhjd->bhj", q.astype(np.float64), kk) * float(scale)
    past = np.arange(nmax)[None, None, :] >= seqlens[:, None, None]        # [B, 1, nmax]
    dots[np.broadcast_to(past, dots.shape)] = -np.inf
    return (dots.astype(np.float32),)


register(Exercise(
    id="09-gqa-scores",
    tutorial=TUTORIAL,
    title="Decode scores with grouped-query heads and per-sequence cache lengths",
    tests="the GQA head mapping h -> h / (Hq / Hkv), a batch of different cache lengths (0 included), a 2-D grid "
          "with a guard on the keys",
    kind="cuda",
    kernel="gqa_scores",
    signature="const float* q, const float* k, const int* seqlens, float* s, int B, int Hq, int Hkv, int nmax, int d, "
              "float scale",
    task="One query token per sequence: q is [B, Hq, d], the key cache k is [B, Hkv, nmax, d] (fp32, row-major), and "
         "sequence b uses its first seqlens[b] keys. Query head h reads KV head h / (Hq / Hkv). Write "
         "s[b][h][j] = scale * sum_c q[b][h][c] * k[b][h / (Hq / Hkv)][j][c] for j < seqlens[b], and -INFINITY for "
         "seqlens[b] <= j < nmax. Thread threadIdx.x of block (blockIdx.x, blockIdx.y) takes key "
         "j = blockIdx.x * blockDim.x + threadIdx.x of row blockIdx.y = b * Hq + h. The grader launches blocks of 32, "
         "128 and 256 threads, grid (ceil(nmax / blockDim.x), B * Hq), with 1 to 32 query heads per KV head.",
    make_args=_scores_args,
    outputs=(3,),
    reference=scores_reference,
    launch=Launch(grid=lambda shape, block: (ceil_div(shape[3], block), shape[0] * shape[1]), blocks=(32, 128, 256)),
    shapes=((1, 1, 1, 1, 1), (2, 4, 2, 7, 3), (3, 8, 2, 100, 16), (2, 32, 1, 301, 64), (4, 8, 4, 4099, 64)),
    sanitize_shape=(2, 4, 2, 7, 3),
    guards=("nmax",),
    rtol=1e-5,
    atol=1e-5,
    hints={
        "wrong_values": "query head h = blockIdx.y % Hq reads KV head h / (Hq / Hkv) (the G = Hq / Hkv query heads "
                        "of a KV head are consecutive), not h % Hkv; and keys j >= seqlens[b] of sequence "
                        "b = blockIdx.y / Hq get -INFINITY",
        "missing_guard": "the grid is rounded up to whole blocks of keys: a thread with j >= nmax must return",
        "out_of_bounds": "a thread with j >= nmax must return before it reads k or writes s",
        "unwritten": "every key j < nmax of every row gets a value: a score below the cache length, -INFINITY past it",
    },
))
