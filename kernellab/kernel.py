"""`Module` and `Kernel`: what `compile_cuda` and the `%%cuda` magic hand back to the user."""
from __future__ import annotations

import hashlib
import dataclasses
import math
import re
import sys
import time
from dataclasses import dataclass, field

from . import report
from .analysis.arch import DEFAULT_ARCH, UnknownArchError, base_arch, compute_capability, get_arch, normalize_arch
from .analysis.occupancy import (best_block_sizes, max_threads_at_registers, occupancy, registers_per_warp,
                                 warps_per_sub_partition)
from .compile import cache as _cache, disasm
from .compile.cubin import read_cubin
from .run.sim.cuda import cpu as _cpu
from .compile.nvrtc import CompileOutput, compile_cached
from .compile.sass_lines import ptx_lines, sass_instructions
from .compile.sass_summary import split_functions, summarize
from .compile.signature import KernelSignature, defines_from_options, find_kernels, signature_for
from .compile.source_view import build_source_view
from .errors import ArgumentError, KernellabError, LaunchError
from .run.launch import cudriver, device as _device, worker as _worker
from .run.launch.job import KernelImage, KernelJob
from .run.launch.launch import (allow_dynamic_shared, allow_large_clusters, cluster_blocks, launch_dims, LaunchPath,
                                make_config, marshal_args, pdl_flag, PORTABLE_CLUSTER_BLOCKS)
from .run.measure.autotune import autotune as _autotune
from .run.nvtools import ncu, ncu_source, sanitize as _sanitize

@dataclass(frozen=True)
class Resources:
    """What one compiled kernel costs, as the compiler reports it."""

    registers: int              # per thread
    shared_bytes: int           # static shared memory per block (ptxas's figure: no 1 KiB system reservation)
    local_bytes: int            # per-thread stack frame in local memory
    spill_store_bytes: int
    spill_load_bytes: int
    max_threads_per_block: int  # the most threads a block may have (launch bounds, registers, arch)
    arch: str
    constant_bytes: int = 0     # cmem[0]: parameters and driver constants
    barriers: int = 0           # named barriers used
    launch_bounds_threads: int | None = None  # threads per block that __launch_bounds__ allows (None: not given)
    cluster_dims: tuple[int, int, int] | None = None   # __cluster_dims__: blocks per cluster fixed at compile time
    ptxas_report: bool = True   # False: no ptxas report for this kernel (registers and shared memory from the cubin;
                                # stack frame and spills unknown, shown as 0)

    @property
    def spills(self) -> bool:
        return bool(self.spill_store_bytes or self.spill_load_bytes)

    def __str__(self) -> str:
        spill = (f", spills {self.spill_store_bytes} B stored / {self.spill_load_bytes} B loaded" if self.spills
                 else ", no spills" if self.ptxas_report else
                 ", stack and spills unknown (no ptxas report: registers and smem from the cubin)")
        cluster = (f", clusters of {'x'.join(map(str, self.cluster_dims))} blocks" if self.cluster_dims else "")
        return (f"{self.registers} registers, {self.shared_bytes} B static smem, {self.local_bytes} B local"
                f"{spill}, max {self.max_threads_per_block} threads/block{cluster} ({self.arch})")


SYSTEM_SHARED_BYTES = 1024   # shared memory the system reserves per block on sm_80+, counted in .nv.shared.<fn>


def _register_arch(arch):
    """The table whose register rule applies to `arch`: its own, or the default arch's for one without a table
    (every arch kernellab knows shares the rule: 64K registers in 4 sub-partitions, 256 a warp)."""
    try:
        return get_arch(arch)
    except (UnknownArchError, ValueError):
        return get_arch(DEFAULT_ARCH)


def max_threads_for(registers: int, launch_bounds: tuple[int, int, int] | None, arch=DEFAULT_ARCH) -> int:
    """The largest block the driver accepts (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK): launch bounds, the arch's
    threads per block, and what one SM sub-partition's quarter of the register file holds, in whole warps
    (kernellab.analysis.occupancy.max_threads_at_registers)."""
    bounds = math.prod(launch_bounds) if launch_bounds else None
    return max_threads_at_registers(registers, _register_arch(arch), launch_bounds_threads=bounds)


class Kernel:
    """One `__global__` function, compiled: inspect it (resources, ptx, sass, occupancy) and launch it with k[grid, block](...)."""

    backend = "cuda"
    launch_blocking: bool | None = None    # see __init__
    _path = None                           # run.launch.LaunchPath, made at the first launch in this process

    def __init__(self, module: "Module", signature: KernelSignature, resources: Resources):
        self.module = module
        self.signature = signature
        self.resources = resources
        self._functions: dict[int, object] = {}
        self._sass: str | None = None
        self._instructions = None
        self._source_view = None
        self._launchers: dict = {}         # k[grid, block] objects, per configuration
        self.isolate: bool | None = None   # None: follow the notebook-wide setting (kernellab.set_isolation)
        # Whether this kernel's launches wait for it: None follows kernellab.set_launch_blocking (by default a
        # top-level launch waits, one inside an op or kernellab.bench does not); a call's sync= comes first.
        self.launch_blocking: bool | None = None
        self.simulate = False              # True: launches run on the CPU (kernellab.run.sim.cuda), checked

    # -- identity -------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.signature.name

    @property
    def symbol(self) -> str:
        return self.signature.symbol

    @property
    def params(self):
        return self.signature.params

    @property
    def arch(self) -> str:
        return self.resources.arch

    def __repr__(self) -> str:
        return f"<kernellab.Kernel {self.signature} [{self.arch}]: {self.resources.registers} regs>"

    # -- inspection -----------------------------------------------------------------------------------------
    @property
    def ptx(self) -> str:
        """This kernel's PTX (its `.entry`, with the module's directives)."""
        return _ptx_entry(self.module.ptx, self.symbol)

    @property
    def sass(self) -> str:
        """This kernel's SASS (disassembled with cuobjdump from the CUDA wheels; no GPU needed)."""
        if self._sass is None:
            self._sass = self.module._sass_of(self.symbol)
        return self._sass

    @property
    def instruction_summary(self):
        """Static counts of this kernel's SASS instructions by kind (tensor cores, TMA, async copies, loads and stores
        by width, FFMA, MUFU, barriers, local memory): which path the compiler took. See compile/sass_summary.py."""
        sass = self.sass
        cached = getattr(self, "_instructions", None)     # (the SASS it was made from, the summary)
        if cached is None or cached[0] is not sass:
            cached = self._instructions = (sass, summarize(sass))
        return cached[1]

    def source_view(self):
        """Each line of the kernel's source beside the SASS (and PTX) compiled from it, with per-line counts of
        global, shared and local loads and stores, FFMA, HMMA/HGMMA, barriers and branches (a SourceView; in a
        notebook, two columns in the cell's line numbering). From the cubin's line information; no GPU needed."""
        if self._source_view is None:
            source, first_line, filename, cubin, module_ptx = self._view_inputs()
            instructions = sass_instructions(cubin, self.symbol, filename)
            self._source_view = build_source_view(
                kernel=self.signature.display, arch=self.arch, source=source, first_line=first_line,
                filename=filename, instructions=instructions, ptx=ptx_lines(module_ptx, self.ptx, filename))
        return self._source_view

    def _view_inputs(self) -> tuple[str, int, str, bytes, str]:
        """(source, its first line's number, filename, cubin, the module's PTX) for source_view."""
        m = self.module
        return m.source or "", m.first_line, m.filename, m.cubin, m.ptx

    def profile_lines(self, grid, block, *args, shared_bytes: int = 0, strict: bool = False, **kw):
        """source_view() with what Nsight Compute measured per line over this launch: instructions executed, warp
        stall samples and their reasons, global memory traffic, shared wavefronts and bank conflicts.

        The launch runs in a new process under ncu (the arguments are copied; yours are not modified). Where ncu
        cannot read the counters the view says why (`profile_note`); strict=True raises instead."""
        view = self.source_view()
        ncu_path = kw.pop("ncu", None) or ncu_source.find_ncu()
        if ncu_path is None:                      # said in the view, GPU or not
            return ncu_source.without_ncu(view, strict)
        job = self._tool_job(grid, block, args, shared_bytes, None, "profiling {} with Nsight Compute")
        return ncu_source.profile_lines(job, view, strict=strict, ncu=ncu_path, **kw)

    def max_active_clusters(self, block, cluster, shared_bytes: int = 0) -> int:
        """How many clusters of shape `cluster` (blocks of `block` threads, `shared_bytes` dynamic shared memory
        each) the current GPU holds at once, from the driver (cuOccupancyMaxActiveClusters): the grid of a
        persistent cluster kernel. Clusters live inside one GPC, so this can be fewer than SMs / blocks per cluster."""
        c = launch_dims(cluster, "cluster")                        # one cluster is the grid asked about
        path = self._path or self._launch_path(c, block, shared_bytes, (), c)
        cfg = path.config(c, block, shared_bytes, c)        # the opt-ins (shared memory, large clusters) happen here
        with cudriver.context_on(path.device.index):
            return cudriver.max_active_clusters(path.function_handle, cfg.grid, cfg.block, cfg.shared_bytes, cfg.cluster)

    def occupancy(self, block, shared_bytes: int = 0, arch: str | None = None):
        """Theoretical occupancy of this kernel at `block` threads and `shared_bytes` dynamic smem per block.

        Raises ArgumentError for a block above the kernel's max_threads_per_block: it could not launch.
        """
        threads = block if isinstance(block, int) else int(math.prod(block))
        res = self.resources
        if threads > res.max_threads_per_block:
            raise ArgumentError(f"{self.name} cannot launch a block of {threads} threads: its max_threads_per_block "
                                f"is {res.max_threads_per_block} ({_limit_reason(res)}); ask for the occupancy of a "
                                f"block of at most {res.max_threads_per_block} threads")
        return occupancy(threads, res.registers, res.shared_bytes + shared_bytes, arch or base_arch(self.arch))

    def best_block_sizes(self, shared_bytes: int = 0, top: int = 3):
        """Block sizes (multiples of 32, at most max_threads_per_block) that give this kernel the highest occupancy."""
        return best_block_sizes(self.resources.registers, self.resources.shared_bytes + shared_bytes,
                                base_arch(self.arch), top=top, max_threads=self.resources.max_threads_per_block)

    def card_block_size(self) -> tuple[int, str]:
        """(threads, why): the block size the card shows occupancy at: the launch bounds where the kernel gives
        them, else its best block size."""
        res = self.resources
        if res.launch_bounds_threads:
            return min(res.launch_bounds_threads, res.max_threads_per_block), "launch bounds"
        best = self.best_block_sizes(top=1)
        if best:
            return best[0], "best block"
        return min(256, res.max_threads_per_block), "default"

    # -- launching ------------------------------------------------------------------------------------------
    def __getitem__(self, config) -> "_Launcher":
        try:
            return self._launchers[config]      # kept per configuration: a launch in a loop makes none
        except (KeyError, TypeError):
            pass
        if not isinstance(config, tuple) or len(config) not in (2, 3):
            raise ArgumentError(f"launch as {self.name}[grid, block](args...) or {self.name}[grid, block, "
                                f"shared_bytes](args...); got {self.name}[{config!r}]")
        launcher = _Launcher(self, *config)
        try:
            if len(self._launchers) >= 256:
                self._launchers.clear()
            self._launchers[config] = launcher
        except TypeError:                        # a list for grid or block
            pass
        return launcher

    def launch(self, grid, block, *args, shared_bytes: int = 0, stream=None, sync: bool | None = None,
               isolate: bool | None = None, timeout_s: float | None = None, cluster=None, pdl: bool = False):
        """Check the arguments against the signature and launch on the current GPU.

        cluster=(x, y, z) launches thread-block clusters of that shape (sm_90 on; the grid a whole number of them),
        through cuLaunchKernelEx.

        pdl=True is a programmatic dependent launch (sm_90 on; cuLaunchKernelEx with
        CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION): the kernel may start while the previous kernel on the
        stream still runs, so it must call griddepcontrol_wait() (kl/pdl.cuh) before it reads anything that kernel
        writes, or writes anything that kernel reads; the previous kernel may call griddepcontrol_launch_dependents()
        to let it start sooner. Read that kernel's output after the wait through a plain pointer, cp.async or
        load_after_wait(): a load through a `const __restrict__` pointer may be compiled to a read-only load issued
        before the wait. A kernel's first launch loads it (with CUDA's lazy loading that may synchronise the device)
        and builds its launch on the host, so that launch may not overlap. Below sm_90, on the CPU path (launches
        there run one after the other) and in a worker (isolate=True: the kernel runs alone) it is a plain launch,
        with the same result.

        sync=True waits for the kernel, so that a fault is reported here, at this launch, not at some later CUDA
        call; sync=False does not (a fault then surfaces at the next synchronising call, kernellab.synchronize() or
        a waiting launch, naming this launch and its line). None: the kernel's `launch_blocking`, else the global
        kernellab.set_launch_blocking(), else wait at the top level but not inside a registered op (kernellab.op) or
        kernellab.bench. Under CUDA graph capture it records the launch and never waits. isolate=True runs it in a worker process (see run_isolated); None follows the
        notebook-wide setting.
        """
        if self.simulate:
            pdl_flag(pdl)                       # checked; a serial CPU launch has no previous kernel still running
            _cpu.launch(self.image(), grid, block, args, shared_bytes=shared_bytes, cluster=cluster)
            return None
        if sync is None:
            sync = self.launch_blocking
        if isolate is None:
            isolate = self.isolate if self.isolate is not None else _isolation_default()
        if isolate:
            return self.run_isolated(grid, block, *args, shared_bytes=shared_bytes, timeout_s=timeout_s,
                                     cluster=cluster)
        path = self._path
        if path is None:
            path = self._launch_path(grid, block, shared_bytes, args, cluster)
        cfg = path.config(grid, block, shared_bytes, cluster, pdl)
        try:
            path.run(cfg, args, stream, sync)
        except LaunchError as exc:
            self._keep_job(exc, cfg, args)
            raise

    def _keep_job(self, exc: LaunchError, cfg, args) -> None:
        """After a sticky fault, keep the launch (shapes and scalars) on the error for sanitize_last()."""
        if exc.sticky and exc.job is None:
            try:
                exc.job = KernelJob.from_launch(self.image(), cfg.grid, cfg.block, args, cfg.shared_bytes,
                                                data="shapes", cluster=cfg.cluster)
            except Exception:
                pass

    def check_args(self, *args) -> None:
        """Check `args` against the signature as a launch would: their count, pointer or scalar, dtype, contiguity,
        vector alignment and scalar ranges. Needs no GPU: CPU (and meta) tensors and NumPy arrays stand in for GPU
        memory. Raises ArgumentError naming the argument."""
        marshal_args(self.params, tuple(args), None, str(self.signature), any_device=True)

    def _launch_path(self, grid, block, shared_bytes, args, cluster=None):
        """The first launch: with no GPU, check what can be checked and say why not; else load the kernel on the
        current GPU and keep its LaunchPath."""
        if not _device.has_gpu():
            make_config(grid, block, shared_bytes, max_threads_per_block=self.resources.max_threads_per_block,
                        static_shared_bytes=self.resources.shared_bytes, device=None, cluster=cluster)
            self.check_args(*args)              # the argument error, if any, comes before "no GPU"
        _device.require_gpu(f"launching {self.name}")
        dev = _device.device_info()
        self._check_arch(dev)
        fn = self._function(dev.index)
        self._path = LaunchPath(fn.ptr, self.params, dev, name=self.name, signature=str(self.signature),
                                max_threads_per_block=self.resources.max_threads_per_block,
                                static_shared_bytes=self.resources.shared_bytes,
                                opt_in=lambda nbytes: allow_dynamic_shared(fn, nbytes),
                                cluster_opt_in=lambda: allow_large_clusters(fn), registers=self.resources.registers)
        return self._path

    # -- the same launch in another process: a worker, compute-sanitizer, Nsight Compute ---------------------
    def job_fields(self) -> dict:
        """How a fresh process loads this kernel (KernelJob): the module's cubin, source and line numbering."""
        m = self.module
        return {"source": m.source or "", "options": tuple(m.options or ()), "first_line": m.first_line,
                "filename": m.filename, "image": m.cubin or None, "image_format": "cubin" if m.cubin else None,
                "abi": "c"}

    def check_launch_args(self, args, device) -> None:
        """The argument checks of a launch, for launches in another process."""
        marshal_args(self.params, tuple(args), device, str(self.signature))

    def image(self) -> KernelImage:
        """This kernel as a value: what a job needs of it, to check arguments and to load it in a fresh process."""
        resources = getattr(self, "resources", None)
        return KernelImage(symbol=self.symbol, name=self.name, signature=str(getattr(self, "signature", "")),
                           params=tuple(self.params), arch=self.arch, backend=getattr(self, "backend", "cuda"),
                           static_shared_bytes=getattr(resources, "shared_bytes", 0) if resources else 0,
                           registers=getattr(resources, "registers", 0) or 0 if resources else 0,
                           max_threads_per_block=getattr(resources, "max_threads_per_block", 1024) or 1024
                           if resources else 1024,
                           **self.job_fields())

    def check_launch(self, grid, block, args, shared_bytes: int = 0, cluster=None):
        """Check a launch on the current GPU as a launch here does (device, arch, configuration, every argument)
        and return (LaunchConfig, DeviceInfo): the checks before a launch in another process."""
        _device.require_gpu(f"launching {self.name}")
        dev = _device.device_info()
        self._check_arch(dev)
        cfg = make_config(grid, block, shared_bytes, max_threads_per_block=self.resources.max_threads_per_block,
                          static_shared_bytes=self.resources.shared_bytes, device=dev, cluster=cluster,
                          registers=self.resources.registers, name=self.name)
        self.check_launch_args(tuple(args), dev)
        return cfg, dev

    def job(self, grid, block, *args, shared_bytes: int = 0, cluster=None, data: str = "copy", **sharing):
        """This launch as one serialisable value, a KernelJob: what a worker, compute-sanitizer or Nsight Compute
        runs, checked as a launch here is. data='copy' carries the arguments' elements (yours are not modified),
        'shapes' their shapes and dtypes only; `sharing` takes KernelJob.from_launch's IPC and staging options."""
        cfg, dev = self.check_launch(grid, block, args, shared_bytes, cluster)
        _worker.sync_caller()                                  # the arguments' final values
        return KernelJob.from_launch(self.image(), cfg.grid, cfg.block, tuple(args), cfg.shared_bytes, data=data,
                                     device=dev.index, cluster=cfg.cluster, **sharing)

    def _tool_job(self, grid, block, args, shared_bytes, cluster, needs: str) -> KernelJob:
        """The job a tool runs in a new process; `needs` says what wants the GPU, e.g. "profiling {} with ncu"."""
        _device.require_gpu(needs.format(self.name))
        return self.job(grid, block, *args, shared_bytes=shared_bytes, cluster=cluster)

    def run_isolated(self, grid, block, *args, shared_bytes: int = 0, timeout_s: float | None = None, cluster=None,
                     diagnose: bool | None = None, pool=None):
        """Launch in a warm worker process, so a fault cannot poison this process; outputs are copied back."""
        args = tuple(args)
        cfg, dev = self.check_launch(grid, block, args, shared_bytes, cluster)
        return _worker.run_isolated(self.image(), cfg, dev, args, timeout_s=timeout_s, diagnose=diagnose, pool=pool)

    def sanitize(self, grid, block, *args, shared_bytes: int = 0, tool: str = "memcheck", cluster=None, **kw):
        """Run this launch under compute-sanitizer (memcheck, racecheck, synccheck, initcheck or all) in a new process;
        for a kernel on the CPU path (`simulate`), the same tools' checks on the CPU (kernellab.run.sim.cuda)."""
        if self.simulate:
            return _cpu.sanitize(self.image(), grid, block, args, shared_bytes=shared_bytes, tool=tool, cluster=cluster,
                                 **kw)
        return _sanitize.sanitize(self.job(grid, block, *args, shared_bytes=shared_bytes, cluster=cluster), tool, **kw)

    def profile(self, grid, block, *args, shared_bytes: int = 0, metrics=None, full: bool = False,
                section_set: str | None = None, cluster=None, **kw):
        """Run this launch under Nsight Compute (a small metric set, or full=True for `--set full`) in a new process."""
        job = self.job(grid, block, *args, shared_bytes=shared_bytes, cluster=cluster)
        rep = ncu.profile(job, metrics=metrics, section_set="full" if full and section_set is None else section_set,
                          **kw)
        return dataclasses.replace(rep, device=_device.device_info().name)

    def profile_banks(self, grid, block, *args, shared_bytes: int = 0, strict: bool = False, **kw):
        """Shared-memory instructions, wavefronts and bank conflicts per source line, measured by Nsight Compute.

        Where counters are not permitted, the report says so (strict=True raises instead); the bank model
        (kernellab.analysis.banks) and the simulator trace work everywhere.
        """
        job = self._tool_job(grid, block, args, shared_bytes, None, "profiling {} with Nsight Compute")
        return ncu_source.profile_banks(job, strict=strict, **kw)

    def _check_arch(self, dev) -> None:
        want = base_arch(self.arch)
        if want != dev.arch:
            raise ArgumentError(f"{self.name} was compiled for {self.arch} but the GPU is {dev.name} ({dev.arch}); "
                                f"recompile with arch='{dev.arch}' (or arch=None for the current GPU)")

    def _function(self, index: int):
        fn = self._functions.get(index)
        if fn is None:
            import cupy


            with cupy.cuda.Device(index):
                mod = self.module._loaded(index)
                fn = mod.get_function(self.symbol)
                if cluster_blocks(self.resources.cluster_dims) > PORTABLE_CLUSTER_BLOCKS:
                    allow_large_clusters(fn)     # __cluster_dims__ of 9-16 blocks: the driver wants the opt-in
            self._functions[index] = fn
        return fn

    # -- reports --------------------------------------------------------------------------------------------
    def to_json(self, block_size: int | None = None) -> dict:
        """The card's fields; "occupancy" is at `block_size`, or (None) at card_block_size(), with "block_source"
        saying which: "launch bounds", "best block", "default" or "requested"."""
        r = self.resources
        d = {"name": self.name, "display": self.signature.display, "symbol": self.symbol,
             "signature": str(self.signature), "registers": r.registers, "shared_bytes": r.shared_bytes,
             "local_bytes": r.local_bytes, "spill_store_bytes": r.spill_store_bytes,
             "spill_load_bytes": r.spill_load_bytes, "max_threads_per_block": r.max_threads_per_block,
             "launch_bounds_threads": r.launch_bounds_threads, "arch": r.arch}
        try:
            if block_size is None:
                threads, source = self.card_block_size()
            else:
                threads, source = min(block_size, r.max_threads_per_block), "requested"
            occ = self.occupancy(threads)
            d["occupancy"] = {"block_size": occ.block_size, "block_source": source, "ratio": occ.ratio,
                              "limiter": occ.limiter, "blocks_per_sm": occ.blocks_per_sm,
                              "warps_per_sm": occ.warps_per_sm}
            d["best_block_sizes"] = list(self.best_block_sizes())
        except (ImportError, KernellabError, ValueError):
            pass
        try:
            d["instructions"] = self.instruction_summary.to_json()
        except (KernellabError, OSError, ValueError):   # no cuobjdump: the card goes without
            pass
        return d


class _Launcher:
    """`kernel[grid, block]`: call it with the kernel's arguments."""

    __slots__ = ("kernel", "grid", "block", "shared_bytes", "_path", "_config", "_fast", "_config_pdl", "_fast_pdl")

    def __init__(self, kernel: Kernel, grid, block, shared_bytes: int = 0):
        self.kernel, self.grid, self.block, self.shared_bytes = kernel, grid, block, shared_bytes
        self._path = self._config = None        # the checked LaunchConfig, once launched in this process
        self._fast = None                       # LaunchPath.fast for the last launch's argument types
        self._config_pdl = self._fast_pdl = None    # the same for pdl=True launches

    def __call__(self, *args, shared_bytes: int | None = None, stream=None, sync: bool | None = None,
                 isolate: bool | None = None, timeout_s: float | None = None, cluster=None, pdl: bool = False):
        k = self.kernel
        path = k._path
        if sync is None:
            sync = k.launch_blocking
        # The common case, a launch in this process as configured: the generated launch for these argument types
        # (it returns False, having launched nothing, where run must decide), else straight to the launch path.
        # (The notebook-wide isolation setting is _isolation_default's test, inline: this is every launch's path.)
        # pdl=True keeps its own configuration and generated launch (cuLaunchKernelEx); another pdl value goes to
        # Kernel.launch, which checks it.
        if (path is self._path and shared_bytes is None and isolate is None and cluster is None and path is not None
                and (pdl is False or pdl is True)
                and k.isolate is None and not (_WORKER_SETTINGS[0] or _worker_settings()).isolate):
            if pdl:
                cfg, fast = self._config_pdl, self._fast_pdl
                if cfg is None:
                    cfg = self._config_pdl = path.config(self.grid, self.block, self.shared_bytes, None, True)
            else:
                cfg, fast = self._config, self._fast
            try:
                if fast and fast(args, stream, sync, 2):      # 2: the record's frame is this call's caller's
                    return None
                path.run(cfg, args, stream, sync)
            except LaunchError as exc:
                k._keep_job(exc, cfg, args)
                raise
            if fast is not False:               # False: this path has no generated launches (its driver's choice)
                fast = path.fast(cfg, tuple(map(type, args)))
                if pdl:
                    self._fast_pdl = fast
                else:
                    self._fast = fast
            return None
        extra = {"cluster": cluster} if cluster is not None else {}     # CUDA C++ kernels take clusters and PDL
        if pdl is not False:
            extra["pdl"] = pdl
        result = k.launch(self.grid, self.block, *args,
                          shared_bytes=self.shared_bytes if shared_bytes is None else shared_bytes,
                          stream=stream, sync=sync, isolate=isolate, timeout_s=timeout_s, **extra)
        if k._path is not None and shared_bytes is None and cluster is None and self._path is not k._path:
            path = self._path = k._path
            self._config = path.config(self.grid, self.block, self.shared_bytes)
            self._fast = None if pdl else path.fast(self._config, tuple(map(type, args)))
            self._config_pdl = self._fast_pdl = None
        return result


class KernelCollection:
    """Attribute access, iteration and len() over `self.kernels`, given `__getitem__` by name."""

    def __getattr__(self, name: str):
        if name.startswith("_") or name in ("kernels", "output"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(str(exc)) from None

    def __iter__(self):
        return iter(self.kernels)

    def __len__(self) -> int:
        return len(self.kernels)

    def __dir__(self):
        return list(super().__dir__()) + [k.name for k in self.kernels]


class Module(KernelCollection):
    """The kernels of one compiled source: `module['name']` or `module.name` gives a Kernel."""

    def __init__(self, output: CompileOutput, source: str, *, name: str | None, first_line: int, filename: str,
                 cache_state: str, wall_ms: float, notes=()):
        self.output = output
        self.source = source
        self.name = name
        self.first_line = first_line
        self.filename = filename
        self.cache_state = cache_state      # "miss", "memory" or "disk"
        self.wall_ms = wall_ms
        self.notes = tuple(notes)
        self._loaded_modules: dict[int, object] = {}
        self._sass_split: dict[str, str] | None = None
        facts = read_cubin(output.cubin)
        src_kernels = find_kernels("\n" * (first_line - 1) + source, defines_from_options(output.options))
        kernels = [Kernel(self, signature_for(sym, src_kernels), _resources(output, sym, facts.get(sym)))
                   for sym in (output.reports or facts)]
        # Source order (ptxas reports entries in no promised order); kernels not found in the source go last.
        self.kernels: tuple[Kernel, ...] = tuple(sorted(
            kernels, key=lambda k: (k.signature.line is None, k.signature.line or 0, k.symbol)))
        for k in self.kernels:
            for p in k.params:
                if p.tensor_map and k.signature.line is not None and not p.grid_constant:
                    self.notes += (f"{k.name}: parameter '{p.name}' is a CUtensorMap without __grid_constant__: "
                                   f"declare it `const __grid_constant__ CUtensorMap {p.name}`, or the kernel may "
                                   f"copy the map to local memory, where the tensor memory accelerator cannot read "
                                   f"it",)

    arch = property(lambda self: self.output.arch)
    options = property(lambda self: self.output.options)
    cubin = property(lambda self: self.output.cubin)
    ptx = property(lambda self: self.output.ptx)
    log = property(lambda self: self.output.log)
    compile_ms = property(lambda self: self.output.compile_ms)

    @property
    def cache_hit(self) -> bool:
        return self.cache_state != "miss"

    @property
    def warnings(self):
        return tuple(d for d in self.output.diagnostics if d.severity == "warning")

    def __getitem__(self, name: str) -> Kernel:
        index = self.__dict__.get("_index")
        if index is None:
            index = self._index = self._name_index()
        try:
            return index[name]                  # a launcher's lookup per call: one dict access
        except (KeyError, TypeError):
            pass
        return self._find(name)

    def _name_index(self) -> dict:
        """Every name `_find` resolves (symbols, display names, short names), with the kernel it gives."""
        index = {}
        for name in {n for k in self.kernels for n in (k.symbol, k.signature.display, k.name)}:
            try:
                index[name] = self._find(name)
            except KeyError:                    # a short name that several kernels share: _find's error each time
                pass
        return index

    def _find(self, name: str) -> Kernel:
        exact = [k for k in self.kernels if name in (k.symbol, k.signature.display)]
        if len(exact) == 1:
            return exact[0]
        short = [k for k in self.kernels if k.name == name]
        if len(short) == 1:
            return short[0]
        if len(short) > 1:
            raise KeyError(f"{name!r} names {len(short)} kernels ({', '.join(str(k.signature) for k in short)}); "
                           f"pick one by its display name or symbol")
        known = ", ".join(k.signature.display for k in self.kernels) or "none"
        raise KeyError(f"no kernel {name!r} in this module; its kernels: {known}")

    def _sass_of(self, symbol: str) -> str:
        """One kernel's SASS, out of one disassembly of the whole cubin (kept in the compile cache by its hash)."""
        if self._sass_split is None:
            key = _cache.make_key(kind="sass", cubin=hashlib.sha256(self.cubin).hexdigest())
            text, _ = _cache.get(key)
            if text is None:
                text = disasm.sass(self.cubin)
                _cache.put(key, text)
            parts = split_functions(text)
            head = text[:text.find("Function :")].lstrip("\n") if parts else ""
            self._sass_split = {sym: head + body for sym, body in parts.items()}
        found = self._sass_split.get(symbol)
        if found is None:                               # not in the dump as expected: ask for the one function
            return disasm.sass(self.cubin, symbol)
        return found

    def _loaded(self, index: int):
        mod = self._loaded_modules.get(index)
        if mod is None:
            import cupy

            mod = cupy.cuda.function.Module()
            mod.load(self.output.cubin)
            self._loaded_modules[index] = mod
        return mod

    # -- reports --------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"kind": "compile", "version": 1, "ok": True,
                "title": f"{self.name or 'cuda'}: {len(self.kernels)} kernel{'s' if len(self.kernels) != 1 else ''}",
                "arch": self.arch, "cache": "hit" if self.cache_hit else "miss", "cache_source": self.cache_state,
                "compile_ms": round(self.compile_ms, 2), "wall_ms": round(self.wall_ms, 2),
                "notes": list(self.notes), "kernels": [k.to_json() for k in self.kernels],
                "diagnostics": [{"line": d.line, "column": d.column, "severity": d.severity, "message": d.message}
                                for d in self.output.diagnostics]}

    def _timing(self) -> str:
        """'compiled in 27.1 ms (cache miss)', or for a hit its own time: 'cache hit (memory) in 0.2 ms'."""
        if self.cache_hit:
            return f"cache hit ({self.cache_state}) in {self.wall_ms:.1f} ms (compiled in {self.compile_ms:.0f} ms)"
        return f"compiled in {self.compile_ms:.1f} ms (cache miss)"

    def __str__(self) -> str:
        j = self.to_json()
        rows = []
        for k in j["kernels"]:
            occ = k.get("occupancy")
            rows.append([k["display"], k["registers"], k["shared_bytes"], k["local_bytes"],
                         f"{k['spill_store_bytes']}/{k['spill_load_bytes']}",
                         occupancy_text(occ) if occ else "-"])
        head = f"{j['title']} | {self.arch} | {self._timing()}"
        parts = [head, report.text_table(["kernel", "regs", "smem B", "local B", "spill st/ld B", "occupancy"], rows)]
        parts += [f"SASS {k['display']}: {k['instructions']['headline']}" for k in j["kernels"]
                  if k.get("instructions", {}).get("headline")]
        parts += [f"warning: line {d.line}: {d.message}" for d in self.warnings]
        parts += [f"note: {n}" for n in self.notes]
        return "\n".join(parts)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        j = self.to_json()
        rows = []
        for k in j["kernels"]:
            occ = k.get("occupancy")
            spill = f"{k['spill_store_bytes']}/{k['spill_load_bytes']}"
            spill_cell = report.Raw(f"<span style='color:#c00;font-weight:bold'>{spill}</span>", spill) \
                if k["spill_store_bytes"] or k["spill_load_bytes"] else spill
            rows.append([report.Raw(f"<b>{report.esc(k['display'])}</b>", k["display"]), k["registers"],
                         k["shared_bytes"], k["local_bytes"], spill_cell,
                         occupancy_text(occ) if occ else "-",
                         ", ".join(map(str, k.get("best_block_sizes", []))) or "-"])
        cap = f"{j['title']} · {self.arch} · {self._timing()}"
        out = [report.html_table(["kernel", "regs", "smem B", "local B", "spill st/ld B", "occupancy", "best blocks"],
                                 rows, caption=cap)]
        for k in j["kernels"]:
            headline = k.get("instructions", {}).get("headline")
            if headline:
                out.append(f"<div style='font-size:90%'>SASS of <b>{report.esc(k['display'])}</b> (static counts): "
                           f"{report.esc(headline)}</div>")
        for d in self.warnings:
            out.append(f"<div style='color:#a60'>warning, line {d.line}: {report.esc(d.message)}</div>")
        for n in self.notes:
            out.append(f"<div style='color:#666'>note: {report.esc(n)}</div>")
        return "".join(out)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return report.mimebundle(self, include, exclude)


_WORKER_MODULE = "kernellab.run.launch.worker"
# The worker's settings object (worker.settings, which set_isolation changes in place; never replace it, reset it in
# place: a replaced object leaves launches reading the old one) once the worker is imported:
# a launch reads its `isolate` from here, not through sys.modules and the module (on a cold CPU cache those lookups
# cost about 4 µs of a launch's 30 on the CPU: benchmarks/launch_overhead.py --cold).
_WORKER_SETTINGS: list = [None]
_NOT_ISOLATING = dataclasses.make_dataclass("_NotIsolating", [("isolate", bool, False)], frozen=True)()


def _worker_settings():
    """worker.settings where the worker is imported (kept in _WORKER_SETTINGS), else a stand-in saying isolate=False
    (the worker is not imported for this)."""
    worker = sys.modules.get(_WORKER_MODULE)
    if worker is None:
        return _NOT_ISOLATING
    _WORKER_SETTINGS[0] = settings = worker.settings
    return settings


def _isolation_default() -> bool:
    """The notebook-wide isolation setting (kernellab.set_isolation), read without importing the worker until set."""
    return bool((_WORKER_SETTINGS[0] or _worker_settings()).isolate)


def _limit_reason(res: Resources) -> str:
    """What sets a kernel's max_threads_per_block, in words."""
    if res.launch_bounds_threads and res.max_threads_per_block == res.launch_bounds_threads:
        return f"__launch_bounds__({res.launch_bounds_threads})"
    if res.max_threads_per_block < 1024 and res.registers:
        spec = _register_arch(res.arch)
        per_warp, hold = registers_per_warp(res.registers, spec), warps_per_sub_partition(res.registers, spec)
        return (f"{res.registers} registers a thread are {per_warp} a warp; one of the SM's "
                f"{spec.register_sub_partitions} sub-partitions holds {hold} such warps, so "
                f"{res.max_threads_per_block} threads at most")
    return "the architecture's limit"


def occupancy_text(occ: dict) -> str:
    """A card's occupancy cell: '50% @ 64 (warps; launch bounds)'."""
    source = occ.get("block_source")
    return f"{occ['ratio']:.0%} @ {occ['block_size']} ({occ['limiter']}{'; ' + source if source else ''})"


def _resources(output: CompileOutput, symbol: str, facts) -> Resources:
    """A kernel's resources from ptxas's report; where the log has none for `symbol` (a compile whose ptxas output
    was not captured), what the cubin records: registers, and static shared memory from the `.nv.shared.<fn>`
    section less the 1 KiB system reservation of sm_80 and newer. The stack frame and spills are not in the cubin:
    `ptxas_report` is then False and says so, rather than a silent 0."""
    rep = output.reports.get(symbol)
    regs = rep.registers if rep else (facts.registers if facts and facts.registers is not None else 0)
    bounds = facts.max_threads if facts else None
    if rep is None:
        section = facts.shared_section_bytes if facts else 0
        reserved = SYSTEM_SHARED_BYTES if compute_capability(output.arch)[0] >= 8 else 0
        shared = max(section - reserved, 0)
    return Resources(registers=regs, shared_bytes=rep.shared_bytes if rep else shared,
                     local_bytes=rep.stack_bytes if rep else 0,
                     spill_store_bytes=rep.spill_store_bytes if rep else 0,
                     spill_load_bytes=rep.spill_load_bytes if rep else 0,
                     max_threads_per_block=max_threads_for(regs, bounds, output.arch), arch=output.arch,
                     constant_bytes=rep.constant_bytes if rep else 0, barriers=rep.barriers if rep else 0,
                     launch_bounds_threads=math.prod(bounds) if bounds else None,
                     cluster_dims=tuple(facts.cluster_dims) if facts and facts.cluster_dims else None,
                     ptxas_report=rep is not None)


def _ptx_entry(ptx: str, symbol: str) -> str:
    """The module's header directives plus the `.entry` block of `symbol`."""
    lines = ptx.splitlines()
    header = [l for l in lines[:40] if l.startswith((".version", ".target", ".address_size"))]
    start = next((i for i, l in enumerate(lines) if re.search(rf"\.entry\s+{re.escape(symbol)}\s*\(", l)), None)
    if start is None:
        return ptx
    depth, end = 0, len(lines)
    seen_body = False
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        seen_body = seen_body or "{" in lines[i]
        if seen_body and depth == 0:
            end = i + 1
            break
    return "\n".join(header + [""] + lines[start:end]) + "\n"


def compile_cuda(source: str, arch: str | None = None, options=(), name: str | None = None, *,
                 first_line: int = 1, filename: str = "kernel.cu", simulate: bool = False) -> Module:
    """Compile CUDA C++ with NVRTC to a cubin (no GPU needed) and return its kernels as a Module.

    arch=None means the current GPU's arch, or sm_90 (with a note) where there is no GPU.
    `first_line` numbers the source's first line (2 in a `%%cuda` cell) so diagnostics match the editor.
    simulate=True: the kernels launch on the CPU (kernellab.run.sim.cuda: CPU tensors and NumPy arrays, bounds,
    race and barrier checks), as `%%cuda --sim` and `%%cuda` without a GPU do.
    """
    if not isinstance(source, str) or not source.strip():
        raise KernellabError("compile_cuda needs CUDA C++ source text with at least one __global__ function")
    t0 = time.perf_counter()
    notes = []
    if arch is None:
        arch, note = _device.current_arch()
        if note:
            notes.append(note)
    arch = normalize_arch(arch)
    if isinstance(options, str):
        options = tuple(options.split())
    options = tuple(options)
    output, state = compile_cached(source, arch, options, filename=filename, first_line=first_line)
    module = Module(output, source, name=name, first_line=first_line, filename=filename, cache_state=state,
                    wall_ms=(time.perf_counter() - t0) * 1e3, notes=notes)
    for k in module.kernels:
        k.simulate = bool(simulate)
    if not module.kernels:
        notes.append("no __global__ kernel was emitted (templates must be instantiated to be compiled)")
        module.notes = tuple(notes)
    return module


def autotune(source, configs, *, kernel: str, launch, inputs, reference=None, arch=None, baselines=None,
             executor=None, **options):
    """Compile, prune, check and time every configuration of a kernel (see kernellab.run.measure.autotune.autotune).

    `configs` entries become `-D NAME=VALUE` defines, or template arguments where `kernel` is a template;
    `launch(k, config, *args)` launches one configuration and `inputs(generator)` gives the arguments. Returns an
    AutotuneResult: `.rows`, `.best` (config and kernel), `kernellab.autotune_plot(result)`.
    """
    return _autotune(source, configs, kernel=kernel, launch=launch, inputs=inputs, reference=reference, arch=arch,
                     baselines=baselines, executor=executor, build=Module, **options)
