"""The `%%numba` cell magic: run the cell's Python, wrap each @cuda.jit kernel as a kernellab Kernel, show one card."""
from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display
from traitlets import Bool, Unicode

from ..compile.numba_backend import register_source
from ..errors import CompileError, KernellabError
from ..kernel_numba import numba_module
from .magics import compile_error_usage, refresh_status, show_code
from .status import note_simulator


def _unquote(text: str) -> str:
    """IPython keeps the quotes of `--opt "a b"`: take them off."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def parse_signatures(values) -> dict:
    """{'vadd': 'float32[::1], int32'} from repeated --signature 'NAME: TYPES' (a bare 'TYPES' is keyed None)."""
    out: dict = {}
    for raw in values or ():
        text = _unquote(raw)
        head, sep, rest = text.partition(":")
        if sep and head.strip().isidentifier() and not rest.startswith(":"):
            name, sig = head.strip(), rest.strip()
        else:
            name, sig = None, text
        if not sig:
            raise UsageError(f"--signature {raw!r} names no types; write --signature 'NAME: float32[::1], int32'")
        if name in out:
            raise UsageError(f"--signature given twice for {name or 'the kernel'}")
        out[name] = sig
    return out


def _names(values) -> tuple[str, ...]:
    out = []
    for v in values or ():
        out += [n for n in shlex.split(_unquote(v).replace(",", " ")) if n]
    return tuple(out)


@magics_class
class NumbaMagics(Magics):
    """The `%%numba` magic. Defaults are configurable: `%config NumbaMagics.simulate = True`."""

    default_arch = Unicode(None, allow_none=True, config=True,
                           help="Architecture for %%numba resources without --arch (None: the GPU's, or sm_90).")
    simulate = Bool(False, config=True, help="Run %%numba kernels in the simulator even where there is a GPU "
                                             "(as --sim does for one cell).")

    @magic_arguments()
    @argument("--arch", default=None, help="Architecture whose registers, shared memory and spills to report, e.g. "
                                           "sm_90 (default: the current GPU's, or sm_90 where there is none).")
    @argument("-s", "--signature", action="append", default=[], metavar="'NAME: TYPES'",
              help="A kernel's Numba argument types, e.g. --signature 'vadd: float32[::1], float32[::1], int32' "
                   "(repeatable). Without one, a kernel takes its signature from its first launch.")
    @argument("--sim", action="store_true", help="Launch this cell's kernels in Numba's CUDA simulator even where "
                                                 "there is a GPU (where there is none, they always are).")
    @argument("-k", "--kernel", action="append", default=[], metavar="NAME",
              help="Treat the plain function NAME (no @cuda.jit) as a kernel, bound as one once the cell has run "
                   "(repeatable, or comma-separated).")
    @argument("--name", default=None, help="Also bind the cell's kernels, as a module, under this name.")
    @argument("--ptx", action="store_true", help="Show each compiled kernel's PTX.")
    @argument("--sass", action="store_true",
              help="Show each compiled kernel's SASS beside the cell's lines (Kernel.source_view).")
    @argument("--banks", nargs="?", const="", default=None, metavar="LAUNCH",
              help="Bank conflicts per cell line from the simulator's shared-memory trace. Alone: the next launch of "
                   "each kernel runs in the simulator and returns its trace. With a launch, e.g. --banks "
                   "\"transpose[(1, 1), (32, 32)](a, out)\": run that launch traced now and show the trace.")
    @cell_magic
    def numba(self, line: str, cell: str):
        """Run the cell's Python and bind each @cuda.jit kernel in the namespace as a kernellab Kernel.

        `cuda` (numba.cuda) is available in the cell. Launch a kernel with k[grid, block](args...): on a GPU with
        torch CUDA tensors or CuPy arrays (zero copy), in the simulator (no GPU, or --sim) with NumPy arrays or torch
        tensors. The card shows registers, shared memory, spills and occupancy per kernel (for --arch, from ptxas).
        A kernel without --signature is compiled at its first launch, which updates the card in place.
        Compile errors point at cell lines (this line is line 1); exceptions in simulated kernels name the thread,
        the block and the cell line. A function whose only parameter is `cuda` is a kernel factory (GPU-Puzzles'
        style: `def map_test(cuda): def call(out, a): ...; return call`): it is bound as a kernel, compiled with
        numba.cuda and simulated with the simulator's module. In the simulator, `k.sanitize(grid, block, *args,
        tool="racecheck")` (or "synccheck", "initcheck", or `%launch --sanitize=racecheck ...`) finds shared-memory
        races, divergent barriers and reads of shared memory no thread stored without a GPU.
        """
        try:
            args = parse_argstring(self.numba, line)
        except Exception as exc:  # argparse's own message, one line
            raise UsageError(f"%%numba {line}: {exc}") from None

        signatures = parse_signatures(args.signature)
        filename = self._cell_filename(line, cell)
        try:
            module = numba_module(cell, signatures=signatures, arch=args.arch or self.default_arch,
                                  simulate=True if (args.sim or self.simulate) else None, name=args.name,
                                  namespace=self.shell.user_ns, filename=filename, first_line=2,
                                  kernels=_names(args.kernel), line_label="cell line")
        except CompileError as exc:
            raise compile_error_usage(exc) from None
        except (KernellabError, ValueError) as exc:
            raise UsageError(str(exc)) from None
        if module.simulate:
            note_simulator()
        if args.name:
            self.shell.user_ns[args.name] = module
        if args.ptx or args.sass:
            compiled = [k for k in module.kernels if k.compiled is not None]
            show_code(type("Compiled", (), {"kernels": compiled})(), args.ptx, args.sass)
        if args.banks is not None:
            launch = _unquote(args.banks)
            if not launch:
                for k in module.kernels:
                    k.trace_next = True
                module.notes += ("--banks: the next launch of each kernel runs in the simulator and returns its "
                                 "shared-memory trace (bank conflicts per cell line)",)
            else:
                display(self._traced_launch(module, launch))
        refresh_status()
        if any(k.pending for k in module.kernels):
            # The card is shown as a display that the first launch of each kernel updates: its registers, shared
            # memory and occupancy (ptxas's, for the launch's types) replace the dashes in place.
            handle = display(module, display_id=True)
            for k in module.kernels:
                if k.pending and handle is not None:
                    k.on_signature.append(lambda _k, h=handle, m=module: h.update(m))
            return None
        return module

    def _cell_filename(self, line: str, cell: str) -> str:
        """A filename for the cell whose lines are the cell's (the %%numba line is line 1), cached for tracebacks."""
        text = f"%%numba {line}\n{cell}"
        compiler = getattr(self.shell, "compile", None)
        if compiler is not None and hasattr(compiler, "cache"):
            return compiler.cache(text, self.shell.execution_count)

        name = f"<numba-cell-{abs(hash(text)) % 10**10}>"
        register_source(text, name)
        return name

    def _traced_launch(self, module, launch: str):
        """Evaluate a launch expression with tracing on for the cell's kernels; return its SharedTrace."""
        for k in module.kernels:
            k.trace_next = True
        try:
            result = eval(compile(launch, "<--banks>", "eval"), self.shell.user_ns)
        except SyntaxError as exc:
            raise UsageError(f"--banks {launch!r} is not a launch expression ({exc.msg}); write e.g. --banks "
                             f"\"transpose[(1, 1), (32, 32)](a, out)\"") from None
        except KernellabError as exc:
            raise UsageError(f"--banks {launch}: {exc}") from None
        finally:
            for k in module.kernels:
                k.trace_next = False
        if result is None or not hasattr(result, "lines"):
            names = ", ".join(k.name for k in module.kernels) or "none"
            raise UsageError(f"--banks {launch!r} did not launch a kernel of this cell ({names}); write e.g. --banks "
                             f"\"NAME[grid, block](args)\"")
        return result
