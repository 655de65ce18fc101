"""Load the exercises' reference solutions and wrong variants from tests/exercises/solutions/ (see docs/AUTHORING-EXERCISES.md).

`<id>.cu` / `<id>.py` is the solution; `<id>.<variant>.cu` / `.py` a wrong variant whose second line says what the
grader must find and where: `// expect: out_of_bounds on gpu` (`# expect: ... on cpu` in Python).
"""
from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

SOLUTIONS = pathlib.Path(__file__).resolve().parent / "solutions"
_EXPECT = re.compile(r"^\s*(?://|#)\s*expect:\s*(?P<kinds>[\w\s]+?)\s+on\s+(?P<where>cpu|gpu)\s*$")


@dataclass(frozen=True)
class Variant:
    """One wrong variant: its file, the finding kinds it must produce, and where they can be found."""

    exercise: str
    name: str
    path: pathlib.Path
    kinds: tuple[str, ...]
    where: str                 # "cpu" or "gpu"

    def __str__(self) -> str:
        return f"{self.exercise}.{self.name}"


def solution_path(exercise_id: str) -> pathlib.Path:
    for ext in (".cu", ".py"):
        p = SOLUTIONS / f"{exercise_id}{ext}"
        if p.exists():
            return p
    raise FileNotFoundError(f"no reference solution for {exercise_id} in {SOLUTIONS}")


def variants(exercise_id: str | None = None) -> list[Variant]:
    """Every wrong variant (of one exercise), with its expectation parsed from its second line."""
    out = []
    for p in sorted(SOLUTIONS.glob("*.*.*")):
        stem, ext = p.name.rsplit(".", 1)
        ex_id, name = stem.split(".", 1)
        if exercise_id is not None and ex_id != exercise_id:
            continue
        lines = p.read_text().splitlines()
        m = _EXPECT.match(lines[1]) if len(lines) > 1 else None
        if m is None:
            raise ValueError(f"{p.name}: the second line must say `// expect: <kind> [<kind> ...] on cpu|gpu`")
        out.append(Variant(ex_id, name, p, tuple(m.group("kinds").split()), m.group("where")))
    return out


def cell_body(path: pathlib.Path) -> str:
    """A solution file as the body of its exercise's stub cell (the magic line is the notebook's)."""
    return path.read_text()


def load_kernel(exercise, path: pathlib.Path):
    """The kernel a solution file defines, compiled or built as the exercise's cell would make it."""
    import kernellab

    source = path.read_text()
    if exercise.kind == "cuda":
        module = kernellab.compile_cuda(source, arch=exercise.arch, first_line=2, filename="cell.cu")
        return module[exercise.kernel]
    namespace: dict = {"__name__": f"solution_{path.stem.replace('.', '_').replace('-', '_')}"}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace[exercise.kernel]
