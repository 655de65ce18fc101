"""Defences against kernels that cheat `check`, `bench` and the grader, each named by a stable finding kind.

The threat model (docs/GRADING.md) lists the attacks; each defence here reports an `IntegrityFinding` whose `kind`
is one of ATTACKS. The defences are host-side wherever they can be (identities, threads, tensor metadata, the aten
ops a call dispatches), so that they are tested on the CPU; the GPU-only ones (persisting L2, library kernels seen
by the profiler) sit behind small functions that tests fake.
"""
from __future__ import annotations

import ctypes
import math
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

# The attacks, by finding kind: what each means in one line (the threat model in docs/GRADING.md says more).
ATTACKS: dict[str, str] = {
    "stale_output": "the output holds memory the candidate never wrote: a recycled answer or the free-memory fill",
    "input_mutated": "the candidate changed an input it was not asked to write",
    "other_stream": "GPU work ran outside the timed stream (a side stream): the timing missed it",
    "background_thread": "the candidate left a thread running after it returned",
    "fake_output": "an output is not a plain dense tensor: a subclass, a view of an input, an expanded tensor",
    "cached_result": "the candidate returned an answer for earlier inputs: results cached or replayed",
    "timer_patched": "the candidate replaced a timing function (CUDA events, time, the statistics)",
    "harness_patched": "the candidate replaced a function the check compares with (its own, or torch's operators)",
    "l2_persistence": "the candidate set up persisting L2 (an access-policy window or a persisting-L2 limit)",
    "fits_test_data": "right on one input distribution, wrong on another: an answer fitted to the test data",
    "low_precision": "an error far above the reference's own in the declared precision: computed in a lower one",
    "library_call": "the candidate called a library op the task does the work of (e.g. aten::mm for a matmul)",
    "nondeterministic": "two runs on the same inputs disagree: uninitialised memory or a race",
    "impossible_speed": "faster than the roofline allows for the task's bytes and FLOPs: not ranked",
}


@dataclass(frozen=True)
class IntegrityFinding:
    """One defence that tripped: a stable `kind` (a key of ATTACKS) and what it saw."""

    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"

    def to_json(self) -> dict:
        return {"kind": self.kind, "message": self.message}


# --- patched timing -----------------------------------------------------------------------------------------------

def _timing_targets() -> list[tuple[Any, str]]:
    """(owner, attribute) of every function a timing or its statistics goes through (bench adds its own)."""
    targets: list[tuple[Any, str]] = [
        (time, "perf_counter"), (time, "perf_counter_ns"), (time, "time"), (time, "monotonic"), (time, "sleep"),
        (statistics, "median"), (statistics, "mean"), (np, "median"), (np, "quantile"), (np, "mean"),
        (np, "asarray"),
    ]
    try:
        import torch

        targets += [(torch.cuda, "Event"), (torch.cuda, "synchronize"), (torch.cuda, "_sleep"),
                    (torch.cuda, "current_stream"), (torch.cuda, "graph"), (torch.cuda, "CUDAGraph")]
        event = torch.cuda.Event
        targets += [(event, name) for name in ("record", "elapsed_time", "synchronize", "query")]
    except ImportError:                                   # pragma: no cover - torch is a dependency of check/bench
        pass
    return targets


def check_targets(check_module) -> list[tuple[Any, str]]:
    """(owner, attribute) of what `check` compares with: its own functions (in `check_module`) and the torch
    operators they use."""
    import torch

    targets: list[tuple[Any, str]] = [(check_module, n) for n in (
        "_compare", "mismatch_count", "_mutations", "_aliased", "as_outputs", "_clone", "_poison_", "fill_free_memory",
        "_identical", "CheckReport") if hasattr(check_module, n)]
    targets += [(sys.modules[__name__], n) for n in ("output_problems", "redraw", "low_precision_finding",
                                                     "library_finding", "OpRecorder", "ThreadWatch")]
    targets += [(torch, n) for n in ("where", "isfinite", "isnan", "equal", "topk", "nonzero")]
    targets += [(torch.Tensor, n) for n in ("__sub__", "__le__", "__eq__", "__ne__", "__or__", "__and__",
                                            "__invert__", "abs", "sum", "max", "to", "clone", "detach", "copy_",
                                            "fill_", "any", "all", "item", "pow", "mean", "sqrt")]
    return targets


_MISSING = object()


def _own(owner, name):
    """The attribute as the owner itself holds it: a class's own __dict__ entry (inherited ones are _MISSING, so
    that a patch on the class is seen), a module's attribute."""
    if isinstance(owner, type):
        return vars(owner).get(name, _MISSING)
    return getattr(owner, name, _MISSING)


class TimingGuard:
    """Identities of the timing functions, taken before the candidate runs; `changed()` names those replaced since,
    and `restore()` puts the originals back (so a patch never outlives the bench that found it)."""

    def __init__(self, extra: Iterable[tuple[Any, str]] = ()):
        self.saved = [(owner, name, _own(owner, name)) for owner, name in [*_timing_targets(), *extra]]

    def changed(self) -> list[str]:
        return [f"{getattr(owner, '__name__', type(owner).__name__)}.{name}" for owner, name, value in self.saved
                if _own(owner, name) is not value]

    def restore(self) -> None:
        for owner, name, value in self.saved:
            if _own(owner, name) is value:
                continue
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)

    def finding(self, when: str) -> IntegrityFinding | None:
        """A timer_patched finding (after restoring the originals) when anything was replaced."""
        changed = self.changed()
        if not changed:
            return None
        self.restore()
        return IntegrityFinding("timer_patched", f"{when}, {', '.join(changed)} had been replaced (the originals are "
                                                 f"back; the timing cannot be trusted)")


# --- background threads ------------------------------------------------------------------------------------------

class ThreadWatch:
    """The threads alive before a call; `new()` lists those started since and still alive."""

    def __init__(self):
        self.before = set(threading.enumerate())

    def new(self) -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t not in self.before and t.is_alive()]

    def finding(self, who: str, grace_s: float = 0.0) -> IntegrityFinding | None:
        if grace_s:
            deadline = time.perf_counter() + grace_s
            while self.new() and time.perf_counter() < deadline:
                time.sleep(0.001)
        alive = self.new()
        if not alive:
            return None
        names = ", ".join(t.name for t in alive[:3]) + (" ..." if len(alive) > 3 else "")
        return IntegrityFinding("background_thread", f"{who} returned with {len(alive)} thread"
                                                     f"{'s' if len(alive) != 1 else ''} of its own still running "
                                                     f"({names}): work there escapes the check and the timing")


# Modules whose threads are the environment's, not the candidate's: kernellab's simulator and worker, the notebook's,
# and the frameworks' own (torch.compile's compile pools, Triton's): a thread the candidate starts itself runs its own
# function or an executor's.
ENVIRONMENT_MODULES = ("kernellab.", "IPython.", "ipykernel.", "zmq.", "jupyter_client.", "tqdm.", "torch.", "triton.")


def environment_threads(threads) -> bool:
    """True when every thread runs a function of the environment (ENVIRONMENT_MODULES), none the candidate's."""
    def module(t):
        target = getattr(t, "_target", None) or getattr(type(t), "run", None)
        return getattr(target, "__module__", "") or ""

    return bool(threads) and all(module(t).startswith(ENVIRONMENT_MODULES) for t in threads)


# --- fake outputs --------------------------------------------------------------------------------------------------

def _non_overlapping_and_dense(t) -> bool:
    """Every element at its own address and no gaps: some permutation of the dims is contiguous."""
    dims = [(s, st) for s, st in zip(t.shape, t.stride()) if s != 1]
    expected = 1
    for size, stride in sorted(dims, key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def output_problems(outputs, args, written: Iterable[int] = ()) -> list[str]:
    """Why each output is not a plain dense tensor of its own memory (empty: all are): a tensor subclass, a meta or
    fake tensor, a zero-stride (expanded) or overlapping layout, or memory shared with an input the candidate was not
    asked to write (`written`: indices of the output arguments)."""
    import torch

    problems = []
    written = set(written)
    input_storages = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and type(a) is torch.Tensor and a.numel() > 0 and i not in written \
                and a.device.type != "meta":
            input_storages[a.untyped_storage().data_ptr()] = i
    for j, o in enumerate(outputs):
        if not isinstance(o, torch.Tensor):
            continue
        if type(o) is not torch.Tensor:
            problems.append(f"output {j} is a {type(o).__module__}.{type(o).__name__}, a tensor subclass (its "
                            f"operators may say anything): return a plain torch.Tensor")
            continue
        if o.device.type == "meta" or o.is_sparse:
            problems.append(f"output {j} is a {o.device.type if o.device.type == 'meta' else 'sparse'} tensor, "
                            f"not values in memory")
            continue
        if o.numel() <= 1:
            continue
        if any(st == 0 and s > 1 for s, st in zip(o.shape, o.stride())):
            problems.append(f"output {j} is an expanded tensor (stride {tuple(o.stride())} for shape "
                            f"{tuple(o.shape)}): one value stands for many elements")
            continue
        if not _non_overlapping_and_dense(o):
            problems.append(f"output {j} has overlapping or gapped strides {tuple(o.stride())} for shape "
                            f"{tuple(o.shape)}: not a dense tensor")
            continue
        src = input_storages.get(o.untyped_storage().data_ptr())
        if src is not None:
            problems.append(f"output {j} shares its memory with argument {src}, an input: a view of the input, "
                            f"not a result of its own")
    return problems


# --- library calls -----------------------------------------------------------------------------------------------

# aten ops that only make, copy, move or look at memory: never the work a task asks for.
PLUMBING_OPS = frozenset("""
empty empty_like empty_strided zeros zeros_like ones ones_like full full_like new_empty new_empty_strided new_zeros
new_ones new_full fill_ zero_ copy_ clone contiguous _to_copy to detach detach_ alias view view_as reshape
_reshape_alias _unsafe_view as_strided t transpose permute expand expand_as squeeze unsqueeze flatten unflatten
select slice narrow split chunk unbind resize_ set_ lift_fresh _local_scalar_dense item is_nonzero size stride
numel dim arange resolve_conj resolve_neg _conj _neg_view record_stream
""".split())


def op_base(name: str) -> str:
    """"aten::mm.default" or "aten.mm.default" -> "mm"."""
    name = name.replace("aten::", "").replace("aten.", "")
    return name.split(".")[0]


class OpRecorder:
    """A TorchDispatchMode that records the aten ops a call dispatches (and, on CUDA, the streams they run on)."""

    def __init__(self):
        self.ops: list[str] = []
        self.streams: set[int] = set()

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                recorder.ops.append(op_base(str(func)))
                if any(getattr(a, "is_cuda", False) for a in args if hasattr(a, "is_cuda")):
                    import torch

                    recorder.streams.add(torch.cuda.current_stream().cuda_stream)
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        return False

    def compute_ops(self) -> set[str]:
        return {op for op in self.ops if op not in PLUMBING_OPS}


def library_finding(candidate_ops: set[str], reference_ops: set[str], allowed: Iterable[str] | None,
                    forbidden: Iterable[str] = ()) -> IntegrityFinding | None:
    """library_call when the candidate dispatched an op the reference does its work with (or one `forbidden`
    names), unless `allowed` lists it."""
    allowed_set = {op_base(a) for a in (allowed or ())}
    banned = (set(reference_ops) | {op_base(f) for f in forbidden}) - PLUMBING_OPS - allowed_set
    used = sorted(candidate_ops & banned)
    if not used:
        return None
    return IntegrityFinding("library_call", f"the candidate called {', '.join('aten::' + u for u in used)}, the "
                                            f"library op{'s' if len(used) != 1 else ''} the task asks you to write "
                                            f"(allow it with allowed_ops=...)")


LIBRARY_KERNEL_WORDS = ("gemm", "cublas", "cutlass", "xmma", "cudnn", "flash_fwd", "flash_bwd", "fmha", "sm90_",
                        "sm80_", "ampere_", "hopper_", "magma", "cusparse", "cufft")


def library_kernels(kernel_names: Iterable[str]) -> list[str]:
    """The kernels among `kernel_names` (as the profiler names them) that come from a vendor library."""
    return sorted({n for n in kernel_names if any(w in n.lower() for w in LIBRARY_KERNEL_WORDS)})


def profiled_kernels(call: Callable[[], Any]) -> list[str]:
    """Names of the CUDA kernels that one call of `call` launches, from torch.profiler (GPU only)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = []
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA"):
            names.append(e.name)
        names += [getattr(k, "name", "") for k in getattr(e, "kernels", ()) or ()]
    return list(dict.fromkeys(n for n in names if n))


# --- input distributions -------------------------------------------------------------------------------------------

DISTRIBUTIONS = ("given", "uniform", "heavy_tailed", "offset")


def redraw(args, distribution: str, seed: int, skip: Iterable[int] = ()):
    """The floating tensor arguments (not in `skip`) replaced by draws of the same shape, dtype and device from
    `distribution`: "given" keeps them; "uniform" in [-1, 1); "heavy_tailed" a Student-t with 2 degrees of freedom
    (some elements in the hundreds); "offset" the given values plus 64 (a large mean, small spread)."""
    import torch

    if distribution == "given":
        return args
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {', '.join(DISTRIBUTIONS)}")
    gen = torch.Generator().manual_seed(seed)
    skip = set(skip)

    def one(i, v):
        if i in skip or not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.numel() == 0:
            return v
        shape = tuple(v.shape)
        if distribution == "uniform":
            x = torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1
        elif distribution == "heavy_tailed":
            z = torch.randn(shape, generator=gen, dtype=torch.float64)
            chi2 = torch.randn((2, *shape), generator=gen, dtype=torch.float64).pow(2).sum(0)
            x = z / (chi2 / 2).sqrt().clamp_min(1e-3)
        else:
            x = v.detach().to(device="cpu", dtype=torch.float64) + 64.0
        limit = float(torch.finfo(v.dtype).max) / 4
        return x.clamp(-limit, limit).to(dtype=v.dtype, device=v.device)

    return tuple(one(i, v) for i, v in enumerate(args))


# --- lower precision -----------------------------------------------------------------------------------------------

LOW_PRECISION_FACTOR = 256.0   # fp16/bf16/TF32 rounding is >= 8192 x fp32's; a different summation order < ~100 x


def low_precision_finding(candidate_error: float, reference_own_error: float | None, ref_rms: float,
                          precision: str, dtype: str) -> IntegrityFinding | None:
    """low_precision when a float32 (or float64) output's largest error is far above what its declared precision
    makes: LOW_PRECISION_FACTOR x the larger of the reference's own largest error in that dtype and one unit
    roundoff of the reference's RMS."""
    if precision not in ("float32", "float64") or dtype not in ("float32", "float64", "complex64", "complex128"):
        return None
    u = 2.0 ** -24 if precision == "float32" else 2.0 ** -53
    floor = max(reference_own_error or 0.0, u * ref_rms)
    if not floor or not math.isfinite(candidate_error) or candidate_error <= LOW_PRECISION_FACTOR * floor:
        return None
    return IntegrityFinding("low_precision", f"the {dtype} output's error {candidate_error:.3g} is "
                                             f"{candidate_error / floor:,.0f} x the reference's own in {precision} "
                                             f"({floor:.3g}): it looks computed in a lower precision (fp16, bf16 or "
                                             f"TF32); declare it with precision=...")


# --- persisting L2 (GPU) -------------------------------------------------------------------------------------------

CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1


class _AccessPolicyWindow(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class _StreamAttrValue(ctypes.Union):     # CUstreamAttrValue (CUlaunchAttributeValue: 64 bytes)
    _fields_ = [("accessPolicyWindow", _AccessPolicyWindow), ("pad", ctypes.c_char * 64)]


class L2Persistence:
    """The persisting-L2 state of the current context and a stream, read and reset through the driver (libcuda).
    Tests give it a fake `lib` with the same four functions."""

    def __init__(self, lib=None):
        if lib is None:
            try:
                lib = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
            except OSError:
                lib = None
        self.lib = lib
        if lib is not None and isinstance(lib, ctypes.CDLL):
            p = ctypes.c_void_p
            lib.cuCtxGetLimit.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
            lib.cuCtxSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
            lib.cuCtxResetPersistingL2Cache.argtypes = []
            lib.cuStreamGetAttribute.argtypes = [p, ctypes.c_int, ctypes.POINTER(_StreamAttrValue)]
            lib.cuStreamSetAttribute.argtypes = [p, ctypes.c_int, ctypes.POINTER(_StreamAttrValue)]
            for f in (lib.cuCtxGetLimit, lib.cuCtxSetLimit, lib.cuCtxResetPersistingL2Cache, lib.cuStreamGetAttribute,
                      lib.cuStreamSetAttribute):
                f.restype = ctypes.c_int

    def state(self, stream: int) -> tuple[int, int]:
        """(the context's persisting-L2 limit in bytes, the stream's access-policy window in bytes)."""
        if self.lib is None:
            return 0, 0
        limit = ctypes.c_size_t(0)
        if self.lib.cuCtxGetLimit(ctypes.byref(limit), CU_LIMIT_PERSISTING_L2_CACHE_SIZE) != 0:
            limit = ctypes.c_size_t(0)
        value = _StreamAttrValue()
        window = 0
        if self.lib.cuStreamGetAttribute(ctypes.c_void_p(stream), CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW,
                                         ctypes.byref(value)) == 0:
            window = int(value.accessPolicyWindow.num_bytes)
        return int(limit.value), window

    def reset(self, stream: int) -> None:
        """No persisting lines, no persisting-L2 carve-out, no access-policy window on `stream`."""
        if self.lib is None:
            return
        value = _StreamAttrValue()
        self.lib.cuStreamSetAttribute(ctypes.c_void_p(stream), CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW,
                                      ctypes.byref(value))
        self.lib.cuCtxResetPersistingL2Cache()
        self.lib.cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0)

    def finding(self, stream: int, who: str) -> IntegrityFinding | None:
        """l2_persistence (after a reset) when the limit or the window is set; None when neither is."""
        limit, window = self.state(stream)
        if not limit and not window:
            return None
        self.reset(stream)
        parts = []
        if limit:
            parts.append(f"a persisting-L2 limit of {limit:,} bytes")
        if window:
            parts.append(f"an access-policy window of {window:,} bytes on the timed stream")
        return IntegrityFinding("l2_persistence", f"{who} set up {' and '.join(parts)}, so that the L2 flush does not "
                                                  f"evict its data (reset before timing)")


# --- impossible speed ----------------------------------------------------------------------------------------------

IMPOSSIBLE_MARGIN = 0.8       # flagged below 80 % of the roofline's least time: measured ceilings carry ~5 % noise
FP8_FACTOR = 2.0              # the ceilings' highest roof is bf16/fp16; fp8 tensor cores run twice that


def roofline_floor_ms(flops: float | None, bytes_moved: float | None, ceilings, dram: bool = True) -> float | None:
    """The least time the roofline allows: the larger of flops at twice the device's highest compute roof (fp8) and
    bytes at its DRAM bandwidth (when `dram`: the data comes from DRAM, i.e. the L2 was flushed). None without either."""
    if ceilings is None:
        return None
    floors = []
    roofs = [v for _, v in ceilings.roofs()] if hasattr(ceilings, "roofs") else []
    if flops and roofs:
        floors.append(flops / (FP8_FACTOR * max(roofs) * 1e12) * 1e3)
    if bytes_moved and dram and getattr(ceilings, "dram_gbps", None):
        floors.append(bytes_moved / (ceilings.dram_gbps * 1e9) * 1e3)
    return max(floors) if floors else None


def impossible_speed_finding(median_ms: float, flops, bytes_moved, ceilings, dram: bool = True
                             ) -> IntegrityFinding | None:
    floor = roofline_floor_ms(flops, bytes_moved, ceilings, dram)
    if floor is None or median_ms >= IMPOSSIBLE_MARGIN * floor:
        return None
    return IntegrityFinding("impossible_speed", f"{median_ms * 1e3:.3g} us is {floor / max(median_ms, 1e-12):.1f} x "
                                                f"faster than the roofline allows ({floor * 1e3:.3g} us for its "
                                                f"declared FLOPs and bytes on {ceilings.device}, "
                                                f"{ceilings.source} ceilings): flagged, not ranked")
