"""environment.yml (conda, GPU box) and pyproject.toml describe the same dependency set."""
import re
import tomllib

import yaml

# conda-forge names that differ from the PyPI names in pyproject.toml
CONDA_TO_PYPI = {"ray-default": "ray"}
NOT_PACKAGES = {"python", "pip"}


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~\[;#]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject_names(repo_dir):
    meta = tomllib.loads((repo_dir / "pyproject.toml").read_text())["project"]
    names = {_name(r) for r in meta["dependencies"]}
    for extra in ("dev", "vllm", "ray"):
        names |= {_name(r) for r in meta["optional-dependencies"][extra]}
    return names


def _environment_names(repo_dir):
    env = yaml.safe_load((repo_dir / "environment.yml").read_text())
    names = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            names |= {_name(p) for p in dep["pip"] if not p.startswith("-")}
        else:
            n = _name(dep)
            names.add(CONDA_TO_PYPI.get(n, n))
    return names - NOT_PACKAGES


def test_environment_and_pyproject_agree(repo_dir):
    py, env = _pyproject_names(repo_dir), _environment_names(repo_dir)
    assert py - env == set(), f"in pyproject.toml but not environment.yml: {sorted(py - env)}"
    assert env - py == set(), f"in environment.yml but not pyproject.toml: {sorted(env - py)}"


def test_environment_installs_m3lab_itself(repo_dir):
    env = yaml.safe_load((repo_dir / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e ." in [p.split("#")[0].strip() for p in pip]


def test_torch_is_not_pinned_in_pyproject(repo_dir):
    meta = tomllib.loads((repo_dir / "pyproject.toml").read_text())
    torch = [r for r in meta["project"]["dependencies"] if _name(r) == "torch"]
    assert torch and "==" not in torch[0], "a GPU box brings its own torch: pin only in the CPU setup step"
    assert meta["build-system"]["requires"] == ["setuptools>=69"], "the build backend must be on GPU images"
