"""The house rules: analysis/ is pure, imports flow downward, and importing kernellab stays light."""
import ast
import pathlib
import subprocess
import sys

PKG = pathlib.Path(__file__).resolve().parents[1] / "kernellab"
ORDER = ["analysis", "compile", "run", "kernel", "teach", "notebook"]  # lower index = lower layer
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
    return ORDER.index(parts[1]) if parts[1] in ORDER else None


def test_analysis_is_pure_numpy():
    for path in (PKG / "analysis").rglob("*.py"):
        for mod, line in _imports(path):
            assert mod.split(".")[0] not in FORBIDDEN_IN_ANALYSIS, f"{path.name}:{line} imports {mod}"


def test_imports_flow_downward():
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        own = rel.parts[0].removesuffix(".py")
        if own not in ORDER:
            continue
        for mod, line in _imports(path, skip_repr_hooks=True):
            lay = _layer(mod)
            if lay is not None:
                assert lay <= ORDER.index(own), f"{rel}:{line} imports {mod} from a higher layer"


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
