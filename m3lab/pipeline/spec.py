"""Pipeline files: a small YAML listing notebook steps and their parameter overrides.

    name: checklist
    description: The six-step checklist on MiniMax M3 (CPU, built-in defaults).
    steps:
      - name: local_shapes            # unique step name, used by -p STEP.KEY=VALUE
        notebook: 01_local_shapes.ipynb   # relative to the notebooks folder (or to this file)
        parameters: {tp: 4}           # overrides of the notebook's parameters cell

Built-in pipelines live in ``m3lab/pipelines/*.yaml``; a path to any other YAML file works too.
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from m3lab.errors import M3LabError
from m3lab.provenance import NOTEBOOKS_DIR

PIPELINES_DIR = Path(__file__).resolve().parents[1] / "pipelines"
DEFAULT_PIPELINE = "checklist"
_STEP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PIPELINE_FIELDS = ("name", "description", "steps")
STEP_FIELDS = ("name", "notebook", "parameters")


def notebooks_dir() -> Path:
    """The notebooks folder: ``$M3LAB_NOTEBOOKS``, else ``notebooks/`` beside the package."""
    env = os.environ.get("M3LAB_NOTEBOOKS")
    return Path(env) if env else NOTEBOOKS_DIR


@dataclass(frozen=True)
class Step:
    """One notebook step of a pipeline."""

    name: str
    notebook: Path
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Pipeline:
    """A named, ordered list of steps, loaded from ``source``."""

    name: str
    description: str
    steps: tuple[Step, ...]
    source: Path

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise M3LabError(f"pipeline {self.name!r} has no step {name!r}",
                         hint=f"steps: {', '.join(s.name for s in self.steps)}")


def list_pipelines() -> list[str]:
    """Names of the built-in pipelines."""
    return sorted(p.stem for p in PIPELINES_DIR.glob("*.yaml"))


def load_pipeline(name_or_path: str | os.PathLike) -> Pipeline:
    """Load a built-in pipeline by name, or a pipeline YAML file by path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = PIPELINES_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise M3LabError(f"unknown pipeline {str(name_or_path)!r}",
                             hint=f"built-in pipelines: {', '.join(list_pipelines())}, or give a .yaml path")
    elif not path.is_file():
        raise M3LabError(f"pipeline file {str(path)!r} does not exist")
    return _parse(read_yaml(path, "pipeline file"), path)


def read_yaml(path: Path, what: str) -> Any:
    """A YAML file's document; a file that is not UTF-8 text or not YAML is one line naming it and the place."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise M3LabError(f"{what} {path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start})",
                         field=what.split()[0], hint="save the file as UTF-8") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise M3LabError(f"{what} {path}: not valid YAML{where} ({problem})", field=what.split()[0]) from None


def _parse(raw: Any, path: Path) -> Pipeline:
    if not isinstance(raw, dict) or not isinstance(raw.get("steps"), list) or not raw["steps"]:
        raise M3LabError(f"pipeline file {path}: field 'steps' must be a non-empty list of steps")
    unknown = sorted(set(map(str, raw)) - set(PIPELINE_FIELDS))
    if unknown:
        raise M3LabError(f"pipeline file {path}: unknown field(s) {unknown}", field=unknown[0],
                         hint=f"allowed: {', '.join(PIPELINE_FIELDS)}")
    steps, seen = [], set()
    for i, s in enumerate(raw["steps"]):
        where = f"pipeline file {path}: steps[{i}]"
        if not isinstance(s, dict) or "notebook" not in s:
            raise M3LabError(f"{where}: each step needs a 'notebook' field")
        unknown = sorted(set(map(str, s)) - set(STEP_FIELDS))
        if unknown:
            close = difflib.get_close_matches(unknown[0], STEP_FIELDS, n=1)
            raise M3LabError(f"{where}: unknown field {unknown[0]!r}", field=f"steps[{i}].{unknown[0]}",
                             hint=(f"did you mean {close[0]!r}? " if close else "") +
                                  f"a step takes {', '.join(STEP_FIELDS)}")
        nb = _resolve_notebook(str(s["notebook"]), path)
        name = str(s.get("name") or _default_step_name(nb))
        if not _STEP_NAME.match(name):
            raise M3LabError(f"{where}: step name {name!r} must be an identifier (letters, digits, '_')")
        if name in seen:
            raise M3LabError(f"{where}: step name {name!r} is used twice")
        params = s.get("parameters") or {}
        if not isinstance(params, dict):
            raise M3LabError(f"{where}: 'parameters' must be a mapping")
        seen.add(name)
        steps.append(Step(name=name, notebook=nb, parameters=dict(params)))
    return Pipeline(name=str(raw.get("name") or path.stem), description=str(raw.get("description", "")),
                    steps=tuple(steps), source=path.resolve())


def _resolve_notebook(ref: str, pipeline_file: Path) -> Path:
    for base in (pipeline_file.parent, notebooks_dir()):
        cand = (base / ref).resolve()
        if cand.is_file():
            return cand
    raise M3LabError(f"pipeline file {pipeline_file}: notebook {ref!r} not found",
                     hint=f"looked beside the pipeline file and in {notebooks_dir()}")


def _default_step_name(nb: Path) -> str:
    """``01_local_shapes.ipynb`` -> ``local_shapes``."""
    stem = re.sub(r"^\d+_", "", nb.stem)
    return re.sub(r"\W", "_", stem)
