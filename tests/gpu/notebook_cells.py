"""Read a tutorial's `%%cuda` cell out of its jupytext source, as the magic would hand it to compile_cuda."""
import pathlib

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"


def cuda_cell(notebook: str) -> str:
    """The first `%%cuda` cell of notebooks/<notebook> without its magic line."""
    text = (NOTEBOOKS / notebook).read_text()
    start = text.index("\n# %%cuda") + 1
    body = text[text.index("\n", start) + 1:]
    end = body.find("\n# %%")
    return body[: end if end >= 0 else None].rstrip() + "\n"
