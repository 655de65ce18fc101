"""Project files agree: environment.yml pins what pyproject pins; README and CI run the same test command."""
import pathlib
import re
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[\[<>=!~ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject_reqs() -> dict[str, str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"])
    for extra in ("torch", "lab", "test"):
        reqs += meta.get("optional-dependencies", {}).get(extra, [])
    return {_name(r): r.replace(" ", "") for r in reqs}


def _env_reqs() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return {_name(r): r.replace(" ", "") for r in pip if not r.startswith("-e")}


def test_environment_yml_pins_the_same_requirements_as_pyproject():
    py, env = _pyproject_reqs(), _env_reqs()
    assert sorted(py) == sorted(env), f"only in pyproject: {set(py) - set(env)}; only in environment.yml: {set(env) - set(py)}"
    for name, req in py.items():
        assert req == env[name], f"{name}: pyproject says {req!r}, environment.yml says {env[name]!r}"


def test_environment_yml_uses_conda_forge_and_the_supported_python():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    assert any(str(d).startswith("python=3.1") for d in env["dependencies"])
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert ">=3.11" in requires and "<3.13" in requires


def test_cuda_toolkit_wheels_stay_at_13_0():
    """PTX must never outrun a CUDA 13.0 driver (580): see ../shared/PLATFORM.md."""
    py = _pyproject_reqs()
    for name in ("cuda-toolkit", "nvidia-nvjitlink", "cuda-bindings"):
        assert "==13.0.*" in py[name], py[name]
    assert py["torch"] == "torch==2.13.0"


def test_readme_opens_with_the_two_commands_and_ci_runs_make_test():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```", 2)[1]
    commands = [l.split("#")[0].strip() for l in block.splitlines()[1:] if l.strip()]
    assert commands == ["make lab", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.M)
