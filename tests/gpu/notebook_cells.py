"""Read a tutorial's cells out of its jupytext source, as the notebook would run them.

- `cuda_cell(notebook, name=None)`: a `%%cuda` cell's source without its magic line: the tutorial's first own cell
  (not an exercise's stub, whose first line is `// exercise: <id>`), or the one with `--name name`. This is what
  the magic hands to compile_cuda (with first_line=2).
- `launcher_cells(notebook)`: the Python cells whose first line starts with `# launchers`: the host code that
  plans and launches a tutorial's kernels.
- `load_tutorial(notebook, compile=...)`: every named `%%cuda` cell compiled and bound under its name, then the
  launcher cells run in that namespace; returns the namespace. `compile(source)` defaults to kernellab's NVRTC
  (for a GPU, with the cell's `--arch`); tests on the CPU pass kernellab.run.sim.cuda's compile_host instead. The
  namespace is the `__dict__` of a real module registered in sys.modules (`tutorial_09_attention_inference`, with
  a suffix for a second load), so that tools that import a function's module by its `__name__` (torch.compile's
  dynamo) find it.
"""
import itertools
import pathlib
import re
import sys
import types

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"


def _cells(notebook: str) -> list[str]:
    """The jupytext percent cells of notebooks/<notebook>, each without its `# %%` header line."""
    text = (NOTEBOOKS / notebook).read_text()
    parts = re.split(r"^# %%(?: .*)?\n", text, flags=re.M)     # "# %%" or "# %% [markdown]", not "# %%cuda"
    return parts[1:]


def cuda_cells(notebook: str) -> list[str]:
    """Every `%%cuda` cell of notebooks/<notebook>, without its magic line, in order."""
    return [body for _, body in cuda_cells_with_flags(notebook)]


def cuda_cells_with_flags(notebook: str) -> list[tuple[str, str]]:
    """(the magic's options, e.g. "--arch sm_90a", the cell without its magic line) for every `%%cuda` cell."""
    out = []
    for cell in _cells(notebook):
        if cell.startswith("# %%cuda"):
            first, _, body = cell.partition("\n")
            out.append((first[len("# %%cuda"):].strip(), body.rstrip() + "\n"))
    return out


def named_cuda_cells(notebook: str) -> dict[str, str]:
    """The `%%cuda --name NAME` cells, by name, without the magic line."""
    return {name: body for name, (_, body) in named_cuda_cells_with_arch(notebook).items()}


def named_cuda_cells_with_arch(notebook: str) -> dict[str, tuple[str | None, str]]:
    """The `%%cuda --name NAME` cells, by name: (the magic's --arch, or None, the cell without the magic line)."""
    found = {}
    for cell in _cells(notebook):
        first, _, body = cell.partition("\n")
        m = re.match(r"# %%cuda\b.*--name[ =](\S+)", first)
        if m:
            arch = re.search(r"--arch[ =](\S+)", first)
            found[m.group(1)] = (arch.group(1) if arch else None, body.rstrip() + "\n")
    return found


def cuda_cell(notebook: str, name: str | None = None) -> str:
    """The `%%cuda` cell named `name`, or the first that is the tutorial's own (not an exercise's stub)."""
    if name is not None:
        return named_cuda_cells(notebook)[name]
    return next(c for c in cuda_cells(notebook) if not c.lstrip().startswith("// exercise:"))


def launcher_cells(notebook: str) -> list[str]:
    """The Python cells that start with `# launchers`, in order."""
    return [cell for cell in _cells(notebook) if cell.startswith("# launchers")]


def load_tutorial(notebook: str, compile=None) -> dict:
    """The namespace a tutorial's launchers run in: its named %%cuda modules, then the launcher cells' names."""
    module = _new_module(f"tutorial_{pathlib.Path(notebook).stem.replace('-', '_')}", notebook)
    ns = module.__dict__
    for name, (arch, source) in named_cuda_cells_with_arch(notebook).items():
        if compile is None:       # kernellab's NVRTC, for the cell's --arch (sm_90a for wgmma) as the magic does
            import kernellab

            ns[name] = kernellab.compile_cuda(source, first_line=2, filename="cell.cu",
                                              **({"arch": arch} if arch else {}))
        else:
            ns[name] = compile(source)
    for cell in launcher_cells(notebook):
        exec(compile_python(cell, notebook), ns)
    return ns


def _new_module(base: str, notebook: str) -> types.ModuleType:
    """An empty module registered in sys.modules as `base`, or `base_2`, `base_3`... where a load of the same
    tutorial (another compile) holds that name: dynamo resolves a function's globals by importing its module's name,
    so each load keeps its own."""
    name = next(n for n in itertools.chain([base], (f"{base}_{i}" for i in itertools.count(2)))
                if n not in sys.modules)
    module = types.ModuleType(name, f"The launcher cells of notebooks/{notebook}, as loaded by notebook_cells.")
    module.__file__ = str(NOTEBOOKS / notebook)
    sys.modules[name] = module
    return module


def compile_python(cell: str, notebook: str):
    """A launcher cell as a code object, named after its notebook in tracebacks."""
    return compile(cell, f"{notebook}:launchers", "exec")
