"""Tutorial 05's step 8 (sgemm_cp, the cp.async pipeline) and the static schedule reader beside it
(tools/gpu/sass_schedule.py), without a GPU.

The control-field decoder is checked on encodings built by hand and on a known loop (the notebook's step 7: its FFMAs
issue one a cycle, its LDS.128 set the scoreboards those FFMAs wait on); the bank model on hand-written instructions.
Step 8 compiles for sm_90 with no spills or local memory in each of its configurations, its main loop holds LDGSTS and
no register-staged copies, and in the CPU emulator (kernellab/run/sim/cuda) it computes A B on awkward shapes against
float64; three mutations (a missing cp.async wait, a wrong stage index, a refill before the barrier) are caught.
"""
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from kernellab.run.sim.cuda.emulate import EmulationError, emulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import sass_schedule as S  # noqa: E402
from notebook_cells import cuda_cells_with_flags  # noqa: E402


def notebook_source(kernel: str = "sgemm_warptile") -> str:
    """The %%cuda cell of notebooks/05-matmul.py that defines `kernel` (step 7's by default)."""
    return next(body for _, body in cuda_cells_with_flags("05-matmul.py") if f"{kernel}(" in body)


def setting(src: str, d: dict, name: str) -> int:
    """A -D option, else the source's `#define name <int>` default."""
    return d.get(name, int(re.search(rf"#define {name} (\d+)", src).group(1)))


def compile_variant(src: str, d: dict):
    import kernellab

    name = "sgemm_cp" if "sgemm_cp(" in src else "sgemm_warptile"
    return kernellab.compile_cuda(src, arch="sm_90", options=tuple(f"-D{k}={v}" for k, v in d.items()),
                                  filename="sgemm_warptile.cu")[name]


def block_tile(src: str, d: dict) -> tuple[int, int, int]:
    """(BM, BN, threads): one warp per WM x WN warp tile."""
    bm, bn = setting(src, d, "BM"), setting(src, d, "BN")
    return bm, bn, (bm // setting(src, d, "WM")) * (bn // setting(src, d, "WN")) * 32


def smem_bytes(src: str, d: dict) -> int:
    """Dynamic shared memory at launch: the stages when they are over the 48 KiB static limit (under it they are
    static)."""
    total = setting(src, d, "STAGES") * (setting(src, d, "BK") * (setting(src, d, "BM") + 4)
                                         + setting(src, d, "BK") * setting(src, d, "BN")) * 4
    return total if total > 48 * 1024 else 0


STEP8 = notebook_source("sgemm_cp")     # tutorial 05's step 8 (BK 16, 4 stages)


def control_word(stall=1, yield_bit=0, wbar=7, rbar=7, wait=0, reuse=0, low_bits=0x1234):
    """A high instruction word carrying these control fields (bits 41-61), other bits `low_bits`."""
    c = stall | yield_bit << 4 | wbar << 5 | rbar << 8 | wait << 11 | reuse << 17
    return c << 41 | low_bits


# --- the control field and the bank model ---------------------------------------------------------------------------

@pytest.mark.parametrize("fields", [dict(stall=1), dict(stall=15, yield_bit=1), dict(wbar=3, rbar=5),
                                    dict(wait=0b100101, reuse=0b0101), dict(stall=4, wbar=0, wait=0b111111)])
def test_control_fields_decode(fields):
    c = S.Control.decode(control_word(**fields))
    assert c.stall == fields.get("stall", 1) and c.yield_bit == fields.get("yield_bit", 0)
    assert c.write_barrier == (None if fields.get("wbar", 7) == 7 else fields["wbar"])
    assert c.read_barrier == (None if fields.get("rbar", 7) == 7 else fields["rbar"])
    assert c.wait_mask == fields.get("wait", 0) and c.reuse == fields.get("reuse", 0)


def _ins(text, **fields):
    body = S.PREDICATE.sub("", text)
    return S.Instruction(0, text, body.split()[0], S.Control.decode(control_word(**fields)))


def test_bank_model():
    # three sources in one bank (all odd): one extra cycle; two in one bank: none
    assert S.bank_conflict_cycles(_ins("FFMA R0, R1, R3, R5"), None) == 1
    assert S.bank_conflict_cycles(_ins("FFMA R0, R1, R2, R5"), None) == 0
    # the same register twice is read once; RZ is not read
    assert S.bank_conflict_cycles(_ins("FFMA R0, R1, R1, R5"), None) == 0
    assert S.bank_conflict_cycles(_ins("FFMA R0, R2, RZ, R4"), None) == 0
    # R1 in slot 0 kept by the previous instruction's reuse flag: served by the reuse cache
    prev = _ins("FFMA R8, R1.reuse, R6, R8", reuse=0b0001)
    assert S.bank_conflict_cycles(_ins("FFMA R0, R1, R3, R5"), prev) == 0
    # ... but not from another slot
    assert S.bank_conflict_cycles(_ins("FFMA R0, R3, R1, R5"), prev) == 1
    assert _ins("ISETP.GE.AND P0, PT, R11, UR18, PT").sources() == ["R11", None, None]
    assert _ins("@!P2 STS [R4+0x10], R7").sources() == [None, "R7"]


@pytest.fixture(scope="module")
def head_schedule():
    """The notebook's step 7 (sgemm_warptile) at its default: a loop whose schedule is known."""
    src = notebook_source()
    k = compile_variant(src, {"BK": 16, "WM": 64, "WN": 32})
    return S.main_loop(S.parse(k.sass))


def test_known_loop_decodes_as_expected(head_schedule):
    body = head_schedule
    ffma = [i for i in body if i.base == "FFMA"]
    assert len(ffma) == 16 * 4 * 16                               # a lane's 16 x 4 per k, BK = 16
    assert sum(i.control.stall == 1 for i in ffma) > 0.95 * len(ffma)   # FFMAs back to back
    lds = [i for i in body if i.opcode == "LDS.128"]
    set_by_lds = {i.control.write_barrier for i in lds if i.control.write_barrier is not None}
    assert set_by_lds, "the LDS.128 of the loop set no scoreboard"
    waited = 0
    for i in ffma:
        waited |= i.control.wait_mask
    assert all(waited >> b & 1 for b in set_by_lds), "the FFMAs wait on the LDS scoreboards"
    assert all(i.control.write_barrier is not None for i in body if i.base == "LDG")
    sched = S.schedule(body)
    assert sched.ffma == len(ffma) and sched.stall_cycles >= sched.instructions
    assert 0.15 < sched.reuse_hit_fraction < 0.5                   # the a operand reused across 4 columns


# --- step 8: compile ----------------------------------------------------------------------------------------

STEP8_CONFIGS = [{"BK": 8, "STAGES": 3}, {"BK": 8, "STAGES": 4}, {"BK": 16, "STAGES": 3},
                 {"BM": 256, "BN": 128, "BK": 8, "STAGES": 3}, {}]


@pytest.mark.parametrize("d", STEP8_CONFIGS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()) or "default")
def test_step8_compiles_lean(d):
    k = compile_variant(STEP8, d)
    r = k.resources
    assert r.spill_store_bytes == r.spill_load_bytes == 0 and r.local_bytes == 0
    assert "LDL" not in k.sass and "STL" not in k.sass
    sched = S.loop_schedule(k.sass)
    bk = d.get("BK", 16)
    assert sched.ffma == 16 * 8 * bk                              # 16 x 8 per lane, BK k-steps
    assert sched.mix.get("LDGSTS.128", 0) >= 1 and sched.mix.get("LDGSTS", 0) >= 1   # B by 16 bytes, A by 4
    assert not any(m.startswith(("LDG.", "STS")) or m in ("LDG", "STS") for m in sched.mix)   # nothing via registers
    assert sched.mix.get("LDS.128") == 6 * bk and sched.mix.get("BAR") == 1
    assert sched.instructions < 1.15 * sched.ffma                 # FFMA share over 87 %


def test_step8_launch_settings():
    assert block_tile(STEP8, {}) == (128, 256, 256)
    assert block_tile(STEP8, {"BM": 256, "BN": 128}) == (256, 128, 256)
    assert smem_bytes(STEP8, {"BK": 8, "STAGES": 3}) == 0   # 37,248 B: static
    assert smem_bytes(STEP8, {"BK": 8, "STAGES": 4}) == 4 * 8 * (132 + 256) * 4
    assert smem_bytes(STEP8, {"BK": 16, "STAGES": 3}) == 3 * 16 * (132 + 256) * 4
    assert smem_bytes(STEP8, {}) == 4 * 16 * (132 + 256) * 4   # step 8's defaults


# --- step 8: exact on awkward shapes in the emulator --------------------------------------------------------

def run_emulated(src, M, N, K, d=None, seed=0):
    d = d or {}
    bm, bn, threads = block_tile(src, d)
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C = np.full((M, N), np.nan, np.float32)
    emulate(src, "sgemm_cp", ((N + bn - 1) // bn, (M + bm - 1) // bm), threads, [A, B, C, M, N, K],
            smem_bytes(src, d), defines=d)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    scale = np.abs(A).astype(np.float64) @ np.abs(B).astype(np.float64)   # |A||B|: fp32 error grows with it
    return C, ref, scale


def assert_product(C, ref, scale):
    assert not np.isnan(C).any(), f"{np.isnan(C).sum()} elements of C never written or read from unwritten smem"
    err = np.abs(C - ref) / np.maximum(scale, 1e-30)
    assert err.max() < 1e-5, f"max error {err.max():.3g} relative to |A||B|"


FAST = [(130, 70, 33), (5, 8, 4), (257, 132, 36)]          # 33: K % 4 != 0; 70: N % 4 != 0 (4-byte B copies)
SLOW = [(300, 260, 72), (129, 257, 17), (1, 1, 1)]


@pytest.mark.parametrize("shape", FAST, ids=lambda s: "x".join(map(str, s)))
def test_step8_product(shape):
    assert_product(*run_emulated(STEP8, *shape))


@pytest.mark.slow
@pytest.mark.parametrize("d", [d for d in STEP8_CONFIGS if d], ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
@pytest.mark.parametrize("shape", SLOW[:2], ids=lambda s: "x".join(map(str, s)))
def test_step8_product_configs(shape, d):
    assert_product(*run_emulated(STEP8, *shape, d))


@pytest.mark.slow
@pytest.mark.parametrize("shape", SLOW, ids=lambda s: "x".join(map(str, s)))
def test_step8_product_more_shapes(shape):
    assert_product(*run_emulated(STEP8, *shape))


MUTATIONS = {
    "missing wait": ("                cp_async_wait<STAGES - 3>();\n", ""),
    "wrong stage index": ("rd = rd + STAGE_F == STAGES * STAGE_F ? 0 : rd + STAGE_F;", "rd = rd == 0 ? STAGE_F : 0;"),
    "refill before the barrier": ("                __syncthreads();                      // also: every warp",
                                  "                // also: every warp"),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_step8_mutations_caught(name):
    old, new = MUTATIONS[name]
    assert STEP8.count(old) == 1
    src = STEP8.replace(old, new)
    try:
        C, ref, scale = run_emulated(src, 257, 132, 72)
    except EmulationError:
        return                                                     # the emulator refused it: caught
    with pytest.raises(AssertionError):
        assert_product(C, ref, scale)
