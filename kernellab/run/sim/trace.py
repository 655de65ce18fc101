"""Shared-memory traces without a GPU: runs a Numba kernel in the CUDA simulator and model its bank conflicts.

`trace_shared(kernel, grid, block, *args)` runs `kernel` (a `@cuda.jit` kernel, real or simulated, or its Python
function) in Numba's CUDA simulator with every `cuda.shared.array` replaced by a recording array. Each element a thread
reads or writes is logged as (block, thread, source line, the thread's n-th shared access on that line, load, store or
atomic, byte address, width). The log is grouped into warp-level accesses by (block, warp, line, n), and each group is
modelled with `kernellab.analysis.banks`; the result sums them per source line and in total.

Which simulator: `numba.cuda.simulator` is an ordinary module of numba-cuda. It imports whether or not
`NUMBA_ENABLE_CUDASIM=1` was set and runs next to the real `numba.cuda` (which can still `compile_ptx`): during a
launch it swaps the kernel's global `cuda` (whatever `from numba import cuda` is) for its fake module, so a kernel
written against the real `numba.cuda` runs unchanged. Real `@cuda.jit(device=True)` functions that the kernel's
module globals name (and theirs, in turn) are swapped for simulated ones for the launch. No environment variable is
needed and none is changed; with `NUMBA_ENABLE_CUDASIM=1` (where `numba.cuda` is the simulator) it works the same.

How it hooks the simulator: the launch runs with kernellab.run.sim.sched's block scheduler, whose fake `cuda` module
hands out recording shared arrays (and records shared atomics once each) for the launch. This relies on
numba-cuda's simulator internals (checked with numba-cuda 0.30). Launches are serialised by a lock, as the simulator
requires.

Where the simulator differs from hardware, and so where a trace can mislead:
- Threads are not run in warp lockstep: each CUDA thread runs until its next barrier. Warp accesses are rebuilt by pairing each
  thread's n-th shared access on a source line with the other lanes' n-th access on that line. Loops whose trip count
  differs between lanes, or divergent branches that touch shared memory a different number of times on one line, can
  misgroup (lanes of different iterations are then modelled as one access).
- Addresses come from the element each thread indexes (width = the array's itemsize); the compiler may vectorise or
  split accesses differently. Arrays are placed at 128-byte-aligned offsets in creation order (the real layout is the
  compiler's; conflicts within one array do not depend on it). 1- and 2-byte elements are modelled as their 4-byte
  word; widths other than 1, 2, 4, 8 and 16 bytes are counted but not modelled.
- Stores and atomics are modelled with the load rules (the measured golden table covers loads).
- The simulator runs some ten thousand threads per second: trace small problems (one or a few blocks).
"""
from __future__ import annotations

import linecache
import os
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from kernellab.analysis.banks import ACCESS_BYTES, WARP_SIZE, WarpAccess, analyze_access
from kernellab.report import Raw, esc, html_table, mimebundle

from . import sched as simsched
from .numba_sim import (SimulatedKernelError, kernel_error, launch_lock, python_function, simulate,
                        simulated_device_functions, to_host)
from .sched import current

SIMULATOR_NOTES = (
    "Numba simulator trace: threads do not run in warp lockstep, so warp accesses pair each thread's n-th shared "
    "access on a line with its lanes' n-th; loops with lane-dependent trip counts or divergent branches can misgroup.",
    "Shared arrays sit at 128-byte-aligned offsets in creation order; stores and atomics use the load model.",
)

_ARRAY_ALIGN_BYTES = 128


@dataclass(frozen=True)
class SharedAllocation:
    """One `cuda.shared.array` the kernel created, and where the trace placed it."""

    line: int  # source line of the cuda.shared.array call (line_offset applied)
    shape: tuple[int, ...]
    dtype: str
    base_address: int  # byte offset in the block's shared memory, 128-byte aligned
    nbytes: int
    dynamic: bool  # cuda.shared.array(0, ...): the launch's dynamic shared memory


@dataclass(frozen=True)
class TracedAccess:
    """One reconstructed warp-level shared access and its bank model."""

    block: tuple[int, int, int]
    warp: int  # warp index within the block
    filename: str
    line: int  # line_offset applied
    ordinal: int  # the threads' n-th shared access on this line
    kind: str  # "load", "store" or "atomic"
    element_bytes: int  # itemsize of the array accessed
    access: WarpAccess | None  # None where the element width is not modelled


@dataclass(frozen=True)
class LineSummary:
    """All warp accesses of one kind and width made by one source line."""

    filename: str
    line: int  # line_offset applied
    source: str  # the line's text, stripped ('' if unknown)
    kind: str  # "load", "store" or "atomic"
    element_bytes: int
    instructions: int  # warp-level accesses (what ncu counts as shared instructions executed)
    wavefronts: int
    ideal_wavefronts: int  # the same accesses without bank conflicts
    ways: int  # worst n-way bank conflict on this line
    worst: WarpAccess | None  # the access with the most wavefronts (for pictures)

    @property
    def wavefronts_per_instruction(self) -> float:
        """Average wavefronts per warp access: 1 for conflict-free 4-byte accesses."""
        return self.wavefronts / self.instructions if self.instructions else 0.0


@dataclass(frozen=True)
class SharedTrace:
    """Bank-conflict summary of one simulated launch: per source line and in total."""

    kernel_name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    lines: tuple[LineSummary, ...]
    accesses: tuple[TracedAccess, ...]
    allocations: tuple[SharedAllocation, ...]
    unmodelled: int  # warp accesses whose element width the bank model does not cover
    notes: tuple[str, ...] = SIMULATOR_NOTES

    @property
    def instructions(self) -> int:
        """Warp-level shared accesses, all lines."""
        return sum(s.instructions for s in self.lines)

    @property
    def wavefronts(self) -> int:
        """Wavefronts, all lines."""
        return sum(s.wavefronts for s in self.lines)

    @property
    def ideal_wavefronts(self) -> int:
        """Wavefronts had there been no bank conflict."""
        return sum(s.ideal_wavefronts for s in self.lines)

    @property
    def ways(self) -> int:
        """Worst n-way bank conflict in the launch."""
        return max((s.ways for s in self.lines), default=0)

    def line(self, line: int, kind: str | None = None) -> LineSummary:
        """The summary for one source line (and kind, where a line both loads and stores)."""
        found = [s for s in self.lines if s.line == line and (kind is None or s.kind == kind)]
        if len(found) != 1:
            have = ", ".join(f"{s.line} ({s.kind})" for s in self.lines) or "none"
            raise KeyError(
                f"{'no' if not found else 'several'} shared accesses on line {line}"
                f"{'' if kind is None else f' of kind {kind!r}'}; lines traced: {have}"
                + ("; pass kind='load' or 'store'" if len(found) > 1 else "")
            )
        return found[0]

    @property
    def title(self) -> str:
        """One line: kernel, instructions, wavefronts and worst conflict."""
        return (
            f"{self.kernel_name}: {self.instructions} shared accesses, {self.wavefronts} wavefronts "
            f"(ideal {self.ideal_wavefronts}), worst {self.ways}-way bank conflict "
            f"[simulated grid {self.grid}, block {self.block}]"
        )

    def __str__(self) -> str:
        out = [self.title]
        width = max((len(str(s.line)) for s in self.lines), default=1)
        for s in self.lines:
            out.append(
                f"  line {s.line:>{width}} {s.kind:<6} {s.element_bytes:>2} B  {s.instructions:6d} accesses "
                f"{s.wavefronts:8d} wavefronts ({s.wavefronts_per_instruction:5.2f}/access, worst {s.ways:2d}-way)"
                + (f"  | {s.source}" if s.source else "")
            )
        if self.unmodelled:
            out.append(f"  {self.unmodelled} accesses of an element width the bank model does not cover were skipped")
        out += [f"  note: {n}" for n in self.notes]
        return "\n".join(out)

    def _repr_html_(self) -> str:
        rows = [
            (
                s.line,
                s.kind,
                s.element_bytes,
                s.instructions,
                s.wavefronts,
                f"{s.wavefronts_per_instruction:.2f}",
                f"{s.ways}-way",
                Raw(f"<code>{esc(s.source)}</code>", s.source),
            )
            for s in self.lines
        ]
        table = html_table(["line", "kind", "bytes", "accesses", "wavefronts", "per access", "worst", "source"], rows)
        notes = "".join(f"<li>{esc(n)}</li>" for n in self.notes)
        return (
            f"<div class='kernellab-banks'><b>{esc(self.title)}</b>{table}"
            f"<ul style='font-size:smaller'>{notes}</ul></div>"
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return mimebundle(self, include, exclude)

    def to_json(self) -> dict:
        """`{"kind": "banks", "version": 1, "title", "source": "simulator", "kernel", "grid", "block", "instructions",
        "wavefronts", "ideal_wavefronts", "ways", "unmodelled", "lines": [{"filename", "line", "source", "kind",
        "element_bytes", "instructions", "wavefronts", "ideal_wavefronts", "ways"}], "allocations": [{"line", "shape",
        "dtype", "base_address", "nbytes", "dynamic"}], "notes": [str]}`."""
        return {
            "kind": "banks",
            "version": 1,
            "title": self.title,
            "source": "simulator",
            "kernel": self.kernel_name,
            "grid": list(self.grid),
            "block": list(self.block),
            "instructions": self.instructions,
            "wavefronts": self.wavefronts,
            "ideal_wavefronts": self.ideal_wavefronts,
            "ways": self.ways,
            "unmodelled": self.unmodelled,
            "lines": [
                {
                    "filename": shown_filename(s.filename),
                    "line": s.line,
                    "source": s.source,
                    "kind": s.kind,
                    "element_bytes": s.element_bytes,
                    "instructions": s.instructions,
                    "wavefronts": s.wavefronts,
                    "ideal_wavefronts": s.ideal_wavefronts,
                    "ways": s.ways,
                }
                for s in self.lines
            ],
            "allocations": [
                {
                    "line": a.line,
                    "shape": list(a.shape),
                    "dtype": a.dtype,
                    "base_address": a.base_address,
                    "nbytes": a.nbytes,
                    "dynamic": a.dynamic,
                }
                for a in self.allocations
            ],
            "notes": list(self.notes),
        }


def shown_filename(filename: str) -> str:
    """A source file's name as a reader knows it: "cell" for a notebook cell (IPython names a cell's code by a
    temporary file that is not on disk, or `<...>`), else the path."""
    if filename.startswith("<") or not os.path.isfile(filename):
        return "cell"
    return filename


def trace_shared(kernel, grid, block, *args, line_offset: int = 0, dynamic_smem_bytes: int = 0) -> SharedTrace:
    """Run `kernel[grid, block](*args)` in the Numba CUDA simulator and model every warp's shared accesses.

    `kernel` is a `@cuda.jit` kernel (real or simulated) or its Python function; NumPy array arguments are copied in
    and back as for a simulated launch. `line_offset` is added to the line numbers reported for the kernel's own file
    (to match a notebook cell or a source string's numbering). See the module docstring for how the simulator differs
    from hardware.
    """
    py_func = python_function(kernel)
    grid3, block3 = _dim3(grid, "grid"), _dim3(block, "block")
    host, back = to_host(args)
    try:
        trace = _trace(kernel, grid3, block3, host, line_offset=line_offset, dynamic_smem_bytes=dynamic_smem_bytes)
    except SimulatedKernelError:
        raise
    except Exception as exc:
        raise kernel_error(exc, py_func, grid3, block3, line_offset, "line") from None
    for write in back:
        write()
    return trace


def simulate_traced(kernel, grid, block, args, *, shared_bytes: int = 0, line_offset: int = 0,
                    line_label: str = "line") -> SharedTrace:
    """numba_sim.simulate recording shared memory: the launch's SharedTrace (arguments written back as usual)."""
    def launch(py_func, grid3, block3, host, function_for):
        return _trace(kernel, grid3, block3, host, line_offset=line_offset, dynamic_smem_bytes=shared_bytes,
                      function_for=function_for)

    return simulate(kernel, grid, block, args, shared_bytes=shared_bytes, line_offset=line_offset,
                    line_label=line_label, launch=launch)


def _trace(kernel, grid3, block3, args, *, line_offset: int = 0, dynamic_smem_bytes: int = 0,
           function_for=None) -> SharedTrace:
    """trace_shared without the argument copies and error wrapping (simulate_traced and trace_shared add them)."""
    # numba is optional: imported where a launch needs it (works with or without NUMBA_ENABLE_CUDASIM)
    from numba.cuda.simulator import kernel as sim_kernel

    if not _internal_dirs:
        _internal_dirs.append(os.path.normcase(os.path.dirname(os.path.abspath(sim_kernel.__file__))) + os.sep)
    py_func = python_function(kernel)
    recorder = Recorder()
    with launch_lock, simulated_device_functions(py_func):
        simsched.launch(py_func, grid3, block3, args, dynamic_smem_bytes=dynamic_smem_bytes,
                        extensions=getattr(kernel, "extensions", ()) or (), function_for=function_for,
                        module_hook=lambda module: install_recorder(module, recorder))
    return _summarise(recorder, py_func, grid3, block3, line_offset)


# ---------------------------------------------------------------------------------------------------------------------
# Recording


class Recorder:
    """Collects (block, thread, file, line, ordinal, kind, width, address) for every shared element touched."""

    def __init__(self):
        self.events: list[tuple] = []
        self.allocations: list[tuple] = []  # (filename, line, shape, dtype, base, nbytes, dynamic)
        self._next_base = 0
        self._lock = threading.Lock()

    def allocate(self, nbytes: int, where: tuple[str, int], shape, dtype, dynamic: bool) -> int:
        with self._lock:
            base = self._next_base
            self._next_base = -(-(base + max(nbytes, 1)) // _ARRAY_ALIGN_BYTES) * _ARRAY_ALIGN_BYTES
            self.allocations.append((where[0], where[1], tuple(shape), str(dtype), base, nbytes, dynamic))
        return base

    def record(self, kind: str, width: int, address: int) -> None:
        frame = _user_frame()
        where = (frame.f_code.co_filename, frame.f_lineno)
        t = current()
        ordinal = t.counts.get(where, 0)
        t.counts[where] = ordinal + 1
        self.events.append((tuple(t.blockIdx), t.thread_id, where[0], where[1], ordinal, kind, width, address))


_THIS_FILE = os.path.normcase(os.path.abspath(__file__))
_internal_dirs: list[str] = []  # the simulator's package directory, filled on first launch


def _is_internal(filename: str) -> bool:
    path = os.path.normcase(os.path.abspath(filename))
    return path == _THIS_FILE or any(path.startswith(d) for d in _internal_dirs)


def _user_frame():
    """The first frame outside this module and the simulator: the kernel line that touched shared memory."""
    frame = sys._getframe(1)
    while frame.f_back is not None and _is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


class _SharedArray:
    """A shared array (or a view into one) that records each element access; otherwise behaves like the NumPy array."""

    __slots__ = ("_data", "_base", "_recorder")

    def __init__(self, data: np.ndarray, base_address: int, recorder: Recorder):
        self._data = data
        self._base = base_address
        self._recorder = recorder

    shape = property(lambda self: self._data.shape)
    ndim = property(lambda self: self._data.ndim)
    size = property(lambda self: self._data.size)
    dtype = property(lambda self: self._data.dtype)
    itemsize = property(lambda self: self._data.itemsize)
    strides = property(lambda self: self._data.strides)

    def __len__(self):
        return len(self._data)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._data, dtype=dtype)

    def __repr__(self):
        return f"<recorded shared array {self._data.dtype}{list(self._data.shape)} at byte {self._base}>"

    def _element_address(self, index) -> int | None:
        """Byte address of the element `index` selects, or None if it selects a sub-array."""
        idx = index if isinstance(index, tuple) else (index,)
        if len(idx) != self._data.ndim or not all(isinstance(i, (int, np.integer)) for i in idx):
            return None
        offset = 0
        for i, n, stride in zip(idx, self._data.shape, self._data.strides):
            i = int(i)
            offset += (i + n if i < 0 else i) * stride
        return self._base + offset

    def _view(self, sub: np.ndarray) -> "_SharedArray":
        delta = sub.__array_interface__["data"][0] - self._data.__array_interface__["data"][0]
        return _SharedArray(sub, self._base + delta, self._recorder)

    def __getitem__(self, index):
        value = self._data[index]
        if isinstance(value, np.ndarray):  # tile[row] of a 2-D tile: address arithmetic only, no access yet
            return self._view(value)
        address = self._element_address(index)
        if address is not None:
            self._recorder.record("load", self._data.itemsize, address)
        return value

    def __setitem__(self, index, value):
        self._data[index] = value
        address = self._element_address(index)
        if address is not None:
            self._recorder.record("store", self._data.itemsize, address)
        else:  # a slice store: one store per element, in order
            sub = self._view(self._data[index])
            for i in np.ndindex(*sub.shape):
                self._recorder.record("store", sub.itemsize, sub._element_address(i))


class _RecordingShared:
    """Stands in for the simulator's `cuda.shared`: same keying by source line, recording arrays."""

    def __init__(self, recorder: Recorder, dynshared_bytes: int):
        self._recorder = recorder
        self._allocations: dict[tuple[str, int], _SharedArray] = {}
        self._dynamic = np.zeros(dynshared_bytes, dtype=np.byte)
        self._dynamic_base = None
        self._lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        from numba.cuda import types
        from numba.cuda.np import numpy_support

        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        dtype = np.dtype(dtype)
        frame = _user_frame()
        where = (frame.f_code.co_filename, frame.f_lineno)
        with self._lock:
            if shape == 0:  # dynamic shared memory: every such array aliases the launch's one buffer
                if self._dynamic_base is None:
                    self._dynamic_base = self._recorder.allocate(self._dynamic.nbytes, where, (0,), dtype, True)
                count = self._dynamic.nbytes // dtype.itemsize
                return _SharedArray(
                    np.frombuffer(self._dynamic.data, dtype=dtype, count=count), self._dynamic_base, self._recorder
                )
            found = self._allocations.get(where)  # the simulator's rule: one array per source line
            if found is None:
                data = np.empty(shape, dtype)
                base = self._recorder.allocate(data.nbytes, where, data.shape, dtype, False)
                found = self._allocations[where] = _SharedArray(data, base, self._recorder)
            return found


class _RecordingAtomic:
    """Stands in for `cuda.atomic`: an atomic on a recorded shared array is one recorded access, not three."""

    def __init__(self, recorder: Recorder, real):
        self._recorder = recorder
        self._real = real

    def __getattr__(self, name):
        op = getattr(self._real, name)

        def atomic(array, *rest):
            if not isinstance(array, _SharedArray):
                return op(array, *rest)
            index = (0,) * array.ndim if name == "compare_and_swap" else rest[0]
            address = array._element_address(index)
            if address is not None:
                self._recorder.record("atomic", array.itemsize, address)
            return op(array._data, *rest)

        return atomic


def install_recorder(module, recorder: Recorder) -> None:
    """Make a launch's fake `cuda` module hand out recording shared arrays and record shared atomics once each."""
    module._shared = _RecordingShared(recorder, module._shared._dynshared_size)
    module._atomic = _RecordingAtomic(recorder, module._atomic)


def _dim3(value, what: str) -> tuple[int, int, int]:
    """(x, y, z) from an int or a 1- to 3-tuple."""
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) and d >= 1 for d in dims):
        raise ValueError(f"{what} must be a positive int or a tuple of 1 to 3 positive ints, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


# ---------------------------------------------------------------------------------------------------------------------
# Grouping and summarising


def _summarise(recorder: Recorder, py_func, grid, block, line_offset: int) -> SharedTrace:
    kernel_file = py_func.__code__.co_filename

    def shown(filename: str, line: int) -> int:
        return line + line_offset if filename == kernel_file else line

    groups: dict[tuple, list[int | None]] = {}
    for block_idx, thread, filename, line, ordinal, kind, width, address in recorder.events:
        warp, lane = divmod(thread, WARP_SIZE)
        key = (filename, line, kind, width, block_idx, warp, ordinal)
        lanes = groups.get(key)
        if lanes is None:
            lanes = groups[key] = [None] * WARP_SIZE
        lanes[lane] = address

    accesses: list[TracedAccess] = []
    unmodelled = 0
    def order(item):  # the kernel's own file first, then by line, kind, block, warp, n
        filename, line, kind, width, block_idx, warp, ordinal = item[0]
        return (filename != kernel_file, filename, line, kind, block_idx, warp, ordinal)

    for (filename, line, kind, width, block_idx, warp, ordinal), lanes in sorted(groups.items(), key=order):
        model = _model(lanes, width)
        unmodelled += model is None
        accesses.append(TracedAccess(block_idx, warp, filename, shown(filename, line), ordinal, kind, width, model))

    by_line: dict[tuple, list[TracedAccess]] = defaultdict(list)
    for a in accesses:
        by_line[(a.filename, a.line, a.kind, a.element_bytes)].append(a)
    lines = []
    for (filename, line, kind, width), group in by_line.items():
        modelled = [a.access for a in group if a.access is not None]
        raw_line = line - line_offset if filename == kernel_file else line
        lines.append(
            LineSummary(
                filename=filename,
                line=line,
                source=linecache.getline(filename, raw_line).strip(),
                kind=kind,
                element_bytes=width,
                instructions=len(group),
                wavefronts=sum(m.wavefronts for m in modelled),
                ideal_wavefronts=sum(m.ideal_wavefronts for m in modelled),
                ways=max((m.ways for m in modelled), default=0),
                worst=max(modelled, key=lambda m: (m.wavefronts, m.ways), default=None),
            )
        )
    allocations = tuple(
        SharedAllocation(shown(f, line), shape, dtype, base, nbytes, dynamic)
        for f, line, shape, dtype, base, nbytes, dynamic in recorder.allocations
    )
    return SharedTrace(
        kernel_name=py_func.__name__,
        grid=grid,
        block=block,
        lines=tuple(lines),
        accesses=tuple(accesses),
        allocations=allocations,
        unmodelled=unmodelled,
    )


def _model(lanes: list[int | None], width: int) -> WarpAccess | None:
    """The bank model for one warp access; 1- and 2-byte elements count as their 4-byte word."""
    if width in ACCESS_BYTES:
        return analyze_access(lanes, width)
    if width in (1, 2):
        return analyze_access([None if a is None else a - a % 4 for a in lanes], 4)
    return None
