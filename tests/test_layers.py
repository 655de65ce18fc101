"""The house rules: analysis/ is pure, imports flow downward, and importing kernellab stays light."""
import ast
import pathlib
import subprocess
import sys

PKG = pathlib.Path(__file__).resolve().parents[1] / "kernellab"
ORDER = ["render", "analysis", "compile", "run", "kernel", "teach", "notebook"]  # lower index = lower layer
# Modules outside the layer packages, by the layer they belong to (the shared helpers sit at the bottom).
LAYER_OF = {"kernel_numba": "kernel", "ops": "kernel", "report": "render", "errors": "render", "_version": "render"}
FORBIDDEN_IN_ANALYSIS = {"torch", "cupy", "numba", "IPython", "ipywidgets", "cuda", "matplotlib", "triton"}


def _walk_skipping_repr_hooks(tree):
    """Every node except those inside `_repr_*` methods: rich-display hooks may import presentation lazily."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("_repr_"):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _imports(path: pathlib.Path, skip_repr_hooks: bool = False):
    tree = ast.parse(path.read_text())
    for node in (_walk_skipping_repr_hooks(tree) if skip_repr_hooks else ast.walk(tree)):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package path
                parts = path.relative_to(PKG.parent).with_suffix("").parts[:-node.level]
                base = ".".join(parts + ((node.module,) if node.module else ()))
                names = [base] if node.module else [f"{base}.{a.name}" for a in node.names]
                for n in names:
                    yield n, node.lineno
            elif node.module:
                yield node.module, node.lineno


def _layer(module: str):
    parts = module.split(".")
    if parts[0] != "kernellab" or len(parts) < 2:
        return None
    own = LAYER_OF.get(parts[1], parts[1])
    return ORDER.index(own) if own in ORDER else None


def _own_layer(path: pathlib.Path):
    """The layer a file of the package belongs to (None for the package's __init__)."""
    name = path.relative_to(PKG).parts[0].removesuffix(".py")
    name = LAYER_OF.get(name, name)
    return name if name in ORDER else None


def test_analysis_is_pure_numpy():
    for path in (PKG / "analysis").rglob("*.py"):
        for mod, line in _imports(path):
            assert mod.split(".")[0] not in FORBIDDEN_IN_ANALYSIS, f"{path.name}:{line} imports {mod}"


def test_imports_flow_downward():
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        own = _own_layer(path)
        if own is None:
            continue
        for mod, line in _imports(path, skip_repr_hooks=True):
            lay = _layer(mod)
            if lay is not None:
                assert lay <= ORDER.index(own), f"{rel}:{line} imports {mod} from a higher layer"


def test_nothing_below_notebook_reaches_up_into_it():
    """Results below notebook/ render themselves from kernellab/render/: not even a `_repr_*` hook imports notebook/."""
    checked = 0
    for path in PKG.rglob("*.py"):
        own = _own_layer(path)
        if own is None or own == "notebook":
            continue
        checked += 1
        for mod, line in _imports(path):
            assert not mod.startswith("kernellab.notebook"), f"{path.relative_to(PKG)}:{line} imports {mod}"
    assert checked > 30


def test_render_needs_only_the_shared_helpers():
    """kernellab/render/ is the bottom layer: it may import kernellab.report and kernellab.errors, nothing else."""
    files = list((PKG / "render").rglob("*.py"))
    assert files
    for path in files:
        for mod, line in _imports(path):
            if mod.startswith("kernellab."):
                assert mod.split(".")[1] in ("report", "errors", "render"), f"{path.name}:{line} imports {mod}"


def test_run_results_render_without_notebook(monkeypatch):
    """A CheckReport and a BenchResult give their HTML with kernellab.notebook made unimportable."""
    import builtins

    from kernellab.run.measure.bench import BenchResult
    from kernellab.run.measure.check import CheckReport

    real_import = builtins.__import__

    def guarded(name, globals=None, locals=None, fromlist=(), level=0):
        if name.startswith("kernellab.notebook") or (level and globals and
                                                     globals.get("__package__", "").startswith("kernellab.notebook")):
            raise ImportError(f"presentation layer imported: {name}")
        return real_import(name, globals, locals, fromlist, level)

    check_report = CheckReport(passed=True, trials=1, max_abs_error=0.0, max_rel_error=0.0, mismatches=0, worst=(),
                               rtol=1e-5, atol=1e-8, precision="float32", tolerance="|d| <= atol + rtol |ref|",
                               message="all close", seed=0)
    bench = BenchResult(name="f", median_ms=1.0, min_ms=0.9, mean_ms=1.0, quantiles_ms=((0.25, 0.95), (0.75, 1.05)),
                        reps=3, rounds=1, device="Fake GPU", method="CUDA events")
    monkeypatch.setattr(builtins, "__import__", guarded)
    assert "check passed" in check_report._repr_html_()
    assert "Fake GPU" in bench._repr_html_()


def test_import_kernellab_pulls_no_heavy_modules():
    code = ("import sys, kernellab; bad = [m for m in ('torch', 'IPython', 'matplotlib', 'numba', 'cupy') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_every_public_name_resolves():
    import kernellab

    for name in kernellab.__all__:
        assert getattr(kernellab, name) is not None, name


def test_listing_the_exercises_stays_light():
    """kernellab.exercises() imports the exercise modules: NumPy only, no torch, IPython, numba or CuPy."""
    code = ("import sys, kernellab; kernellab.exercises(); bad = [m for m in ('torch', 'IPython', 'matplotlib', "
            "'numba', 'cupy') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
