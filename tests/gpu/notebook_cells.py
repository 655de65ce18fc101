"""Read a tutorial's `%%cuda` cell out of its jupytext source, as the magic would hand it to compile_cuda."""
import pathlib

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"


def cuda_cells(notebook: str) -> list[str]:
    """Every `%%cuda` cell of notebooks/<notebook>, without its magic line, in order."""
    text = (NOTEBOOKS / notebook).read_text()
    cells, start = [], text.find("\n# %%cuda")
    while start >= 0:
        body = text[text.index("\n", start + 1) + 1:]
        end = body.find("\n# %%")
        cells.append(body[: end if end >= 0 else None].rstrip() + "\n")
        start = text.find("\n# %%cuda", start + 1)
    return cells


def cuda_cell(notebook: str) -> str:
    """The first `%%cuda` cell of notebooks/<notebook> that is the tutorial's own (not an exercise's stub, whose first
    line is `// exercise: <id>`), without its magic line."""
    return next(c for c in cuda_cells(notebook) if not c.lstrip().startswith("// exercise:"))
