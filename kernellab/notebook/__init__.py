"""Presentation: magics, rich cards, plots and widgets. Nothing below this layer imports it."""
from __future__ import annotations

import warnings
from functools import partial

NOTE_MIME = "application/vnd.kernellab.note+json"


def load_ipython_extension(ipython):
    """Register kernellab's magics (`%load_ext kernellab`); show Figures and the simulator's notices in cells."""
    # The magics import IPython: loaded here, so that the plots and widgets of this package import without it.
    from .magics import KernellabMagics

    ipython.register_magics(KernellabMagics)
    from .gpu_magic import GpuMagics

    ipython.register_magics(GpuMagics)
    try:
        from .numba_magics import NumbaMagics
    except ImportError:
        NumbaMagics = None
    if NumbaMagics is not None:
        ipython.register_magics(NumbaMagics)
    from . import run_magics

    run_magics.load_ipython_extension(ipython)
    show_figures(ipython)
    show_notices_as_notes()
    try:
        from .status import publish_status
    except ImportError:
        return
    publish_status()


def show_figures(ipython) -> None:
    """Show a matplotlib Figure returned by a cell as a PNG, as `%matplotlib inline` would: kernellab's plots are
    Figures made without pyplot (so that they show once), which IPython shows as `<Figure ...>` until pyplot's
    backend registers a formatter. A formatter already there (`%matplotlib inline`, `retina`) is kept."""
    formatters = getattr(getattr(ipython, "display_formatter", None), "formatters", None)
    if not formatters or "image/png" not in formatters:
        return
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return
    png = formatters["image/png"]
    try:
        png.lookup_by_type(Figure)
        return
    except KeyError:
        pass

    from IPython.core.pylabtools import print_figure

    png.for_type(Figure, partial(print_figure, fmt="png", base64=True, bbox_inches="tight"))


def note_bundle(text: str) -> dict:
    """An expected condition worth a line (e.g. a kernel runs in the simulator): a quiet styled note, not a
    warning box. Plain text, HTML, and a JSON MIME type that tests can find."""
    from .. import report

    text = text.removeprefix("kernellab: ")
    return {"text/plain": f"note: {text}",
            "text/html": "<div class='kernellab-note' style='color:var(--jp-ui-font-color2,#666);font-size:90%;"
                         "border-left:3px solid var(--jp-brand-color2,#8ab);padding:2px 8px'>"
                         f"&#9432; {report.esc(text)}</div>",
            NOTE_MIME: {"text": text}}


def _is_notice(category) -> bool:
    """kernellab.run.sim.numba_sim.SimulatorNotice (by name: checking it must not import Numba)."""
    return any(c.__name__ == "SimulatorNotice" and c.__module__ == "kernellab.run.sim.numba_sim"
               for c in getattr(category, "__mro__", ()))


def show_notices_as_notes() -> None:
    """Show the simulator's notices as notes in the cell rather than as warnings on stderr (a red box in Lab);
    every other warning, and a notice written to a file, goes where it went."""
    original = warnings.showwarning
    if getattr(original, "kernellab_notes", False):
        return

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if file is None and _is_notice(category):
            from IPython.display import display

            display(note_bundle(str(message)), raw=True)
            return
        original(message, category, filename, lineno, file, line)

    showwarning.kernellab_notes = True
    warnings.showwarning = showwarning
