"""Graded exercises on the CPU: the registry, the comparison's words, the result's displays, the spec's sanity, and for
every exercise the reference solution passing and each wrong variant failing with its finding (compile-level findings
for %%cuda exercises, everything for Numba exercises in the simulator)."""
import json
import pathlib

import numpy as np
import pytest

import kernellab
from exercises.solutions_lib import load_kernel, solution_path, variants
from kernellab.run.sim.cuda import compiler as cpu_compiler
from kernellab.run.sim.cuda.cpu import unsupported as cpu_unsupported
from kernellab import report
from kernellab.teach import (Exercise, ExerciseError, GradeResult, Launch, ceil_div, exercise, exercises, register,
                             spec_problems, unregister)
from kernellab.teach import compare as cmp
from kernellab.teach.grader import DEFAULT_HINTS

GPU = kernellab.has_gpu()
IDS = exercises().ids
TUTORIALS = ("00-puzzles", "01-first-kernel", "02-transpose-banks", "03-reductions-softmax", "04-layernorm",
             "07-fused-attention", "08-attention-backward", "09-attention-inference")


# --- the registry --------------------------------------------------------------------------------------------------

def test_exercises_lists_at_least_two_per_converted_tutorial():
    table = exercises()
    for tutorial in TUTORIALS:
        rows = [r for r in table if r[1] == tutorial]
        assert len(rows) >= 2, (tutorial, rows)
        assert all(r[0].startswith(tutorial[:3]) for r in rows)
    assert len(set(table.ids)) == len(table.ids)
    assert exercises("01").ids == exercises("01-first-kernel").ids
    assert set(exercises("01").ids) <= set(table.ids) and "01-reverse" in exercises("01").ids


def test_exercise_table_displays_as_text_html_and_report_json():
    table = exercises()
    bundle = table._repr_mimebundle_()
    j = bundle[report.REPORT_MIME]
    assert j["kind"] == "exercises" and [e["id"] for e in j["exercises"]] == list(table.ids)
    assert all(e["tests"] and e["title"] for e in j["exercises"])
    assert "01-reverse" in bundle["text/plain"] and "<code>01-reverse</code>" in bundle["text/html"]


def test_unknown_id_names_the_known_ones():
    with pytest.raises(ExerciseError, match="no exercise 'nope'.*01-reverse"):
        kernellab.grade("nope", None)


def test_registering_an_id_twice_is_an_error():
    ex = exercise("01-reverse")
    assert register(ex) is ex                      # the same object again is fine
    clone = Exercise(**{**ex.__dict__, "hints": dict(ex.hints), "title": "another"})
    with pytest.raises(ExerciseError, match="registered twice"):
        register(clone)


# tutorial 07's ldmatrix exercise compiles and emulates the largest kernels of all: in `make test`, not test-fast
QUICK_IDS = [i if i != "07-ldmatrix-swizzle" else pytest.param(i, marks=pytest.mark.slow) for i in IDS]


@pytest.mark.parametrize("ex_id", QUICK_IDS)
def test_every_exercise_is_sound(ex_id):
    """Its reference rejects an all-zero and an input-copy answer; its shapes start at 1 and its task is stated."""
    ex = exercise(ex_id)
    assert spec_problems(ex) == ()
    assert ex.task and ex.tests and ex.title and ex.kernel in ex.task + ex.kernel
    assert int(np.prod(ex.shapes[0])) == 1, "start with a single element"
    assert any(int(np.prod(s)) > 100_000 for s in ex.shapes), "end with a large shape"
    for shape in ex.shapes:
        assert ex.launch.configs(shape)


def test_a_spec_that_accepts_zeros_is_caught():
    ex = Exercise(id="t-lax", tutorial="99-test", title="lax", tests="t", kind="cuda", kernel="k",
                  signature="const float* x, float* y, int n",
                  make_args=lambda s, rng: (rng.standard_normal(s[0], dtype=np.float32), np.empty(s[0], np.float32),
                                            s[0]),
                  outputs=(1,), reference=lambda x, y, n: (x,), launch=Launch(grid=lambda s, b: 1), shapes=(1, 5),
                  atol=100.0)
    problems = spec_problems(ex)
    assert any("all-zero answer passes on every shape" in p for p in problems), problems


# --- the comparison's words -------------------------------------------------------------------------------------

def _poisoned(shape):
    return cmp.poison_(np.empty(shape, np.float32))


def test_unwritten_rows_and_columns_are_named():
    ref = np.arange(40 * 33, dtype=np.float32).reshape(40, 33) + 1
    out = ref.copy()
    out[17:32] = _poisoned((15, 33))
    [p] = cmp.compare(out, ref, "out", rtol=1e-5, atol=1e-6)
    assert p.kind == "unwritten" and p.message.startswith("rows 17..31 of `out` were never written"), p.message
    out = ref.copy()
    out[:, 32] = _poisoned(40)
    [p] = cmp.compare(out, ref, "out", rtol=1e-5, atol=1e-6)
    assert p.message.startswith("column 32 of `out` was never written"), p.message


def test_unwritten_elements_of_a_vector_are_named_by_run():
    ref = np.ones(1000, np.float32)
    out = ref.copy()
    out[256:] = _poisoned(744)
    [p] = cmp.compare(out, ref, "c", rtol=1e-5, atol=1e-6)
    assert p.message == "elements 256..999 of `c` (744 of 1,000) were never written"
    [p] = cmp.compare(_poisoned(1), np.ones(1, np.float32), "c", rtol=1e-5, atol=1e-6)
    assert p.message.startswith("no element of `c` was written")


def test_an_unwritten_integer_output_names_its_marker_not_a_nan():
    counts = cmp.poison_(np.empty(16, np.int32))
    [p] = cmp.compare(counts, np.arange(16, dtype=np.int32), "counts", rtol=1e-5, atol=1e-6)
    assert p.kind == "unwritten" and "the largest int32 (2,147,483,647) the grader put there" in p.message, p.message


def test_a_nan_the_kernel_wrote_is_wrong_not_unwritten():
    out = np.full(4, np.nan, np.float32)           # an ordinary NaN, not the grader's marked one
    [p] = cmp.compare(out, np.ones(4, np.float32), "c", rtol=1e-5, atol=1e-6)
    assert p.kind == "wrong_values"


def test_wrong_answers_are_named_by_their_pattern():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(50).astype(np.float32)
    ref = x[::-1].copy()
    shifted = np.concatenate([[0], ref[:-1]]).astype(np.float32)
    assert [p.kind for p in cmp.compare(shifted, ref, "out", rtol=1e-5, atol=1e-6)] == ["off_by_one"]
    assert [p.kind for p in cmp.compare(np.zeros(50, np.float32), ref, "out", rtol=1e-5, atol=1e-6)] == ["zero_output"]
    [p] = cmp.compare(x.copy(), ref, "out", rtol=1e-5, atol=1e-6, inputs={"in": x})
    assert p.kind == "input_copy" and "copy of `in`" in p.message
    bad = ref.copy()
    bad[7] += 1
    [p] = cmp.compare(bad, ref, "out", rtol=1e-5, atol=1e-6)
    assert p.kind == "wrong_values" and "1 of 50 elements" in p.message and "first at 7" in p.message


def test_unwritten_matrices_of_a_batch_are_named():
    ref = np.ones((4, 3, 5), np.float32)
    out = ref.copy()
    out[1:] = _poisoned((3, 3, 5))
    [p] = cmp.compare(out, ref, "out", rtol=1e-5, atol=1e-6)
    assert p.message.startswith("matrices 1..3 (along the first axis) of `out` were never written"), p.message


# --- the result -------------------------------------------------------------------------------------------------

def _kernel(ex_id, name=None):
    ex = exercise(ex_id)
    return load_kernel(ex, solution_path(ex_id) if name is None else
                       next(v.path for v in variants(ex_id) if v.name == name))


def test_grade_result_is_frozen_and_displays_everywhere():
    r = kernellab.grade("01-reverse", _kernel("01-reverse", "unguarded_read"))
    assert isinstance(r, GradeResult) and not r.passed and not bool(r)
    with pytest.raises(Exception):
        r.passed = True
    bundle = r._repr_mimebundle_()
    j = bundle[report.REPORT_MIME]
    assert j["kind"] == "grade" and j["passed"] is False and j["verdict"] == "failed"
    assert json.loads(json.dumps(j)) == j
    [f] = [f for f in r.findings if f.kind == "missing_guard"]
    assert f.hint == exercise("01-reverse").hints["missing_guard"]
    assert f.cell_line == 4             # the `extern "C"` line: numbered from 2 as in a %%cuda cell, after two comments
    assert "FAILED" in bundle["text/plain"] and "hint: guard `i < n`" in bundle["text/plain"]
    assert "missing_guard" in bundle["text/html"] and "guard <code>i &lt; n</code>" in bundle["text/html"]


def test_grade_never_raises_for_a_wrong_kernel():
    r = kernellab.grade("01-reverse", None)
    assert not r.passed and r.findings[0].kind == "no_kernel"
    r = kernellab.grade("01-reverse", 42)
    assert not r.passed and r.findings[0].kind == "wrong_kind"
    module = kernellab.compile_cuda('extern "C" __global__ void other(float* x) { x[0] = 1; }', arch="sm_90")
    r = kernellab.grade("01-reverse", module)
    assert [f.kind for f in r.findings] == ["no_kernel"] and "other" in r.findings[0].message
    r = kernellab.grade("01-reverse", module.other)
    assert [f.kind for f in r.findings] == ["signature"], r


def test_a_module_holding_the_kernel_is_graded_as_the_kernel():
    ex = exercise("01-reverse")
    module = kernellab.compile_cuda(solution_path("01-reverse").read_text(), arch="sm_90", first_line=2)
    r = kernellab.grade("01-reverse", module)
    assert r.kernel == ex.kernel and r.passed


def test_a_kernel_for_another_arch_is_a_finding():
    module = kernellab.compile_cuda(solution_path("01-reverse").read_text(), arch="sm_80", first_line=2)
    r = kernellab.grade("01-reverse", module.reverse)
    assert "arch" in [f.kind for f in r.findings]


def test_a_kernel_that_stores_only_through_global_atomics_stores():
    """sm_90 writes an atomicAdd whose result is unused as REDG: a global store, not "stores nothing"."""
    from kernellab.teach import grader

    k = kernellab.compile_cuda('extern "C" __global__ void count(int* c) { atomicAdd(c + threadIdx.x % 4, 1); }',
                               arch="sm_90").count
    assert "REDG" in k.sass and grader._STORE.search(k.sass)


# --- every exercise: the solution passes, the stub and each wrong variant fail with their finding ----------------

CUDA_IDS = [i for i in IDS if exercise(i).kind == "cuda"]


@pytest.mark.parametrize("ex_id", IDS)
def test_every_exercise_has_a_solution_and_three_wrong_variants(ex_id):
    assert solution_path(ex_id).read_text().splitlines()[0].split()[:3] == ["//", "exercise:", ex_id] or \
        solution_path(ex_id).read_text().splitlines()[0].split()[:3] == ["#", "exercise:", ex_id]
    found = variants(ex_id)
    assert len(found) >= 3, f"{ex_id}: {len(found)} wrong variants in tests/exercises/solutions"
    for v in found:
        assert all(k in DEFAULT_HINTS or k in exercise(ex_id).hints for k in v.kinds), v


@pytest.mark.parametrize("ex_id", QUICK_IDS)
def test_the_reference_solution_passes(ex_id):
    ex = exercise(ex_id)
    r = kernellab.grade(ex_id, load_kernel(ex, solution_path(ex_id)), speed=False)
    if ex.kind == "cuda" and not GPU and cpu_unsupported(solution_path(ex_id).read_text(), 2):
        # inline PTX the CPU path does not emulate: not run here, so never passed
        assert not r.passed and not r.findings and "need" in r.needs_gpu and "not run" in r.verdict, str(r)
        return
    assert r.passed, r
    if ex.kind == "cuda" and not GPU:
        assert not r.complete and "need a CUDA GPU" in r.needs_gpu
        assert r.verdict == "passed as far as it can be graded without a GPU"
        ran = [c for c in r.checks if c.what.endswith("(CPU)")]
        assert ran and ran[0].passed, str(r)        # it ran on the CPU path, on the shapes small enough for it


CPU_VARIANTS = [v for v in variants() if v.where == "cpu" or exercise(v.exercise).kind == "numba"]
GPU_ONLY_VARIANTS = [v for v in variants() if v.where == "gpu" and exercise(v.exercise).kind == "cuda"]
# The CUDA C++ variants "on gpu" run on the CPU path where no GPU is (kernellab.run.sim.cuda), unless they use
# inline PTX it does not emulate.
CPU_PATH_VARIANTS = [v for v in GPU_ONLY_VARIANTS if not cpu_unsupported(v.path.read_text(), 2)]
PTX_VARIANTS = [v for v in GPU_ONLY_VARIANTS if v not in CPU_PATH_VARIANTS]


def _first_of_each_exercise_quick(variants):
    """Each variant as a test; only the first of each exercise (but 07-ldmatrix-swizzle's, see QUICK_IDS) outside
    the slow set (`make test-fast`)."""
    seen = set()
    out = []
    for v in variants:
        quick = v.exercise not in seen and v.exercise != "07-ldmatrix-swizzle"
        out.append(pytest.param(v, id=str(v), marks=() if quick else pytest.mark.slow))
        seen.add(v.exercise)
    return out


@pytest.mark.parametrize("variant", _first_of_each_exercise_quick(CPU_VARIANTS))
def test_a_wrong_variant_fails_with_its_finding(variant):
    ex = exercise(variant.exercise)
    r = kernellab.grade(variant.exercise, load_kernel(ex, variant.path), speed=False)
    kinds = [f.kind for f in r.findings]
    assert not r.passed and set(variant.kinds) <= set(kinds), (variant, str(r))
    assert "internal" not in kinds and "spec" not in kinds


@pytest.mark.slow                 # a host build and some dozen CPU launches each: minutes for all of them
@pytest.mark.skipif(GPU, reason="with a GPU these run in full: tests/gpu/test_exercises_gpu.py")
@pytest.mark.skipif(cpu_compiler() is None, reason="no host C++ compiler for the CPU path (pip install ziglang)")
@pytest.mark.parametrize("variant", CPU_PATH_VARIANTS, ids=str)
def test_a_gpu_variant_fails_with_its_finding_on_the_cpu_path(variant):
    """Without a GPU the CUDA C++ kernel runs on the CPU path, on the shapes small enough for it: the finding a GPU
    gives is found there too."""
    ex = exercise(variant.exercise)
    r = kernellab.grade(variant.exercise, load_kernel(ex, variant.path), speed=False)
    kinds = [f.kind for f in r.findings]
    assert not r.passed and set(variant.kinds) <= set(kinds), (variant, str(r))
    assert "internal" not in kinds and "spec" not in kinds


@pytest.mark.skipif(GPU, reason="with a GPU these run in full: tests/gpu/test_exercises_gpu.py")
@pytest.mark.parametrize("variant", PTX_VARIANTS, ids=str)
def test_a_variant_the_cpu_path_cannot_run_is_not_passed(variant):
    """Inline PTX the CPU path does not emulate: the grade says what it could not run, and never passed."""
    ex = exercise(variant.exercise)
    r = kernellab.grade(variant.exercise, load_kernel(ex, variant.path), speed=False)
    assert not r.passed and not r.complete and r.needs_gpu, str(r)


@pytest.mark.parametrize("ex_id", CUDA_IDS)
def test_the_untouched_stub_fails(ex_id):
    """The stub as the notebook has it (solution signature, empty body) fails: nothing is stored."""
    ex = exercise(ex_id)
    src = solution_path(ex_id).read_text()
    head = src[: src.index("{", src.index("__global__")) + 1]     # through the kernel's brace (macros may hold "{")
    stub = head + "\n    // TODO\n}\n"
    r = kernellab.grade(ex_id, kernellab.compile_cuda(stub, arch=ex.arch, first_line=2)[ex.kernel])
    assert not r.passed and [f.kind for f in r.findings] == ["no_store"], str(r)


# --- the grader's run loop, in the simulator (what a GPU runs the same way) ---------------------------------------

@pytest.fixture
def numba_reverse():
    """A Numba version of 01-reverse, registered for the test."""
    base = exercise("01-reverse")
    ex = register(Exercise(id="t-reverse-numba", tutorial="99-test", title="reverse (Numba)", tests="t",
                           kind="numba", kernel="rev", signature="inp, out, n", make_args=base.make_args,
                           outputs=(1,), reference=base.reference,
                           launch=Launch(grid=lambda s, b: ceil_div(s[0], b), blocks=(32, 96)),
                           shapes=(1, 31, 257, 100_003), sim_shapes=(1, 31, 257), hints=dict(base.hints)))
    yield ex
    unregister(ex.id)


def _numba(src: str):
    """The kernel `rev` of a Numba cell; its lines are in linecache, as IPython keeps a cell's."""
    import linecache

    src = "from numba import cuda\n" + src
    name = f"<cell-{abs(hash(src))}>"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    ns = {}
    exec(compile(src, name, "exec"), ns)
    return ns["rev"]


def test_simulator_grading_names_each_cause(numba_reverse):
    good = _numba("@cuda.jit\ndef rev(inp, out, n):\n    i = cuda.grid(1)\n    if i < n:\n        out[i] = inp[n - 1 - i]\n")
    r = kernellab.grade("t-reverse-numba", good)
    assert r.passed and r.complete, str(r)
    assert any("launches on 3 shapes (simulator)" in c.what for c in r.checks)

    no_guard = _numba("@cuda.jit\ndef rev(inp, out, n):\n    i = cuda.grid(1)\n    out[i] = inp[n - 1 - i]\n")
    r = kernellab.grade("t-reverse-numba", no_guard)
    [f] = r.findings
    assert f.kind == "out_of_bounds" and f.cell_line == 5 and "out[i] = inp[n - 1 - i]" in f.message
    assert f.hint.startswith("guard `i < n`")

    fixed = _numba("@cuda.jit\ndef rev(inp, out, n):\n    i = cuda.blockIdx.x * 32 + cuda.threadIdx.x\n"
                   "    if i < n:\n        out[i] = inp[n - 1 - i]\n")
    r = kernellab.grade("t-reverse-numba", fixed)
    kinds = {f.kind: f for f in r.findings}
    assert kinds["launch_config"].message == "right with block 32 on every shape, but wrong with block 96"
    assert "elements 160..256 of `out`" in kinds["unwritten"].message

    off = _numba("@cuda.jit\ndef rev(inp, out, n):\n    i = cuda.grid(1)\n    if i < n - 1:\n"
                 "        out[i] = inp[n - 2 - i]\n")
    r = kernellab.grade("t-reverse-numba", off)
    assert {"off_by_one", "unwritten"} <= {f.kind for f in r.findings}, str(r)


def test_fresh_inputs_each_grading_and_a_seed_reproduces(numba_reverse):
    good = _numba("@cuda.jit\ndef rev(inp, out, n):\n    i = cuda.grid(1)\n    if i < n:\n        out[i] = inp[n - 1 - i]\n")
    a, b = kernellab.grade("t-reverse-numba", good), kernellab.grade("t-reverse-numba", good)
    assert a.seed != b.seed
    assert kernellab.grade("t-reverse-numba", good, seed=7).seed == 7


def test_a_grader_bug_is_a_failed_verdict_not_an_exception(numba_reverse, monkeypatch):
    from kernellab.teach import grader

    def boom(self, k, simulated):
        raise RuntimeError("boom")

    monkeypatch.setattr(grader._Grading, "run_all", boom)
    good = _numba("@cuda.jit\ndef rev(inp, out, n):\n    i = cuda.grid(1)\n    if i < n:\n        out[i] = inp[n - 1 - i]\n")
    r = kernellab.grade("t-reverse-numba", good)
    assert not r.passed and r.findings[-1].kind == "internal" and "boom" in r.findings[-1].message


# --- the GPU path with a fake GPU: launches emulated in NumPy, compute-sanitizer reports from captured text -------

MEMCHECK_OOB = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at reverse+0xb0 in cell.cu:6
=========     by thread (1,0,0) in block (8,0,0)
=========     Access to 0x7f5c94800404 is out of bounds
=========     and is 0 bytes after the nearest allocation at 0x7f5c94800000 of size 1,028 bytes
=========
========= ERROR SUMMARY: 1 error
"""


@pytest.fixture
def fake_gpu(monkeypatch):
    """A usable "GPU": arrays stay NumPy, and the test gives the kernel's launch and sanitize."""
    from kernellab.run.launch import device
    from kernellab.teach import grader

    monkeypatch.setattr(device, "gpu_status", lambda: (True, "1 GPU(s) (fake)"))
    monkeypatch.setattr(grader, "_to_device", lambda args: tuple(args))
    monkeypatch.setattr(grader, "_to_host", lambda a: a)

    def make(emulate, reports=None):
        """The reverse solution's Kernel, launching `emulate(grid, block, *args)` and sanitizing to `reports`."""
        from kernellab.run.nvtools.sanitize import report_from_text

        k = _kernel("01-reverse")
        launches = []

        def launch(grid, block, *args, shared_bytes=0, isolate=None, timeout_s=None, **kw):
            launches.append((grid, block, isolate))
            emulate(grid, block, *args)

        def sanitize(grid, block, *args, shared_bytes=0, tool="memcheck", **kw):
            k.sanitize_calls.append((tool, kw.get("pool")))
            return report_from_text((reports or {}).get(tool, "========= ERROR SUMMARY: 0 errors\n"), tool=tool,
                                    kernel="reverse")

        k.launch, k.sanitize, k.launches, k.sanitize_calls = launch, sanitize, launches, []
        return k
    return make


def _reverse_threads(base):
    """A reverse kernel as NumPy: thread i = base(block index, blockDim) + threadIdx, guarded by i < n."""
    def emulate(grid, block, x, out, n):
        for b in range(grid[0]):
            for t in range(block[0]):
                i = base(b, block[0]) + t
                if i < n:
                    out[i] = x[n - 1 - i]
    return emulate


def test_gpu_grading_runs_every_config_isolated_and_passes_a_right_kernel(fake_gpu):
    k = fake_gpu(_reverse_threads(lambda b, dim: b * dim))
    ex = exercise("01-reverse")
    ex_small = Exercise(**{**ex.__dict__, "hints": dict(ex.hints), "id": "t-rev-small", "shapes": (1, 31, 257)})
    register(ex_small)
    try:
        r = kernellab.grade("t-rev-small", k)
    finally:
        unregister("t-rev-small")
    assert r.passed and r.complete and not r.needs_gpu, str(r)
    # 3 shapes x 4 blocks, then the determinism run's two launches (outputs zeroed, then filled)
    assert len(k.launches) == 3 * 4 + 2 and all(iso is True for _, _, iso in k.launches)
    assert [c.what for c in r.checks][-2:] == ["memcheck", "initcheck"]


def test_gpu_grading_runs_its_tools_one_shot_unless_the_pool_is_asked_for(fake_gpu, monkeypatch):
    """The graders' sanitizer stage runs each tool one-shot (a process per run) by default; KERNELLAB_SANITIZER_POOL=1
    asks for the warm compute-sanitizer of each tool (kernellab.run.nvtools.sanitize_pool: a context per worker and
    tool, not per submission); 0 is one-shot too."""
    ex = exercise("01-reverse")
    register(Exercise(**{**ex.__dict__, "hints": dict(ex.hints), "id": "t-rev-small", "shapes": (1, 31)}))
    calls = {}
    try:
        for setting in (None, "1", "0"):
            if setting is None:
                monkeypatch.delenv("KERNELLAB_SANITIZER_POOL", raising=False)
            else:
                monkeypatch.setenv("KERNELLAB_SANITIZER_POOL", setting)
            k = fake_gpu(_reverse_threads(lambda b, dim: b * dim))
            assert kernellab.grade("t-rev-small", k).passed
            calls[setting] = k.sanitize_calls
    finally:
        unregister("t-rev-small")
    assert calls[None] == [("memcheck", False), ("initcheck", False)]
    assert calls["1"] == [("memcheck", True), ("initcheck", True)]
    assert calls["0"] == [("memcheck", False), ("initcheck", False)]


def test_gpu_grading_turns_sanitizer_reports_into_findings_at_cell_lines(fake_gpu):
    k = fake_gpu(_reverse_threads(lambda b, dim: b * dim),
                 reports={"memcheck": MEMCHECK_OOB})
    ex = exercise("01-reverse")
    register(Exercise(**{**ex.__dict__, "hints": dict(ex.hints), "id": "t-rev-small", "shapes": (1, 31, 257)}))
    try:
        r = kernellab.grade("t-rev-small", k, seed=1)
    finally:
        unregister("t-rev-small")
    [f] = r.findings
    assert f.kind == "out_of_bounds" and f.cell_line == 6 and f.message.startswith("out of bounds write at cell line 6")
    assert "(thread (1, 0, 0) of block (8, 0, 0))" in f.message and f.hint == exercise("01-reverse").hints[
        "out_of_bounds"]
    assert not r.passed and r.complete


def test_gpu_grading_names_a_block_size_assumption(fake_gpu):
    k = fake_gpu(_reverse_threads(lambda b, dim: b * 256))
    ex = exercise("01-reverse")
    register(Exercise(**{**ex.__dict__, "hints": dict(ex.hints), "id": "t-rev-small", "shapes": (1, 31, 257, 1000)}))
    try:
        r = kernellab.grade("t-rev-small", k)
    finally:
        unregister("t-rev-small")
    kinds = {f.kind: f for f in r.findings}
    # a 1024-thread block covers every shape up to 1000 with its block 0, where the assumption does no harm
    assert kinds["launch_config"].message == "right with block 256, 1024 on every shape, but wrong with block 32, 96"
    assert "unwritten" in kinds


def test_gpu_grading_stops_at_the_first_fault(fake_gpu):
    from kernellab.run.launch.worker import IsolatedLaunchError

    def fault(grid, block, *args):
        raise IsolatedLaunchError("reverse faulted in the isolated worker: an illegal memory access", status="fault")

    k = fake_gpu(fault, reports={"memcheck": MEMCHECK_OOB})
    r = kernellab.grade("01-reverse", k)
    assert [f.kind for f in r.findings] == ["out_of_bounds", "fault"], str(r)     # the line first
    assert len(k.launches) == 1 and any("stopped at the first fault" in n for n in r.notes)


def test_gpu_grading_reports_a_race_with_its_lines(fake_gpu, monkeypatch):
    from kernellab.teach import grader

    race = (pathlib.Path(__file__).parent / "fixtures" / "captured" / "sanitizer_racecheck.txt").read_text()
    ex = exercise("02-transpose-batched")
    k = load_kernel(ex, solution_path(ex.id))
    monkeypatch.setattr(k, "launch", lambda grid, block, x, out, b, r_, c, **kw: out.__setitem__(
        slice(None), np.ascontiguousarray(x.transpose(0, 2, 1))), raising=False)
    from kernellab.run.launch import device
    from kernellab.run.nvtools.sanitize import report_from_text

    monkeypatch.setattr(device, "gpu_status", lambda: (True, "fake"))
    monkeypatch.setattr(grader, "_to_device", lambda args: tuple(args))
    monkeypatch.setattr(grader, "_to_host", lambda a: a)
    monkeypatch.setattr(k, "sanitize", lambda *a, tool="memcheck", **kw: report_from_text(
        race if tool == "racecheck" else "", tool=tool, kernel=k.name), raising=False)
    register(Exercise(**{**ex.__dict__, "hints": dict(ex.hints), "id": "t-batched-small", "shapes": ex.shapes[:3]}))
    try:
        r = kernellab.grade("t-batched-small", k, speed=False)
    finally:
        unregister("t-batched-small")
    [f] = r.findings
    assert f.kind == "race" and f.message.startswith("race at cell line 16, between threads (write / write"), str(r)
    assert f.hint == ex.hints["race"]
    assert {"memcheck", "racecheck", "synccheck"} <= {c.what for c in r.checks}


# --- a Numba exercise with a shared tile: compile-level checks after the first launch, the simulator's racecheck ----

TILE_NUMBA = '''
import numba
from numba import cuda


@cuda.jit
def tposed(inp, out):
    tile = cuda.shared.array((32, 33), numba.float32)
    rows, cols = inp.shape
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    c, r = cuda.blockIdx.x * 32 + tx, cuda.blockIdx.y * 32 + ty
    for j in range(0, 32, 8):
        if r + j < rows and c < cols:
            tile[ty + j, tx] = inp[r + j, c]
    cuda.syncthreads()
    c, r = cuda.blockIdx.y * 32 + tx, cuda.blockIdx.x * 32 + ty
    for j in range(0, 32, 8):
        if r + j < cols and c < rows:
            out[r + j, c] = tile[tx, ty + j]
'''


@pytest.fixture
def numba_tile():
    base = exercise("02-transpose-naive")

    def grid(shape, block):
        return ceil_div(shape[1], 32), ceil_div(shape[0], 32)

    ex = register(Exercise(id="t-tile-numba", tutorial="99-test", title="tile (Numba)", tests="t", kind="numba",
                           kernel="tposed", signature="inp, out",
                           make_args=lambda s, rng: base.make_args(s, rng)[:2], outputs=(1,),
                           reference=lambda x, out: (x.T.copy(),), launch=Launch(grid=grid, blocks=((32, 8),)),
                           shapes=((1, 1), (31, 33), (1000, 777)), sim_shapes=((1, 1), (31, 33), (33, 31)),
                           needs_shared=True, needs_barrier=True))
    yield ex
    unregister(ex.id)


def _numba_cell(src: str, name: str):
    import linecache

    filename = f"<cell-{abs(hash(src))}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns = {}
    exec(compile(src, filename, "exec"), ns)
    return ns[name]


def test_numba_tile_is_checked_in_its_sass_after_the_simulated_runs(numba_tile):
    r = kernellab.grade("t-tile-numba", _numba_cell(TILE_NUMBA, "tposed"))
    assert r.passed and r.complete, str(r)
    whats = [c.what for c in r.checks]
    assert "goes through shared memory (STS and LDS)" in whats and "has a barrier (BAR.SYNC)" in whats
    no_barrier = _numba_cell(TILE_NUMBA.replace("    cuda.syncthreads()\n", ""), "tposed")
    r = kernellab.grade("t-tile-numba", no_barrier)
    assert "missing_barrier" in [f.kind for f in r.findings], str(r)


def test_the_simulators_racecheck_is_used_through_sanitize_where_kernellab_has_it(numba_tile, monkeypatch):
    """The simulator's race detector and barrier check (kernellab.run.sim.race) grade a simulated kernel's barriers in
    one simulated launch, as racecheck and synccheck do on a GPU: a clean kernel's grade says both ran clean; a report
    with a race and a divergent barrier becomes a race finding with both lines and a barrier finding."""
    from kernellab.kernel_numba import NumbaKernel
    from kernellab.run.findings import Finding as SanFinding
    from kernellab.run.findings import Location, SanitizerReport, combine

    k = kernellab.numba_kernel(_numba_cell(TILE_NUMBA, "tposed"), simulate=True)
    r = kernellab.grade("t-tile-numba", k)
    assert r.passed and not any("was not run" in n or "were not run" in n for n in r.notes), r.notes
    assert "racecheck: clean" in str(r) and "synccheck: clean" in str(r), str(r)

    calls = []

    def sanitize(self, grid, block, *args, shared_bytes=0, tool="memcheck", **kw):
        calls.append((tool, grid, block))
        race = SanFinding(tool="racecheck", kind="race", message="shared-memory data race", where=Location(
            function="tposed", line=13, cell_line=13), other=Location(function="tposed", line=17, cell_line=17),
            access="Write", other_access="Read")
        sync = SanFinding(tool="synccheck", kind="barrier", message="Divergent thread(s) in warp",
                          where=Location(function="tposed", line=14, cell_line=14))
        return combine([SanitizerReport(tool="racecheck", kernel="tposed", findings=(race,), error_count=1),
                        SanitizerReport(tool="synccheck", kernel="tposed", findings=(sync,), error_count=1)])

    monkeypatch.setattr(NumbaKernel, "sanitize", sanitize)
    r = kernellab.grade("t-tile-numba", k)
    race, barrier = r.findings
    assert race.kind == "race" and race.message.startswith("race between cell line 13 and line 17 (write / read")
    assert race.cell_line == 13 and "(simulator)" in race.where
    assert barrier.kind == "barrier" and barrier.cell_line == 14 and "Divergent thread(s) in warp" in barrier.message
    assert {c.what: c.detail for c in r.checks if c.what in ("racecheck", "synccheck")} == \
        {"racecheck": "1 problem", "synccheck": "1 problem"}
    assert calls == [("racecheck+synccheck+initcheck", (2, 1, 1), (32, 8, 1))]   # sanitizer shape 31 x 33: 2 x 1 tiles


def test_a_barrier_only_some_threads_reach_fails_in_the_simulator():
    """synccheck in the simulator: a col_sums whose barrier sits inside `if c < cols:` computes the right sums there,
    yet the threads past the last column skip a barrier the others of their warp wait at."""
    ex = exercise("00-col-sums")
    [v] = [v for v in variants("00-col-sums") if v.name == "barrier_in_if"]
    r = kernellab.grade("00-col-sums", load_kernel(ex, v.path), seed=0)
    assert any(c.what.startswith("4 launches") and c.passed for c in r.checks), str(r)
    [f] = r.findings
    assert f.kind == "barrier" and "Divergent thread(s) in warp" in f.message and "cuda.syncthreads()" in f.message
    assert f.hint == ex.hints["barrier"]


# --- hostile kernels: the grader names the attack (docs/GRADING.md's threat model) --------------------------------

INITCHECK_UNINIT = """========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at reverse+0x90 in cell.cu:6
=========     by thread (3,0,0) in block (0,0,0)
=========     Address 0x7f5c94800404
=========
========= ERROR SUMMARY: 1 error
"""


def _grade_small(k):
    ex = exercise("01-reverse")
    register(Exercise(**{**ex.__dict__, "hints": dict(ex.hints), "id": "t-rev-hostile", "shapes": (31, 257),
                         "speed": None}))
    try:
        return kernellab.grade("t-rev-hostile", k)
    finally:
        unregister("t-rev-hostile")


def test_a_kernel_that_writes_into_its_input_is_named_on_the_gpu_path(fake_gpu):
    right = _reverse_threads(lambda b, dim: b * dim)

    def scribbles(grid, block, x, out, n):
        right(grid, block, x, out, n)
        x[0] = 0.0
    r = _grade_small(fake_gpu(scribbles))
    assert not r.passed and "input_mutated" in [f.kind for f in r.findings], str(r)


def test_a_kernel_that_writes_into_its_input_is_named_in_the_simulator(numba_reverse):
    src = ("@cuda.jit\ndef rev(inp, out, n):\n    i = cuda.grid(1)\n    if i < n:\n        out[i] = inp[n - 1 - i]\n"
           "        cuda.syncthreads()\n        inp[i] = 0.0\n")
    r = kernellab.grade("t-reverse-numba", _numba(src))
    assert not r.passed and "input_mutated" in [f.kind for f in r.findings], str(r)


def test_a_kernel_right_only_on_nan_filled_output_is_named_nondeterministic(fake_gpu):
    right = _reverse_threads(lambda b, dim: b * dim)

    def reads_before_writing(grid, block, x, out, n):
        prior = out.copy()
        right(grid, block, x, out, n)
        keep = ~np.isnan(prior)
        out[keep] = prior[keep]           # "uninitialised" memory that happened to hold the grader's NaN fill
    r = _grade_small(fake_gpu(reads_before_writing))
    assert not r.passed and [f.kind for f in r.findings] == ["nondeterministic"], str(r)
    assert _grade_small(fake_gpu(right)).passed


def test_initcheck_on_the_gpu_names_a_read_of_memory_never_written(fake_gpu):
    r = _grade_small(fake_gpu(_reverse_threads(lambda b, dim: b * dim), {"initcheck": INITCHECK_UNINIT}))
    assert not r.passed and [f.kind for f in r.findings] == ["uninitialized"], str(r)
    assert any(c.what == "initcheck" and not c.passed for c in r.checks)


def test_an_impossible_speed_is_a_finding_and_never_recorded(fake_gpu, monkeypatch):
    from kernellab.teach import grader as grader_mod
    from kernellab.run.measure.bench import BenchResult
    from kernellab.run.measure.integrity import IntegrityFinding

    def fake_bench(fn, inputs, baselines=None, **kw):
        base = BenchResult("torch.add", 1.0, 1.0, 1.0, ((0.5, 1.0),), 10, 5, "fake", "fake")
        flag = IntegrityFinding("impossible_speed", "0.001 us is 1000 x faster than the roofline allows")
        return BenchResult(kw.get("name", "k"), 0.001, 0.001, 0.001, ((0.5, 0.001),), 10, 5, "fake", "fake",
                           baselines=(base,), findings=(flag,))

    monkeypatch.setattr(grader_mod, "bench", fake_bench)
    from kernellab.teach.spec import SpeedBar

    ex = exercise("01-reverse")
    bar = SpeedBar(fraction=0.5, baseline="a copy", run_baseline=lambda *a: None, shape=(257,),
                   bytes=lambda shape: 8 * shape[0])
    register(Exercise(**{**ex.__dict__, "hints": dict(ex.hints), "id": "t-rev-speed", "shapes": (31, 257),
                         "speed": bar}))
    try:
        r = kernellab.grade("t-rev-speed", fake_gpu(_reverse_threads(lambda b, dim: b * dim)))
    finally:
        unregister("t-rev-speed")
    assert not r.passed and [f.kind for f in r.findings] == ["impossible_speed"], str(r)
    assert r.speed is None and any("never ranked" in n for n in r.notes)


def test_grade_many_reports_each_rejected_submission_with_its_finding(numba_reverse):
    good = "@cuda.jit\ndef rev(inp, out, n):\n    i = cuda.grid(1)\n    if i < n:\n        out[i] = inp[n - 1 - i]\n"
    scribbler = good + "        cuda.syncthreads()\n        inp[i] = 0.0\n"
    unguarded = "@cuda.jit\ndef rev(inp, out, n):\n    i = cuda.grid(1)\n    out[i] = inp[n - 1 - i]\n"
    table = kernellab.grade_many("t-reverse-numba", {"ada": _numba(good), "bob": _numba(scribbler),
                                                     "cy": _numba(unguarded)}, progress=False)
    assert [r.status for r in table.rows] == ["passed", "failed", "failed"]
    ada, bob, cy = table.rows
    assert ada.kinds == () and ada.finding is None and ada.ranked
    assert "input_mutated" in bob.kinds and not bob.ranked and cy.finding == "out_of_bounds"
    text = str(table)
    assert "input_mutated" in text.split("bob")[1].splitlines()[0] and "out_of_bounds: out of bounds" in text
    assert table.to_json()["rows"][2]["finding"] == "out_of_bounds"


def test_a_kernel_that_computes_only_on_its_first_launch_is_named_after_timing(fake_gpu, monkeypatch):
    from kernellab.teach import grader as grader_mod
    from kernellab.run.measure.bench import BenchResult, Speedup
    from kernellab.teach.spec import SpeedBar

    def fake_bench(fn, inputs, baselines=None, **kw):
        for _ in range(3):
            fn(*inputs)                   # the "timed" launches
        for b in (baselines or {}).values():
            b(*inputs)
        base = BenchResult("a copy", 1.0, 1.0, 1.0, ((0.5, 1.0),), 10, 5, "fake", "fake")
        return BenchResult(kw.get("name", "k"), 0.5, 0.5, 0.5, ((0.5, 0.5),), 10, 5, "fake", "fake",
                           baselines=(base,), speedups=(Speedup("a copy", 2.0, 2.0, 2.0, 5),))

    monkeypatch.setattr(grader_mod, "bench", fake_bench)
    right = _reverse_threads(lambda b, dim: b * dim)
    launched = {"timing": 0}

    def first_launch_only(grid, block, x, out, n):
        if n == 4096:                     # the speed bar's shape: a `__device__` flag skips every later launch
            launched["timing"] += 1
            if launched["timing"] > 1:
                return
        right(grid, block, x, out, n)

    def copy_baseline(x, out, n):
        out[:] = x[::-1]

    ex = exercise("01-reverse")
    bar = SpeedBar(fraction=0.5, baseline="a copy", run_baseline=copy_baseline, shape=(4096,))
    register(Exercise(**{**ex.__dict__, "hints": dict(ex.hints), "id": "t-rev-first", "shapes": (31, 257),
                         "speed": bar}))
    try:
        r = kernellab.grade("t-rev-first", fake_gpu(first_launch_only))
        launched["timing"] = 0
        honest = kernellab.grade("t-rev-first", fake_gpu(right))
    finally:
        unregister("t-rev-first")
    assert not r.passed and [f.kind for f in r.findings] == ["cached_result"], str(r)
    assert r.speed is None
    assert honest.passed and honest.speed is not None, str(honest)


def test_the_output_comparison_in_pieces_flags_what_the_whole_array_test_flags():
    """compare.mismatches on an array over a piece (2**20 elements): bit-equal outputs have no mismatch, and
    otherwise the piecewise test flags exactly the elements the one-pass test does (NaN where the reference is
    finite, Inf where it is Inf, a value out of tolerance, one just inside it); same_bytes tells a changed input by
    its bytes (a flipped sign of zero, a NaN's payload) and a shape or dtype apart."""
    from kernellab.teach import compare as C

    rng = np.random.default_rng(5)
    ref = rng.standard_normal((185_003, 17)).astype(np.float32)             # 3,145,051 elements: 4 pieces
    ref[0, 0], ref[0, 1], ref[0, 2] = np.inf, -np.inf, np.nan
    assert not C.mismatches(ref.copy(), ref, 1e-5, 1e-5).any()
    out = ref.copy()
    flat = out.reshape(-1)
    flat[[5, 2_000_000, flat.size - 1]] = [np.nan, 7.0, flat[-1] * np.float32(1 + 2e-6)]   # the last: inside
    out[0, 1] = np.inf
    bad = C.mismatches(out, ref, 1e-5, 1e-5)
    assert np.array_equal(bad, C._mismatches(out, ref, 1e-5, 1e-5))
    assert sorted(np.flatnonzero(bad)) == [1, 5, 2_000_000]
    zero = np.zeros(8, np.float32)
    assert C.same_bytes(zero, zero.copy()) and not C.same_bytes(zero, -zero)
    nan = np.full(4, np.nan, np.float32)
    other = nan.copy()
    other.view(np.uint32)[0] ^= 1
    assert not C.same_bytes(nan, other) and not C.same_bytes(zero, zero.reshape(2, 4))
    assert not C.same_bytes(zero, zero.astype(np.float64))


def test_the_reference_reads_its_inputs_in_place_and_fills_copies_of_the_outputs():
    """grader._reference_args: the inputs as read-only views of the launch's own arrays (no copy of a large input
    per launch; a reference writing into one raises), the outputs as copies (a reference may fill and return one,
    and the launch's output is then poisoned)."""
    from kernellab.teach import grader

    x, out = np.arange(6, dtype=np.float32), np.zeros(6, np.float32)
    rx, rout, n = grader._reference_args((x, out, 6), outputs=(1,))
    assert np.shares_memory(rx, x) and not rx.flags.writeable and n == 6
    assert not np.shares_memory(rout, out) and rout.flags.writeable and np.array_equal(rout, out)
    with pytest.raises(ValueError):
        rx[0] = 1.0


def test_a_signalling_nan_in_an_output_is_a_mismatch_without_a_warning():
    """An output element holding a signalling NaN (bits a kernel copied as they were) is out of tolerance like any NaN,
    and the float64 cast of the tolerance test does not turn it into a RuntimeWarning."""
    import warnings

    from kernellab.teach import compare as C

    out = np.array([0x7FA00000, 0], dtype=np.uint32).view(np.float32)       # a signalling NaN, then 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bad = C.mismatches(out, np.array([1.0, 0.0], np.float32), 1e-5, 1e-5)
    assert bad.tolist() == [True, False]
