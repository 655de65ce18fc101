"""The docs a reader is sent to exist, and the exercise ids they use are real ones."""
import pathlib
import re

import kernellab

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_docs_path_named_exists():
    missing = [(p.name, ref) for p in DOCS for ref in re.findall(r"\bdocs/[\w.-]+\.md\b", p.read_text())
               if not (ROOT / ref).exists()]
    assert not missing, missing


def test_exercise_ids_in_the_docs_are_registered():
    ids = set(kernellab.exercises().ids)
    used = [(p.name, i) for p in DOCS
            for i in re.findall(r"""\bgrade(?:_many)?\(\s*["']([\w.-]+)["']""", p.read_text())]
    assert used and all(i in ids for _, i in used), [u for u in used if u[1] not in ids]


def test_the_learners_page_is_about_working_an_exercise():
    learners = (ROOT / "docs" / "EXERCISES.md").read_text()
    assert learners.startswith("# Working an exercise") and "AUTHORING-EXERCISES.md" in learners
    assert "docs/EXERCISES.md" in (ROOT / "README.md").read_text()
    assert (ROOT / "docs" / "AUTHORING-EXERCISES.md").read_text().startswith("# Graded exercises: how to add one")
