"""Read a tutorial's cells out of its jupytext source, as the notebook would run them.

- `cuda_cell(notebook, name=None)`: a `%%cuda` cell's source without its magic line (the first one, or the one
  with `--name name`), what the magic hands to compile_cuda (with first_line=2).
- `launcher_cells(notebook)`: the Python cells whose first line starts with `# launchers`: the host code that
  plans and launches a tutorial's kernels.
- `load_tutorial(notebook, compile=...)`: every named `%%cuda` cell compiled and bound under its name, then the
  launcher cells run in that namespace; returns the namespace. `compile(source)` defaults to kernellab's NVRTC
  (for a GPU); tests on the CPU pass tests/emu's compile_host instead.
"""
import pathlib
import re

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"


def _cells(notebook: str) -> list[str]:
    """The jupytext percent cells of notebooks/<notebook>, each without its `# %%` header line."""
    text = (NOTEBOOKS / notebook).read_text()
    parts = re.split(r"^# %%(?: .*)?\n", text, flags=re.M)     # "# %%" or "# %% [markdown]", not "# %%cuda"
    return parts[1:]


def cuda_cells(notebook: str) -> dict[str | None, str]:
    """Every `%%cuda` cell, by its --name (None for unnamed), without the magic line."""
    found = {}
    for cell in _cells(notebook):
        first, _, body = cell.partition("\n")
        if first.startswith("# %%cuda"):
            m = re.search(r"--name[ =](\S+)", first)
            found[m.group(1) if m else None] = body.rstrip() + "\n"
    return found


def cuda_cell(notebook: str, name: str | None = None) -> str:
    """The first `%%cuda` cell of notebooks/<notebook> (or the one named `name`) without its magic line."""
    cells = cuda_cells(notebook)
    if name is None:
        return next(iter(cells.values()))
    return cells[name]


def launcher_cells(notebook: str) -> list[str]:
    """The Python cells that start with `# launchers`, in order."""
    return [cell for cell in _cells(notebook) if cell.startswith("# launchers")]


def load_tutorial(notebook: str, compile=None) -> dict:
    """The namespace a tutorial's launchers run in: its named %%cuda modules, then the launcher cells' names."""
    if compile is None:
        import kernellab

        def compile(source):
            return kernellab.compile_cuda(source, first_line=2, filename="cell.cu")
    ns: dict = {"__name__": f"tutorial_{pathlib.Path(notebook).stem.replace('-', '_')}"}
    for name, source in cuda_cells(notebook).items():
        if name:
            ns[name] = compile(source)
    for cell in launcher_cells(notebook):
        exec(compile_python(cell, notebook), ns)
    return ns


def compile_python(cell: str, notebook: str):
    return compile(cell, f"{notebook}:launchers", "exec")
