"""Exercises of tutorial 07 (fused attention): the online softmax's running (max, sum) over a row, merged across a
warp with -inf handled, then the A fragments of mma.sync read with ldmatrix.x4 from an XOR-swizzled shared tile."""
from __future__ import annotations

import numpy as np

from . import register
from .spec import Exercise, Launch, SassRule, SpeedBar, ceil_div

TUTORIAL = "07-fused-attention"


# --- 07-online-softmax: one warp per row, each lane's running (m, l), merged by shuffles; -inf rows defined -----------

# Kinds of rows make_args mixes (row r gets kind (r + offset) % 6, the offset random): every shape of 6 rows or more
# has each kind, and a one-row shape draws one.
ROW_KINDS = ("scores", "large", "masked_keys", "window", "fully_masked", "constant")


def softmax_rows(shape, rng) -> np.ndarray:
    """A [rows, n] fp32 score matrix with every kind of row the online softmax meets (ROW_KINDS):
    scores ~ N(0, 4^2); large scores (up to about 300: exp(x) overflows fp32 unless the max is subtracted first); a
    random third of the keys masked to -inf; only a window of keys kept (many lanes see nothing but -inf); a fully
    masked row (m = -inf, l = 0); a constant row (ties)."""
    rows, n = shape
    x = (4 * rng.standard_normal((rows, n))).astype(np.float32)
    offset = int(rng.integers(len(ROW_KINDS)))
    for r in range(rows):
        kind = ROW_KINDS[(r + offset) % len(ROW_KINDS)]
        if kind == "large":
            x[r] = 60 * rng.standard_normal(n) + 60
        elif kind == "masked_keys":
            x[r, rng.random(n) < 1 / 3] = -np.inf
        elif kind == "window":
            a = int(rng.integers(n))
            b = int(rng.integers(a, n)) + 1                # keys a .. b - 1 kept, at least one
            x[r, :a] = -np.inf
            x[r, b:] = -np.inf
        elif kind == "fully_masked":
            x[r] = -np.inf
        elif kind == "constant":
            x[r] = np.float32(rng.standard_normal())
    return x


def softmax_stats_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """m[r] = max_j x[r, j] and l[r] = sum_j exp(x[r, j] - m[r]) in float64, as fp32; a fully masked row (all -inf)
    has m = -inf and l = 0, so that softmax = exp(x - m) / l wherever l > 0."""
    xd = x.astype(np.float64)
    m = xd.max(axis=1)                                     # [rows]; -inf for a fully masked row
    shift = np.where(np.isfinite(m), m, 0.0)               # exp(-inf - 0) = 0: such a row sums to l = 0
    l = np.exp(xd - shift[:, None]).sum(axis=1)            # [rows]
    return m.astype(np.float32), l.astype(np.float32)


def _softmax_args(shape, rng):
    rows, n = shape
    return softmax_rows(shape, rng), np.empty(rows, np.float32), np.empty(rows, np.float32), rows, n


def _softmax_grid(shape, block):
    rows, _ = shape
    return ceil_div(rows, block[1])                        # one warp (threadIdx.y) per row


def _torch_logsumexp(x, m, l, rows, n):
    """The baseline: PyTorch's logsumexp over the rows, one pass of the same bytes (log l + m, in one number)."""
    import torch

    return torch.logsumexp(x, dim=1)


register(Exercise(
    id="07-online-softmax",
    tutorial=TUTORIAL,
    title="Online softmax statistics of a row, one warp per row",
    tests="the online (max, sum) update, merging two partial states with shuffles, -inf (masked) keys and fully "
          "masked rows, rows of any length",
    kind="cuda",
    kernel="softmax_stats",
    signature="const float* x, float* m, float* l, int rows, int n",
    task="For each row r of the [rows, n] fp32 matrix x (row-major), m[r] = max_j x[r][j] and l[r] = sum_j "
         "exp(x[r][j] - m[r]), in one pass over the row: warp threadIdx.y of block blockIdx.x owns row "
         "blockIdx.x * blockDim.y + threadIdx.y; lane threadIdx.x walks keys lane, lane + 32, ... keeping its own "
         "running (m, l) with the online update, and the warp then merges the 32 states with __shfl_xor_sync "
         "(l = l_a exp(m_a - m) + l_b exp(m_b - m) with m = max(m_a, m_b)). Masked keys are -inf; a fully masked row "
         "has m = -inf and l = 0, never NaN. Use expf (or __expf / exp2f): one MUFU.EX2 each. The grader launches "
         "blocks of 32 x 1, 32 x 4 and 32 x 8 threads, grid ceil(rows / blockDim.y), on rows of 1 to 100,003 keys "
         "with large scores, masked keys, masked rows and ties. Speed bar: at least 50 % of torch.logsumexp.",
    make_args=_softmax_args,
    outputs=(1, 2),
    reference=lambda x, m, l, rows, n: softmax_stats_reference(x),
    launch=Launch(grid=_softmax_grid, blocks=((32, 1), (32, 4), (32, 8))),
    shapes=((1, 1), (1, 31), (7, 1), (3, 33), (13, 100), (65, 257), (33, 1000), (2, 100_003), (1031, 4099)),
    sanitize_shape=(13, 100),
    guards=("rows", "n"),
    sass=(SassRule(r"\bSHFL\.", "no_shuffle",
                   "no warp shuffle (SHFL) in its SASS: the 32 lanes' partial states are never merged in registers"),
          SassRule(r"\bMUFU\.EX2\b", "no_exp2",
                   "no MUFU.EX2 in its SASS: the exponentials are not computed by the special-function unit "
                   "(expf, __expf and exp2f in float all are)")),
    rtol=1e-4,                 # l sums up to 100,003 fp32 terms in another order than the float64 reference
    atol=1e-6,
    speed=SpeedBar(fraction=0.5, baseline="torch.logsumexp", run_baseline=_torch_logsumexp, shape=(8192, 4096),
                   bytes=lambda shape: 4 * shape[0] * shape[1] + 2 * 4 * shape[0]),
    hints={
        "wrong_values": "two things go wrong here. A state that has seen only -inf is (m = -inf, l = 0), and "
                        "updating it with another -inf computes exp(-inf - (-inf)) = exp(NaN): skip the update when "
                        "the new max is -inf (or subtract 0 instead, as the tutorial's kernel does). And when two "
                        "states merge, both sums must be rescaled to the larger max before they are added: "
                        "l = l_a exp(m_a - m) + l_b exp(m_b - m). Also check every key is visited: j < n, in steps "
                        "of 32",
        "no_shuffle": "merge the lanes' states with __shfl_xor_sync(0xffffffff, v, offset) for offset 16, 8, 4, 2, 1: "
                      "after the five steps every lane holds the row's (m, l)",
        "no_exp2": "compute the exponentials in float with expf, __expf or exp2f (scaled by log2(e)): each is one "
                   "MUFU.EX2 on the special-function unit",
        "missing_guard": "the grid is rounded up to whole blocks of blockDim.y rows: a warp whose row is >= rows must "
                         "return before it reads x",
        "out_of_bounds": "guard the warp's row (row < rows) and each lane's key (j < n): rows past the end and keys "
                         "past n belong to no one",
        "unwritten": "one lane of each row's warp (lane 0) stores m[row] and l[row], for every row < rows",
        "launch_config": "the warp's row is blockIdx.x * blockDim.y + threadIdx.y: use blockDim.y, not a fixed number "
                         "of rows per block",
        "off_by_one": "the row starts at x + row * n and its keys are j = 0 .. n - 1",
    },
))


# --- 07-ldmatrix-swizzle: a swizzled shared tile and the A fragments of mma.m16n8k16 through ldmatrix.x4 -------------

TILE_ROWS, TILE_COLS = 16, 64          # one warp's m16 tile of Q at head dim 64: 16 rows of 128 bytes (8 chunks)
CHUNK = 8                              # 16-bit values per 16-byte chunk
KC = TILE_COLS // 16                   # k-chunks of 16 columns: one ldmatrix.x4 (one A fragment) each
MAX_WARPS = 4                          # warps per block at most: the shared tile array holds 4 tiles


def swizzled_chunk(row, chunk):
    """Where 16-byte chunk `chunk` of tile row `row` is stored in the swizzled tile: chunk ^ (row % 8) of that row."""
    return chunk ^ (row % 8)


def swizzled_image(q: np.ndarray) -> np.ndarray:
    """[tiles, 16, 64] -> the bytes of the swizzled shared tiles, as [tiles, 16, 64] 16-bit values."""
    rows, chunks = np.meshgrid(np.arange(TILE_ROWS), np.arange(TILE_COLS // CHUNK), indexing="ij")   # [16, 8]
    tiles = q.reshape(-1, TILE_ROWS, TILE_COLS // CHUNK, CHUNK)            # [tiles, row, chunk, 8]
    out = np.empty_like(tiles)
    out[:, rows, swizzled_chunk(rows, chunks)] = tiles[:, rows, chunks]
    return out.reshape(-1, TILE_ROWS, TILE_COLS)


def a_fragment_map() -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of the 16-bit value in the low half of register i of lane `lane` for k-chunk kc, as two
    [KC, 32, 4] arrays; the high half holds the next column. From the PTX ISA's table for the A operand of
    mma.m16n8k16 (.bf16/.f16): with g = lane / 4 and t = lane % 4, a0 is row g, columns 2t, 2t + 1; a1 row g + 8;
    a2 row g, columns 2t + 8, 2t + 9; a3 row g + 8, columns 2t + 8, 2t + 9 (of the 16 columns 16 kc .. 16 kc + 15)."""
    kc, lane, reg = np.meshgrid(np.arange(KC), np.arange(32), np.arange(4), indexing="ij")
    g, t = lane // 4, lane % 4
    rows = g + 8 * (reg % 2)
    cols = 16 * kc + 2 * t + 8 * (reg // 2)
    return rows, cols


def fragments_reference(q: np.ndarray) -> np.ndarray:
    """[tiles, 16, 64] 16-bit values -> the A fragments [tiles, KC, 32 lanes, 4 registers] as uint32 (lo | hi << 16).
    Each register is two adjacent values starting at an even column: one 32-bit word of the row (little-endian)."""
    rows, cols = a_fragment_map()
    words = np.ascontiguousarray(q).reshape(q.shape[0], -1).view("<u4")    # [tiles, 512]: values 2i, 2i + 1
    return np.take(words, ((rows * TILE_COLS + cols) // 2).ravel(), axis=1).reshape(q.shape[0], KC, 32, 4)


def _frag_args(shape, rng):
    (tiles,) = shape
    q = rng.integers(0, 0xFFFF, size=(tiles, TILE_ROWS, TILE_COLS), dtype=np.uint16)   # bf16 bits, any pattern
    return (q, np.empty((tiles, KC, 32, 4), np.uint32), np.empty((tiles, TILE_ROWS, TILE_COLS), np.uint16), tiles)


register(Exercise(
    id="07-ldmatrix-swizzle",
    tutorial=TUTORIAL,
    title="A fragments through ldmatrix.x4 from a swizzled shared tile",
    tests="the mma.m16n8k16 A-fragment layout, ldmatrix.x4's lane addresses, the XOR swizzle on the write and on the "
          "read, __syncwarp, a guard on the warp's tile",
    kind="cuda",
    kernel="ldmatrix_frags",
    signature="const unsigned short* q, unsigned int* frag, unsigned short* image, int tiles",
    task="q holds `tiles` tiles of 16 rows x 64 bf16 values (as unsigned short bits, row-major, 2 KB each). Warp "
         "w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32 takes tile w: (1) it copies the tile into its own "
         "__shared__ tile in the swizzled layout, 16-byte chunk c of row r stored at byte "
         "r * 128 + 16 * (c ^ (r % 8)); (2) after a __syncwarp(), for each k-chunk kc = 0..3 one ldmatrix.x4 loads "
         "the A fragment of columns 16 kc .. 16 kc + 15 (with g = l / 4 and t = l % 4, lane l's a0 is row g, columns "
         "2t and 2t + 1, the lower in the low half; a1 row g + 8; a2 row g, columns 2t + 8 and 2t + 9; a3 row g + 8 "
         "there), and lane l stores its four registers to frag[((w * 4 + kc) * 32 + l) * 4 + 0..3]; (3) it copies its "
         "shared tile out, byte for byte, to the 2 KB of image at tile w. Warps past the last tile do nothing. The "
         "grader launches blocks of 32, 96 and 128 threads (at most 4 warps), grid ceil(tiles / (blockDim.x / 32)), "
         "and checks every register of every lane against the PTX ISA's fragment table, and the image against the "
         "swizzle.",
    make_args=_frag_args,
    outputs=(1, 2),
    reference=lambda q, frag, image, tiles: (fragments_reference(q), swizzled_image(q)),
    launch=Launch(grid=lambda shape, block: ceil_div(shape[0], block // 32), blocks=(32, 96, 128)),
    shapes=(1, 3, 7, 33, 1000, 100_003),
    sanitize_shape=7,
    needs_shared=True,
    guards=("tiles",),
    sass=(SassRule(r"\bLDSM\.16\.M88\.4\b", "no_ldmatrix",
                   "no ldmatrix.x4 (LDSM.16.M88.4) in its SASS: the fragments are not loaded by ldmatrix"),),
    hints={
        "wrong_values": "lane l gives ldmatrix.x4 the address of row l % 16 of the tile at 16-byte chunk 2 kc + l / 16 "
                        "(matrix i = lanes 8i .. 8i + 7 is rows 0-7, 8-15, 0-7, 8-15 of columns 16 kc + 0-7, 0-7, "
                        "8-15, 8-15: a0..a3 of the A fragment), and that address must be swizzled the way the tile "
                        "was written: byte r * 128 + 16 * (c ^ (r % 8))",
        "input_copy": "the shared tile is stored row-major, not swizzled: put 16-byte chunk c of row r at chunk "
                      "c ^ (r % 8) of that row (and read it back from the same place)",
        "no_ldmatrix": "load each 16 x 16 piece with one ldmatrix.x4 (the asm statement in the task): it gives every "
                       "lane its four fragment registers in one instruction",
        "no_shared": "copy the tile into a __shared__ tile first: ldmatrix reads shared memory only",
        "missing_guard": "the last block can hold more warps than there are tiles left: a warp with w >= tiles must "
                         "return before it touches memory",
        "out_of_bounds": "a warp with w >= tiles must return before it reads q or writes frag and image",
        "unwritten": "each warp writes all four k-chunks of frag (kc = 0..3, 32 lanes x 4 registers each) and the "
                     "whole 2 KB of its image",
        "launch_config": "the warp's tile is blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, and its shared tile is "
                         "indexed by threadIdx.x / 32: use blockDim.x, not a fixed number of warps",
        "race": "put a __syncwarp() between the stores into the shared tile and the ldmatrix: each lane reads rows "
                "that other lanes wrote",
    },
))
