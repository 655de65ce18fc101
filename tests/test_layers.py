"""The house rules: analysis/ is pure, imports flow downward, and importing kernellab stays light."""
import ast
import dataclasses
import pathlib
import subprocess
import sys

PKG = pathlib.Path(__file__).resolve().parents[1] / "kernellab"
# The house, lowest first: a unit imports only from units below it (or from itself). run/ is split by job: the finding
# types, fan-out, launching, the simulator, NVIDIA's tools, measuring; the hub modules kernel.py and kernel_numba.py
# sit above run/ and below teach/ and notebook/, with ops.py (a launcher as a PyTorch operator).
ORDER = ["render", "analysis", "compile", "run.findings", "run.fanout", "run.launch", "run.sim", "run.nvtools",
         "run.measure", "kernel", "kernel_numba", "ops", "teach", "notebook"]
# Modules outside the layer packages, by the unit they belong to (the shared helpers sit at the bottom).
UNIT_OF = {"report": "render", "errors": "render", "_version": "render"}
FORBIDDEN_IN_ANALYSIS = {"torch", "cupy", "numba", "IPython", "ipywidgets", "cuda", "matplotlib", "triton"}


@dataclasses.dataclass(frozen=True)
class House:
    """A package and its layering: `order` lists units (dotted paths under the package), lowest first."""

    root: pathlib.Path                  # the package's directory
    order: tuple[str, ...]
    unit_of: dict = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.root.name

    def files(self):
        return sorted(p for p in self.root.rglob("*.py") if "labextension" not in p.parts)

    def module(self, path: pathlib.Path) -> str:
        parts = path.relative_to(self.root.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def unit(self, module: str):
        """The unit a module of the package belongs to (its longest prefix in `order`), or None."""
        parts = module.split(".")
        if parts[0] != self.name or len(parts) < 2:
            return None
        for n in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[1:n + 1])
            if prefix in self.order:
                return prefix
            if prefix in self.unit_of:
                return self.unit_of[prefix]
        return None

    def rank(self, module: str):
        u = self.unit(module)
        return None if u is None else self.order.index(u)


HOUSE = House(PKG, tuple(ORDER), UNIT_OF)


def _walk_skipping_repr_hooks(tree):
    """Every node except those inside `_repr_*` methods: rich-display hooks may import presentation lazily."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("_repr_"):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(node: ast.ImportFrom, path: pathlib.Path, root: pathlib.Path) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against the file's package)."""
    if not node.level:
        return node.module or ""
    parts = path.relative_to(root.parent).with_suffix("").parts[:-node.level]
    return ".".join(parts + ((node.module,) if node.module else ()))


def _imports(path: pathlib.Path, skip_repr_hooks: bool = False, root: pathlib.Path = PKG):
    """(module, line) for every import in the file, module level and inside functions; `from a import b` gives a.b
    where b is a module of the package, else a."""
    tree = ast.parse(path.read_text())
    for node in (_walk_skipping_repr_hooks(tree) if skip_repr_hooks else ast.walk(tree)):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, path, root)
            for a in node.names:
                sub = f"{base}.{a.name}"
                is_module = (root.parent / sub.replace(".", "/")).with_suffix(".py").exists() or \
                    (root.parent / sub.replace(".", "/")).is_dir()
                yield (sub if is_module else base), node.lineno


def _string_imports(path: pathlib.Path, house: House):
    """(module, line) for imports spelled as strings: importlib.import_module / __import__ with a literal, and string
    constants that are exactly a module of the package ("pkg.mod" or "pkg.mod:attr", as preload lists and
    "module:function" settings are), wherever they are handed to an import later."""
    tree = ast.parse(path.read_text())
    modules = {house.module(p) for p in house.files()}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                found[(str(node.args[0].value), node.lineno)] = None
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.partition(":")[0]
            if text in modules and text != house.name:
                found[(text, node.lineno)] = None
    return sorted(found, key=lambda f: f[1])


def upward_imports(house: House) -> list[str]:
    """Every import (statement or string) from a unit above the importing file's own."""
    bad = []
    for path in house.files():
        own = house.rank(house.module(path))
        if own is None:
            continue
        found = [(m, line, "imports") for m, line in _imports(path, root=house.root)]
        found += [(m, line, "imports by string") for m, line in _string_imports(path, house)]
        for mod, line, how in found:
            lay = house.rank(mod)
            if lay is not None and lay > own:
                bad.append(f"{path.relative_to(house.root)}:{line} {how} {mod} from a higher layer "
                           f"({house.unit(mod)} above {house.order[own]})")
    return bad


def _cycles(graph: dict) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def import_cycles(house: House) -> list[str]:
    """Cycles between modules, and between packages (each package with the modules under it), through any import:
    module level, inside a function, or by string."""
    modules = {house.module(p): p for p in house.files()}
    mod_graph, pkg_graph = {}, {}
    for mod, path in modules.items():
        found = [m for m, _ in _imports(path, root=house.root)] + [m for m, _ in _string_imports(path, house)]
        targets = {m for m in found if m in modules and m != mod}
        mod_graph[mod] = targets
        # a package edge: the innermost different packages of the two modules under their common parent
        for t in targets:
            a, b = mod.split("."), t.split(".")
            common = 0
            while common < min(len(a), len(b)) and a[common] == b[common]:
                common += 1
            if common < len(a) - 1 and common < len(b):    # a module of a subpackage imports outside that subpackage
                src, dst = ".".join(a[:common + 1]), ".".join(b[:common + 1])
                if src != dst:
                    pkg_graph.setdefault(src, set()).add(dst)
            elif common < len(b) - 1 and common < len(a):  # a module imports into a sibling subpackage
                src, dst = ".".join(a[:common + 1]), ".".join(b[:common + 1])
                if src != dst:
                    pkg_graph.setdefault(src, set()).add(dst)
    return [f"module cycle: {' <-> '.join(c)}" for c in _cycles(mod_graph)] + \
        [f"package cycle: {' <-> '.join(c)}" for c in _cycles(pkg_graph)]


def private_imports(house: House) -> list[str]:
    """`_private` names one module of the package takes from another: `from m import _x`, or `m._x` on an imported
    module."""
    modules = {house.module(p) for p in house.files()}
    bad = []
    for path in house.files():
        tree = ast.parse(path.read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(node, path, house.root)
                if base.split(".")[0] != house.name:
                    continue
                for a in node.names:
                    if f"{base}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{base}.{a.name}"
                    elif a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{path.relative_to(house.root)}:{node.lineno} imports {a.name} from {base}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == house.name and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                bad.append(f"{path.relative_to(house.root)}:{node.lineno} uses {node.value.id}.{node.attr} of "
                           f"{aliases[node.value.id]}")
    return bad


def _layer(module: str):
    return HOUSE.rank(module)


def _own_layer(path: pathlib.Path):
    """The unit a file of the package belongs to (None for the package's __init__)."""
    return HOUSE.unit(HOUSE.module(path))


def test_analysis_is_pure_numpy():
    for path in (PKG / "analysis").rglob("*.py"):
        for mod, line in _imports(path):
            assert mod.split(".")[0] not in FORBIDDEN_IN_ANALYSIS, f"{path.name}:{line} imports {mod}"


def test_every_module_has_a_layer():
    """Every module of kernellab (the hubs kernel.py, kernel_numba.py and render/ included) sits in one unit of the
    house, so the checks below cover it; only the package's own __init__ files (the lazy public names, run/'s
    docstring) stand outside."""
    outside = [HOUSE.module(p) for p in HOUSE.files() if HOUSE.unit(HOUSE.module(p)) is None]
    assert sorted(outside) == ["kernellab", "kernellab.run"], outside


def test_imports_flow_downward():
    """No module imports from a unit above its own: statements at module level or inside functions, and imports
    spelled as strings (importlib, __import__, "module:function" settings, preload lists)."""
    assert upward_imports(HOUSE) == []


def test_no_import_cycles():
    """No two modules, and no two packages, import each other, directly or around a loop, through any import."""
    assert import_cycles(HOUSE) == []


def test_no_private_names_across_modules():
    """A module uses another's public names only: what it shares, it names without a leading underscore."""
    assert private_imports(HOUSE) == []


# What a function may import where it needs it: packages that are optional, need a GPU or take long to import.
# Everything else, kernellab's own modules included, is imported at the top of the module.
LOCAL_IMPORTS_OK = {"torch", "cupy", "numba", "numba_cuda", "cuda", "nvidia", "matplotlib", "IPython", "ipywidgets",
                    "tqdm", "distributed", "dask", "triton", "greenlet"}
# The package's own entry points, which load the rest on first use (the lazy public names, the magics).
LAZY_LOADERS = {"kernellab", "kernellab.notebook"}


def test_imports_sit_at_module_level():
    """Function-level imports only of optional or heavy packages (LOCAL_IMPORTS_OK), outside the lazy loaders."""
    bad = []
    for path in HOUSE.files():
        if HOUSE.module(path) in LAZY_LOADERS:
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = ["." * node.level + (node.module or "")]
                else:
                    continue
                bad += [f"{path.relative_to(PKG)}:{node.lineno} imports {n} in {fn.name}()" for n in names
                        if n.split(".")[0] not in LOCAL_IMPORTS_OK]
    assert bad == []


def test_run_takes_the_launch_as_a_value():
    """run/launch/, run/nvtools/ and the CPU path of CUDA C++ (run/sim/cuda/) receive a launch as a KernelJob (or a
    KernelImage) and never call back into the Kernel object (run/measure/ times and checks user kernels as callables,
    which is another matter)."""
    kernel_methods = {"job_fields", "check_launch_args", "check_launch", "check_args", "source_view", "resources",
                      "simulate"}
    bad = []
    for path in [*(PKG / "run" / "launch").rglob("*.py"), *(PKG / "run" / "nvtools").rglob("*.py"),
                 *(PKG / "run" / "sim" / "cuda").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in kernel_methods:
                bad.append(f"{path.relative_to(PKG)}:{node.lineno} uses .{node.attr}")
    assert bad == []


def test_nothing_below_notebook_reaches_up_into_it():
    """Results below notebook/ render themselves from kernellab/render/: not even a `_repr_*` hook imports notebook/."""
    checked = 0
    for path in HOUSE.files():
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


def _synthetic(tmp_path, files: dict) -> House:
    """A small package `pkgx` in tmp_path: units low (a module), mid (a package: mid.one, mid.two) and high."""
    root = tmp_path / "pkgx"
    for rel, text in {"__init__.py": "", "low.py": "X = 1\n", "mid/__init__.py": "", "mid/one.py": "",
                      "mid/two.py": "", "high.py": "from . import low\n", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return House(root, ("low", "mid", "high"))


def test_the_layering_checks_pass_a_clean_package(tmp_path):
    house = _synthetic(tmp_path, {"mid/one.py": "from ..low import X\nfrom . import two\n",
                                  "high.py": "import importlib\nfrom .mid import one\n\ndef f():\n"
                                             "    return importlib.import_module('pkgx.low')\n"})
    assert (upward_imports(house), import_cycles(house), private_imports(house)) == ([], [], [])


def test_the_layering_checks_catch_each_kind(tmp_path):
    """Each rule fails on a package that breaks it: an upward import (at module level, in a function, by importlib
    or __import__, or as a "module:function" string), a module cycle hidden in a function, a cycle between
    packages, a _private name."""
    up = _synthetic(tmp_path / "up", {"low.py": "def f():\n    from . import high\n"})
    assert upward_imports(up) == ["low.py:2 imports pkgx.high from a higher layer (high above low)"]
    up_top = _synthetic(tmp_path / "up_top", {"mid/two.py": "from pkgx.high import *\n"})
    assert upward_imports(up_top) == ["mid/two.py:1 imports pkgx.high from a higher layer (high above mid)"]
    by_name = _synthetic(tmp_path / "by_name", {"low.py": "import importlib\n\ndef f():\n"
                                                          "    return importlib.import_module('pkgx.mid.one')\n"})
    assert upward_imports(by_name) == ["low.py:4 imports by string pkgx.mid.one from a higher layer (mid above low)"]
    dunder = _synthetic(tmp_path / "dunder", {"low.py": "def f():\n    return __import__('pkgx.high')\n"})
    assert upward_imports(dunder) == ["low.py:2 imports by string pkgx.high from a higher layer (high above low)"]
    setting = _synthetic(tmp_path / "setting", {"mid/one.py": "RUNNER = 'pkgx.high:main'\n"})
    assert upward_imports(setting) == ["mid/one.py:1 imports by string pkgx.high from a higher layer (high above "
                                       "mid)"]
    loop = _synthetic(tmp_path / "loop", {"mid/one.py": "from . import two\n",
                                          "mid/two.py": "def f():\n    from . import one\n"})
    assert import_cycles(loop) == ["module cycle: pkgx.mid.one <-> pkgx.mid.two"]
    assert upward_imports(loop) == []                   # one unit: only the cycle check sees it
    packages = _synthetic(tmp_path / "packages", {"mid/one.py": "from ..sub import b\n", "sub/__init__.py": "",
                                                  "sub/a.py": "from ..mid import two\n", "sub/b.py": ""})
    assert import_cycles(packages) == ["package cycle: pkgx.mid <-> pkgx.sub"]
    private = _synthetic(tmp_path / "private", {"low.py": "_X = 1\n", "mid/one.py": "from ..low import _X\n",
                                                "mid/two.py": "from .. import low\nY = low._X\n"})
    assert private_imports(private) == ["mid/one.py:1 imports _X from pkgx.low", "mid/two.py:2 uses low._X of pkgx.low"]
