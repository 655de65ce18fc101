"""`%%gpu`: a cell that needs a GPU runs as Python where there is one, and is skipped in one line where there is none.

    %%gpu
    vadd[grid, 256](a, b, c, n)
    kernellab.bench(...)

Run All on a laptop then reaches the end of a tutorial: every cell that compiles, draws or analyses still runs, and
each GPU cell says in one line that it was skipped and why. `%%gpu --skip-note "figures below are from an H100"`
adds a sentence to that line. A tutorial's own `%%gpu` cell shows below that line the outputs it had on the GPU the
tutorial was recorded on (kernellab/notebook/recorded.py), so Run All without a GPU keeps them; edited, it shows
them labelled as the tutorial's version's.

`%%cpu` is its counterpart: a cell that runs only where no GPU is usable, where `%%cuda` kernels launch on the CPU
path (kernellab.run.sim.cuda): the tutorials' checks and launches at small sizes on CPU tensors, with one line that
says so. On a GPU it does nothing and shows nothing (the `%%gpu` cells beside it do the real thing).
"""
from __future__ import annotations

import ast
import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from .. import report
from ..run.launch import device as _device
from ..run.sim.cuda.toolchain import host_compiler, why_none
from .recorded import SKIP_MIME, current_cell_id, lookup, lookup_cell_id

CPU_MIME = "application/vnd.kernellab.cpu+json"


def cpu_bundle(reason: str, note: str | None = None) -> dict:
    """The one line over a `%%cpu` cell's output: no GPU, so this runs on the CPU path, at small sizes."""
    return _note_bundle(f"no GPU ({reason}): this cell runs the kernels on the CPU (kernellab's CUDA C++ emulator), "
                        f"at small sizes", note, "", CPU_MIME, {"reason": reason, "note": note})


def skipped_bundle(reason: str, note: str | None = None) -> dict:
    """The one-line display of a skipped GPU cell (plain text, HTML and a JSON MIME type tests can find)."""
    return _note_bundle(f"skipped: this cell needs a CUDA GPU ({reason})", note, "&#9197; ", SKIP_MIME,
                        {"reason": reason, "note": note})


def _note_bundle(text: str, note: str | None, icon_html: str, mime: str, payload: dict) -> dict:
    """A quiet one-line display: plain text, grey italic HTML (after `icon_html`) and `mime` with `payload`."""
    if note:
        text += f". {note}"
    return {"text/plain": text,
            "text/html": f"<div style='color:#777;font-style:italic'>{icon_html}{report.esc(text)}</div>",
            mime: payload}


def recorded_bundle(reason: str, device: str, date: str, edited: bool = False) -> dict:
    """The label above a skipped cell's recorded outputs: where and when they were recorded, and why not here
    (without the cell's --skip-note: it quotes figures for when nothing else is shown, maybe from another run).
    `edited`: the outputs are those of the tutorial's version of a cell the learner has changed."""
    if edited:
        text = (f"recorded on {device}, {date}, for the tutorial's version of this cell (yours differs); no GPU here "
                f"({reason}), so it was not run: the outputs below are the tutorial's")
    else:
        text = (f"recorded on {device}, {date}; no GPU here ({reason}), so this cell was not run: its outputs below "
                f"are the recorded ones")
    return {"text/plain": text,
            "text/html": "<div class='kernellab-recorded' style='color:#777;font-style:italic;font-size:90%'>"
                         f"&#9197; {report.esc(text)}</div>",
            SKIP_MIME: {"reason": reason, "note": None,
                        "recorded": {"device": device, "date": date, "edited": edited}}}


def show_recorded(outputs: list[dict]) -> None:
    """Show recorded outputs again as they were: streams to their stream, displays and results as displays."""
    for out in outputs:
        if out["output_type"] == "stream":
            stream = sys.stderr if out.get("name") == "stderr" else sys.stdout
            stream.write(out["text"])
            stream.flush()
        else:
            display(out["data"], metadata=out.get("metadata") or None, raw=True)


def run_python(shell, cell: str):
    """Run `cell` (IPython syntax: %magics allowed) in the user namespace; return its last expression's value."""
    source = shell.transform_cell(cell)
    tree = ast.parse(source, filename="<gpu cell>")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    ns = shell.user_ns
    if tree.body:
        exec(compile(tree, "<gpu cell>", "exec"), ns)
    if last is not None:
        return eval(compile(last, "<gpu cell>", "eval"), ns)
    return None


@magics_class
class GpuMagics(Magics):
    """`%%gpu`: run the cell where a GPU is usable, skip it with a one-line note where none is; `%%cpu`: the other
    way round, for the CPU path's small-size checks."""

    @magic_arguments()
    @argument("--skip-note", default=None, help="A sentence added to the skip line (e.g. where recorded figures are).")
    @cell_magic
    def gpu(self, line: str, cell: str):
        """Run this cell as Python if a CUDA GPU is usable; otherwise show one line saying it was skipped."""
        try:
            args = parse_argstring(self.gpu, line)
        except Exception as exc:
            raise UsageError(f"%%gpu {line}: {exc}") from None
        note = args.skip_note
        if note and len(note) >= 2 and note[0] == note[-1] and note[0] in "\"'":  # IPython keeps the quotes
            note = note[1:-1]
        ok, reason = _device.gpu_status()
        if not ok:
            found, edited = lookup(line, cell), False
            if found is None:
                found, edited = lookup_cell_id(current_cell_id(self.shell)), True
            if found is None:
                display(skipped_bundle(reason, note), raw=True)
                return None
            outputs, device, date, _ = found
            display(recorded_bundle(reason, device, date, edited), raw=True)   # the outputs say more than a note
            show_recorded(outputs)
            return None
        return run_python(self.shell, cell)

    @magic_arguments()
    @argument("--note", default=None, help="A sentence added to the line that says the cell runs on the CPU.")
    @cell_magic
    def cpu(self, line: str, cell: str):
        """Run this cell as Python only where no CUDA GPU is usable (`%%cuda` kernels then launch on the CPU path), with
        one line saying so; on a GPU, do nothing."""
        try:
            args = parse_argstring(self.cpu, line)
        except Exception as exc:
            raise UsageError(f"%%cpu {line}: {exc}") from None
        ok, reason = _device.gpu_status()
        if ok:
            return None
        note = args.note
        if note and len(note) >= 2 and note[0] == note[-1] and note[0] in "\"'":
            note = note[1:-1]
        if host_compiler() is None:
            display(skipped_bundle(f"{reason}; and {why_none()}", note), raw=True)
            return None
        display(cpu_bundle(reason, note), raw=True)
        return run_python(self.shell, cell)
