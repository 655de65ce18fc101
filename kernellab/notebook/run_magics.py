"""`%launch`: run one launch isolated, under compute-sanitizer or under Nsight Compute, from a notebook line.

    %launch vadd[grid, block](a, b, c, n)                       # as written (isolated if the notebook says so)
    %launch --isolate vadd[grid, block](a, b, c, n)             # in the warm worker process
    %launch --sanitize vadd[grid, block](a, b, c, n)            # compute-sanitizer memcheck
    %launch --sanitize=racecheck tile[g, b](x, y)                # or synccheck, initcheck, all
                                                                 # (a simulated Numba kernel: in the simulator)
    %launch --profile vadd[grid, block](a, b, c, n)             # ncu, the default metric set
    %launch --profile=full vadd[grid, block](a, b, c, n)        # ncu --set full
    %launch --banks transpose[grid, block](x, y, n)             # ncu: shared-memory wavefronts per cell line

The notebook-wide default: `%config KernellabRun.isolate = True` (also `timeout_s`, `diagnose`), the same as
`kernellab.run.launch.worker.set_isolation(True)`. Load with `%load_ext kernellab.notebook.run_magics`.
"""
from __future__ import annotations

import ast

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Bool, Float, observe

from ..errors import KernellabError
from ..run.launch import worker as _worker

_VALUE_OPTIONS = ("--timeout", "--metrics")   # options that may take their value as the next word


def split_options(line: str) -> tuple[list[str], str]:
    """(leading option words, the launch expression) from a %launch line."""
    rest = line.strip()
    opts: list[str] = []
    while rest.startswith("-"):
        word, _, rest = rest.partition(" ")
        rest = rest.lstrip()
        opts.append(word)
        if word in _VALUE_OPTIONS:
            value, _, rest = rest.partition(" ")
            opts.append(value)
            rest = rest.lstrip()
    return opts, rest


def parse_launch(expr: str, namespace: dict):
    """(kernel, grid, block, shared_bytes, args) from 'kernel[grid, block](args...)', evaluated in `namespace`."""
    usage = ("%launch needs a launch written as kernel[grid, block](args...) or kernel[grid, block, shared_bytes]"
             "(args...)")
    if not expr:
        raise UsageError(usage)
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError as exc:
        raise UsageError(f"{usage}; '{expr}' is not Python: {exc.msg}") from None
    if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Subscript)):
        raise UsageError(f"{usage}, got '{expr}'")
    bad = [k.arg or "**" for k in tree.keywords if k.arg != "shared_bytes"]
    if bad:
        raise UsageError(f"%launch: the launch takes only shared_bytes= as a keyword, got {', '.join(bad)}=")

    def evaluate(node, locals_=None):
        code = compile(ast.fix_missing_locations(ast.Expression(body=node)), "<%launch>", "eval")
        return eval(code, namespace, locals_)  # the user's own expression, in the user's namespace

    try:
        launcher = evaluate(tree.func)
        collected = evaluate(ast.Call(func=ast.Name(id="__kl_collect__", ctx=ast.Load()), args=tree.args,
                                      keywords=tree.keywords),
                             {"__kl_collect__": lambda *a, **k: (a, k)})
    except KernellabError as exc:
        raise UsageError(str(exc)) from None
    if not all(hasattr(launcher, n) for n in ("kernel", "grid", "block")):
        raise UsageError(f"%launch: {ast.unparse(tree.func)} is a {type(launcher).__name__}, not a kernel launch "
                         f"configuration; the kernel must come from %%cuda or kernellab.compile_cuda")
    args, kwargs = collected
    shared = kwargs.get("shared_bytes", getattr(launcher, "shared_bytes", 0))
    return launcher.kernel, launcher.grid, launcher.block, shared, args


@magics_class
class KernellabRun(Magics):
    """The %launch magic and the notebook-wide run settings (`%config KernellabRun.isolate = True`)."""

    isolate = Bool(False, config=True, help="Run every kernel launch in the isolated worker process.")
    timeout_s = Float(60.0, config=True, help="Kill an isolated launch that runs longer than this (seconds).")
    diagnose = Bool(True, config=True, help="After a fault in the worker, re-run it under compute-sanitizer.")

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        s = _worker.settings
        self.isolate, self.timeout_s, self.diagnose = s.isolate, s.timeout_s, s.diagnose

    @observe("isolate", "timeout_s", "diagnose")
    def _to_settings(self, change):
        setattr(_worker.settings, change["name"], change["new"])

    @magic_arguments()
    @argument("--isolate", action="store_true", help="Run in the warm worker process: a fault cannot touch this "
                                                     "notebook's CUDA context; outputs are copied back.")
    @argument("--in-process", action="store_true", help="Run in this process even when isolation is on.")
    @argument("--sanitize", nargs="?", const="memcheck", default=None, metavar="TOOL",
              help="Run under compute-sanitizer: memcheck (default), racecheck, synccheck, initcheck or all "
                   "(--sanitize=racecheck). Reports each problem with its cell line, thread and block.")
    @argument("--profile", nargs="?", const="default", default=None, metavar="SET",
              help="Run under Nsight Compute: the default metric set, or a section set (--profile=full).")
    @argument("--banks", action="store_true", help="Run under Nsight Compute's source counters: shared-memory "
                                                    "instructions, wavefronts and bank conflicts per cell line "
                                                    "(falls back to the model where counters are not permitted).")
    @argument("--metrics", default=None, help="With --profile: comma-separated ncu metric names instead.")
    @argument("--timeout", type=float, default=None, help="Seconds before an isolated launch is killed.")
    @argument("launch", nargs="*", help="kernel[grid, block](args...), evaluated in the notebook's namespace.")
    @line_magic
    def launch(self, line: str):
        """Launch a kernel isolated, under compute-sanitizer or under Nsight Compute: %launch [options] k[g, b](args).

        Options take their values with '=' (--sanitize=racecheck, --profile=full); --timeout and --metrics may
        also take the next word. Without options the launch runs as written (isolated if
        `%config KernellabRun.isolate = True`). Sanitize and profile run on a copy of the arguments in a separate
        process and leave yours unchanged; --isolate copies the kernel's outputs back.
        """
        opts, expr = split_options(line)
        try:
            ns = parse_argstring(self.launch, " ".join(opts))
        except Exception as exc:
            raise UsageError(f"%launch {line}: {exc}") from None
        if sum(bool(x) for x in (ns.isolate, ns.in_process, ns.sanitize, ns.profile, ns.banks)) > 1:
            raise UsageError("%launch: choose one of --isolate, --in-process, --sanitize, --profile and --banks")
        kernel, grid, block, shared, args = parse_launch(expr, self.shell.user_ns)
        try:
            if ns.sanitize:   # a simulating Numba kernel runs racecheck/synccheck/initcheck in the simulator
                return kernel.sanitize(grid, block, *args, shared_bytes=shared, tool=ns.sanitize)
            if ns.banks:
                return kernel.profile_banks(grid, block, *args, shared_bytes=shared)
            if ns.profile:
                metrics = [m.strip() for m in ns.metrics.split(",") if m.strip()] if ns.metrics else None
                return kernel.profile(grid, block, *args, shared_bytes=shared, metrics=metrics,
                                      section_set=None if ns.profile == "default" else ns.profile)
            if ns.isolate or (_worker.settings.isolate and not ns.in_process):
                return kernel.run_isolated(grid, block, *args, shared_bytes=shared, timeout_s=ns.timeout)
            return kernel.launch(grid, block, *args, shared_bytes=shared, isolate=False)
        except (KernellabError, ValueError) as exc:
            raise UsageError(str(exc)) from None


def load_ipython_extension(ipython):
    """`%load_ext kernellab.notebook.run_magics`: register %launch and the KernellabRun settings."""
    for c in ipython.configurables:
        if isinstance(c, KernellabRun):
            ipython.register_magics(c)
            return
    magics = KernellabRun(shell=ipython)
    ipython.register_magics(magics)
    ipython.configurables.append(magics)
