"""kernellab.grade on a cell's source text (what a class hands in, and what travels to a grading pool's workers): the
same findings as grading the kernel the cell defines, and a `compile_error` finding for a cell that does not build."""
import pickle

import kernellab
from exercises.solutions_lib import load_kernel, solution_path, variants
from kernellab.teach import exercise, kernel_from_cell


def _variant(ex_id, name):
    return next(v for v in variants(ex_id) if v.name == name)


def test_a_cuda_cell_text_grades_as_its_kernel_does():
    v = _variant("01-reverse", "unguarded_read")
    from_text = kernellab.grade("01-reverse", v.path.read_text(), speed=False)
    from_kernel = kernellab.grade("01-reverse", load_kernel(exercise("01-reverse"), v.path), speed=False)
    kinds = [f.kind for f in from_text.findings]
    assert kinds == [f.kind for f in from_kernel.findings]
    assert kinds[0] == "out_of_bounds" and "missing_guard" in kinds     # run (on the CPU path here), then read
    assert from_text.findings[0].cell_line == from_kernel.findings[0].cell_line == 6   # numbered as in a %%cuda cell:
    guard = kinds.index("missing_guard")                                                # file line 5, the read
    assert from_text.findings[guard].cell_line == from_kernel.findings[guard].cell_line == 4
    ok = kernellab.grade("01-reverse", solution_path("01-reverse").read_text(), speed=False)
    assert ok.passed and not ok.findings
    assert pickle.loads(pickle.dumps(from_text)) == from_text          # it travels back from a worker


def test_a_numba_cell_text_runs_in_the_simulator_with_its_cell_lines():
    v = _variant("00-flip", "no_guard")
    r = kernellab.grade("00-flip", v.path.read_text(), speed=False)
    [f] = [f for f in r.findings if f.kind == "out_of_bounds"]
    line = f.cell_line
    assert line and v.path.read_text().splitlines()[line - 1].strip() in f.message, str(r)
    assert kernellab.grade("00-flip", solution_path("00-flip").read_text(), speed=False).passed


def test_a_cell_that_does_not_build_is_a_compile_error_finding():
    cu = solution_path("01-reverse").read_text().replace("in[n - 1 - i];", "in[n - 1 - i]")
    r = kernellab.grade("01-reverse", cu)
    assert not r.passed and [f.kind for f in r.findings] == ["compile_error"]
    assert "error" in r.findings[0].message and r.findings[0].hint
    py = solution_path("00-flip").read_text() + "\ndef broken(:\n"
    r = kernellab.grade("00-flip", py)
    assert [f.kind for f in r.findings] == ["compile_error"] and "SyntaxError" in r.findings[0].message
    r = kernellab.grade("00-flip", "import math\nraise ValueError('no')\n")
    assert [f.kind for f in r.findings] == ["compile_error"] and "ValueError at line 2" in r.findings[0].message
    assert kernel_from_cell(exercise("00-flip"), "x = 1\n") is None            # no kernel: the grader says so
    assert [f.kind for f in kernellab.grade("00-flip", "x = 1\n").findings] == ["no_kernel"]
