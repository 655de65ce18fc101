"""The `%%cuda` cell magic: compile the cell, bind its kernels, show one card. Thin: the library does the work."""
from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import HTML, display
from traitlets import Bool, Unicode

from .. import report
from ..errors import CompileError, KernellabError
from ..kernel import compile_cuda
from ..run.launch.device import gpu_status
from ..run.sim.cuda.cpu import unsupported
from ..run.sim.cuda.toolchain import host_compiler, why_none
from .status import note_simulator, publish_status


def _options(values) -> tuple[str, ...]:
    """Flatten repeated -O/--options values, each possibly holding several space-separated options."""
    out = []
    for v in values or ():
        v = v.strip().lstrip("=").strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":  # IPython keeps the quotes of -O "..."
            v = v[1:-1]
        out += shlex.split(v)
    return tuple(out)


def bind_kernels(shell, module, name: str | None) -> list[str]:
    """Put each kernel (and the module, under --name) into the user namespace; return the names bound."""
    bound = []
    counts: dict[str, int] = {}
    for k in module.kernels:
        counts[k.name] = counts.get(k.name, 0) + 1
    for k in module.kernels:
        if counts[k.name] == 1 and k.name.isidentifier():
            shell.user_ns[k.name] = k
            bound.append(k.name)
    if name:
        shell.user_ns[name] = module
        bound.append(name)
    return bound


def show_code(module, ptx: bool, sass: bool) -> None:
    """Display each kernel's PTX as a collapsible block, and its SASS beside the cell's lines (Kernel.source_view:
    text in terminals)."""
    for k in module.kernels:
        if ptx:
            text = k.ptx
            display({"text/plain": f"--- PTX of {k.signature.display} ---\n{text}",
                     "text/html": f"<details><summary>PTX of <code>{report.esc(k.signature.display)}</code>"
                                  f" ({text.count(chr(10))} lines)</summary><pre>{report.esc(text)}</pre></details>"},
                    raw=True)
        if sass:
            view = k.source_view()
            display({"text/plain": str(view), "text/html": view._repr_html_()}, raw=True)


def compile_error_usage(exc: CompileError, display_report: bool = True) -> UsageError:
    """Show a compile error's report (for the JupyterLab gutter) and return the one-screen UsageError."""
    if display_report:
        data = {"text/plain": "", report.REPORT_MIME: exc.to_json()}
        display(data, raw=True)
    return UsageError(str(exc))


def refresh_status() -> None:
    """Refresh the GPU status item (memory in use changes as cells run); never fails a cell."""
    try:
        publish_status(update=True)
    except Exception:
        pass


def cpu_decision(asked: bool) -> tuple[bool, str]:
    """(whether a %%cuda cell's kernels launch on the CPU, the one line that says so): with --sim, or where no GPU is
    usable and a host C++ compiler is there to build the CPU path."""
    compiler = host_compiler()
    if asked:
        if compiler is None:
            return False, f"--sim: {why_none()}"
        return True, (f"--sim: launches run on the CPU (kernellab's CUDA C++ emulator, {compiler[1]}): CPU tensors or "
                      f"NumPy arrays, bounds, race and barrier checks; slow, so keep sizes small")
    ok, reason = gpu_status()
    if ok:
        return False, ""
    if compiler is None:
        return False, ""
    return True, (f"no GPU here ({reason}): launches run on the CPU (kernellab's CUDA C++ emulator, {compiler[1]}): "
                  f"CPU tensors or NumPy arrays, bounds, race and barrier checks; slow, so keep sizes small")


@magics_class
class KernellabMagics(Magics):
    """kernellab's cell magics. Defaults are configurable: `%config KernellabMagics.default_arch = 'sm_80'`."""

    default_arch = Unicode(None, allow_none=True, config=True,
                           help="Architecture for %%cuda cells without --arch (None: the current GPU's, or sm_90).")
    simulate = Bool(False, config=True, help="Launch %%cuda kernels on the CPU even where there is a GPU (as --sim "
                                             "does for one cell).")

    @magic_arguments()
    @argument("--arch", default=None, help="Target architecture, e.g. sm_90, sm_90a (for wgmma and setmaxnreg) or "
                                           "sm_80 (default: the current GPU's, or sm_90 with a note where there is "
                                           "no GPU).")
    @argument("-O", "--options", action="append", default=[], metavar="OPTS",
              help="NVRTC options, e.g. --options=--use_fast_math or -O \"--use_fast_math -maxrregcount=64\" "
                   "(repeatable).")
    @argument("--name", default=None, help="Also bind the compiled module under this name.")
    @argument("--isolate", action="store_true", help="Launch this cell's kernels in a worker process, so that a "
                                                      "faulty kernel cannot poison the notebook's CUDA context.")
    @argument("--ptx", action="store_true", help="Show each kernel's PTX.")
    @argument("--sass", action="store_true",
              help="Show each kernel's SASS beside the cell's lines, with counts per line (Kernel.source_view).")
    @argument("--sim", action="store_true", help="Launch this cell's kernels on the CPU (kernellab's CUDA C++ "
                                                 "emulator, with bounds, race and barrier checks) even where there is "
                                                 "a GPU (where there is none, they always are).")
    @cell_magic
    def cuda(self, line: str, cell: str):
        """Compile the cell's CUDA C++ (NVRTC) and bind each __global__ kernel in the namespace by its name.

        Launch a kernel with k[grid, block](args...) on torch tensors, CuPy arrays or numbers. The cell's card
        shows registers, shared memory, spills and occupancy per kernel; compile errors point at cell lines.
        With --sim, or where no GPU is usable, launches run on the CPU (kernellab.run.sim.cuda) on CPU tensors and
        NumPy arrays: an out-of-bounds access raises naming the cell line, thread and block, and
        `k.sanitize(grid, block, *args, tool="racecheck")` (or memcheck, synccheck, initcheck, all) reports the
        checks' findings in compute-sanitizer's terms.
        """
        try:
            args = parse_argstring(self.cuda, line)
        except Exception as exc:  # argparse's own message, one line
            raise UsageError(f"%%cuda {line}: {exc}") from None

        simulate, sim_note = cpu_decision(args.sim or self.simulate)
        try:
            module = compile_cuda(cell, arch=args.arch or self.default_arch, options=_options(args.options),
                                  name=args.name, first_line=2, filename="cell.cu", simulate=simulate)
        except CompileError as exc:
            raise compile_error_usage(exc) from None
        except (KernellabError, ValueError) as exc:
            raise UsageError(str(exc)) from None
        if args.isolate:
            for k in module.kernels:
                k.isolate = True
        if sim_note:
            module.notes += (sim_note,)
            if simulate:
                why = unsupported(cell, 2)
                if why:
                    module.notes += (f"this cell's kernels cannot launch on the CPU: {why}",)
                note_simulator()
        bind_kernels(self.shell, module, args.name)
        if args.ptx or args.sass:
            show_code(module, args.ptx, args.sass)
        refresh_status()
        return module
