"""What an exercise is: the task, the reference, the kernel expected, how the grader launches it and on what."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from ..analysis.arch import DEFAULT_ARCH

KINDS = ("cuda", "numba")


@dataclass(frozen=True)
class Launch:
    """How the grader launches the learner's kernel: the blocks it tries and the grid for a problem shape.

    One block: the exercise fixes the launch (the kernel may rely on it, e.g. a 32 x 8 tile). Several: the kernel
    must work for any of them (no hard-coded 256), and the grader tries each. `grid(shape, block)` may return a
    list of grids: the kernel must then work for each (a grid-stride loop covers any grid).
    """

    grid: Callable[[tuple, tuple], Any]      # (problem shape, block) -> grid, or a list of grids to try
    blocks: tuple = (256,)                   # block shapes tried, the first is the one sanitizers use
    shared_bytes: int = 0                    # dynamic shared memory per block

    @property
    def fixed(self) -> bool:
        """True when the exercise fixes the block (one entry in `blocks`)."""
        return len(self.blocks) == 1

    def configs(self, shape) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
        """Every (grid, block) the grader tries for one problem shape, as 3-tuples."""
        out = []
        for block in self.blocks:
            grids = self.grid(tuple(shape), block)
            if not isinstance(grids, list):
                grids = [grids]
            for g in grids:
                cfg = (dim3(g), dim3(block))
                if cfg not in out:
                    out.append(cfg)
        return out


@dataclass(frozen=True)
class SassRule:
    """An instruction the compiled kernel must contain (checked in its SASS, no GPU needed)."""

    pattern: str              # a regular expression over the SASS text, e.g. r"LDG\\.E\\.128"
    kind: str                 # the finding kind when it is missing, e.g. "not_vectorized"
    message: str              # what its absence means, e.g. "no 16-byte global loads (LDG.E.128)"


@dataclass(frozen=True)
class SpeedBar:
    """An optional speed target, reported beside the verdict and never required to pass.

    The learner's kernel and `baseline` (a PyTorch call doing the same job, or moving the same bytes) are timed
    in one `kernellab.bench` run on the arguments of `shape`; the bar is met when the kernel's speed is at least
    `fraction` of the baseline's.
    """

    fraction: float                          # e.g. 0.7: at least 70 % of the baseline's speed
    baseline: str                            # its name, e.g. "a copy of the same bytes"
    run_baseline: Callable[..., Any]         # baseline(*device_args): the same job (or bytes) in PyTorch
    shape: tuple                             # the problem shape timed (large: the GPU's own regime)
    bytes: Callable[[tuple], int] | None = None   # bytes per call, to report GB/s

    def describe(self) -> str:
        return f">= {self.fraction:.0%} of the speed of {self.baseline}"


@dataclass(frozen=True)
class Exercise:
    """One graded exercise: the task, the kernel it expects, its reference and how to test a solution.

    `make_args(shape, rng)` returns the kernel's arguments for one problem shape as NumPy arrays and Python
    numbers (the grader fills the `outputs` with NaN, copies arrays to the GPU where it runs there, and keeps a
    pristine copy for the reference). `reference(*args)` returns the expected outputs (NumPy), one per entry of
    `outputs`. `shapes` go from the smallest (1) through primes and sizes that are not multiples of the block to
    the largest the exercise allows; the simulator (Numba exercises without a GPU) uses `sim_shapes`.
    """

    id: str                                  # "01-reverse": the tutorial's number, then a short name
    tutorial: str                            # the notebook's stem, "01-first-kernel"
    title: str                               # "Reverse an array"
    tests: str                               # what it tests, in a few words: "global index, guard, index math"
    kind: str                                # "cuda" (a %%cuda cell) or "numba" (a @cuda.jit / %%numba kernel)
    kernel: str                              # the stub's kernel name, e.g. "reverse"
    signature: str                           # cuda: "const float* in, float* out, int n"; numba: "inp, out, n"
    make_args: Callable[[tuple, np.random.Generator], tuple]
    outputs: tuple[int, ...]                 # indices of the arguments the kernel writes
    reference: Callable[..., tuple]          # (*args) -> expected outputs (NumPy), one per entry of `outputs`
    launch: Launch
    shapes: tuple                            # problem shapes tried (tuples), smallest first, largest allowed last
    task: str = ""                           # the task in words, as the notebook states it
    sim_shapes: tuple | None = None          # shapes for the Numba simulator (about 5,000 threads/s): keep small
    sanitize_shape: tuple | None = None      # the shape compute-sanitizer runs (default: the second of `shapes`)
    needs_shared: bool = False               # the task needs a shared-memory tile (LDS/STS in the SASS)
    needs_barrier: bool = False              # ... and a __syncthreads() (BAR.SYNC; racecheck and synccheck on a GPU)
    guards: tuple[str, ...] = ()             # scalar parameters that bound the threads: the kernel must read them
    sass: tuple[SassRule, ...] = ()          # further instructions the SASS must hold
    speed: SpeedBar | None = None
    hints: Mapping[str, str] = field(default_factory=dict)   # finding kind -> hint, over the grader's defaults
    arch: str = DEFAULT_ARCH                 # the tutorial's arch: the kernel must compile for it
    rtol: float = 1e-5                       # |yours - ref| <= atol + rtol * |ref|
    atol: float = 1e-6
    names: tuple[str, ...] = ()              # argument names for messages (default: the signature's)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"exercise {self.id}: kind must be one of {KINDS}, got {self.kind!r}")
        if not self.shapes:
            raise ValueError(f"exercise {self.id}: give at least one problem shape")
        object.__setattr__(self, "hints", MappingProxyType(dict(self.hints)))
        object.__setattr__(self, "shapes", tuple(_shape(s) for s in self.shapes))
        if self.sim_shapes is not None:
            object.__setattr__(self, "sim_shapes", tuple(_shape(s) for s in self.sim_shapes))
        if self.sanitize_shape is not None:
            object.__setattr__(self, "sanitize_shape", _shape(self.sanitize_shape))
        if not self.names:
            object.__setattr__(self, "names", tuple(param_names(self.signature)))

    @property
    def number(self) -> str:
        """The tutorial's number, "01"."""
        return self.tutorial.split("-", 1)[0]

    def arg_name(self, index: int) -> str:
        return self.names[index] if index < len(self.names) else f"argument {index}"

    def shapes_for(self, simulated: bool) -> tuple:
        return self.sim_shapes if simulated and self.sim_shapes else self.shapes

    def shape_for_sanitizer(self) -> tuple:
        if self.sanitize_shape is not None:
            return self.sanitize_shape
        return self.shapes[1] if len(self.shapes) > 1 else self.shapes[0]


def dim3(value) -> tuple[int, int, int]:
    """(x, y, z) from an int or a tuple of up to three ints."""
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def _shape(s) -> tuple:
    return (int(s),) if isinstance(s, (int, np.integer)) else tuple(int(v) for v in s)


def param_names(signature: str) -> list[str]:
    """The parameter names of a C parameter list ("const float* in, int n" -> ["in", "n"]) or a Python one."""
    out = []
    for part in (p.strip() for p in signature.split(",")):
        if part:
            out.append(part.replace("*", " ").split()[-1])
    return out


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up: the blocks a grid needs to cover a elements with b threads each."""
    return -(-int(a) // int(b))


def threads(block) -> int:
    return math.prod(dim3(block))
