"""Notebook parameters: read each step's ``parameters`` cell and validate ``-p`` overrides.

An override is ``KEY=VALUE`` (every step whose parameters cell declares KEY) or
``STEP.KEY=VALUE`` (one step). VALUE is parsed as YAML (``32``, ``0.9``, ``true``, ``bf16``,
``[1, 8, 32]``) and must have the type of the notebook's default (an int is accepted where the
default is a float; any value where the default is None); ``None``, ``none`` and ``null`` all mean null.
Values are then checked by the library's own validators (:mod:`m3lab.pipeline.validate`, and
:mod:`m3lab.pipeline.list_values` for the elements of list parameters). Everything is
checked before a step runs.
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import yaml

from m3lab.errors import M3LabError
from m3lab.pipeline.list_values import validate_lists
from m3lab.pipeline.validate import is_null, validate_step


@dataclass(frozen=True)
class Parameter:
    """One assignment of a notebook's parameters cell."""

    name: str
    default: Any
    help: str

    @property
    def type_name(self) -> str:
        return "any" if self.default is None else type(self.default).__name__


def notebook_parameters(path: str | Path) -> dict[str, Parameter]:
    """The parameters declared in the cell tagged ``parameters`` of a notebook, in order."""
    path = Path(path)
    return dict(_parameters_cached(str(path.resolve()), path.stat().st_mtime_ns))


@lru_cache(maxsize=128)
def _parameters_cached(path: str, _mtime: int) -> tuple[tuple[str, Parameter], ...]:
    # plain JSON rather than nbformat: importing nbformat's schema validators takes seconds, and a bad value
    # must be reported within a few seconds of typing it
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
        cells = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise M3LabError(f"notebook {path} is not a valid notebook (JSON with a list of cells)") from None
    if not cells:
        raise M3LabError(f"notebook {path} has no cell tagged 'parameters'",
                         hint="tag the cell of defaults 'parameters' (papermill's convention)")
    source = cells[0]["source"]
    source = "".join(source) if isinstance(source, list) else source
    lines = source.splitlines()
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise M3LabError(f"notebook {path}: the parameters cell is not valid Python ({err.msg}, line {err.lineno})") from None
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                default = ast.literal_eval(node.value)
            except ValueError:
                raise M3LabError(f"notebook {path}: parameter {node.targets[0].id!r} must have a literal default") from None
            line = lines[node.lineno - 1]
            help_ = line.split("#", 1)[1].strip() if "#" in line else ""
            out.append((node.targets[0].id, Parameter(node.targets[0].id, default, help_)))
    return tuple(out)


def parse_overrides(items: Iterable[str]) -> list[tuple[str | None, str, Any]]:
    """``["tp=8", "shapes.isl=4096"]`` -> ``[(None, "tp", 8), ("shapes", "isl", 4096)]``."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise M3LabError(f"parameter {item!r} is not KEY=VALUE", hint="e.g. -p tp=8 or -p local_shapes.tp=8")
        step, _, name = key.rpartition(".")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        out.append((step or None, name, value))
    return out


def resolve_parameters(pipeline, overrides: Iterable[str], *, check_values: bool = True) -> dict[str, dict[str, Any]]:
    """Per-step parameters (pipeline file values, then ``-p`` overrides), all validated.

    Returns ``{step name: {param: value}}`` holding the values set by the pipeline file or ``-p``
    (what papermill injects). Names and types are always checked; values too unless ``check_values``
    is False.
    """
    declared = {s.name: notebook_parameters(s.notebook) for s in pipeline.steps}
    resolved: dict[str, dict[str, Any]] = {s.name: {} for s in pipeline.steps}
    for s in pipeline.steps:
        for key, value in s.parameters.items():
            _assign(resolved, declared, s.name, key, value, f"pipeline file step {s.name!r}")
    for step, key, value in parse_overrides(overrides):
        if step is not None:
            if step not in declared:
                raise M3LabError(f"-p {step}.{key}: no step named {step!r}",
                                 hint=f"steps: {', '.join(declared)}")
            _assign(resolved, declared, step, key, value, f"-p {step}.{key}")
            continue
        targets = [name for name, params in declared.items() if key in params]
        if not targets:
            valid = sorted({k for params in declared.values() for k in params})
            raise M3LabError(f"unknown parameter {key!r}: no step of pipeline {pipeline.name!r} declares it",
                             hint=f"valid keys: {', '.join(valid)}")
        for name in targets:
            _assign(resolved, declared, name, key, value, f"-p {key}")
    if check_values:
        for name, params in declared.items():
            values = {k: p.default for k, p in params.items()} | resolved[name]
            validate_step(name, values, set(resolved[name]))
            validate_lists(name, values, set(resolved[name]))
    return resolved


def parameter_values(pipeline, resolved: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every parameter value each step runs with: its notebook's defaults, then what ``resolved`` sets
    (:func:`resolve_parameters`)."""
    return {s.name: {k: p.default for k, p in notebook_parameters(s.notebook).items()} | resolved.get(s.name, {})
            for s in pipeline.steps}


def _assign(resolved, declared, step: str, key: str, value: Any, where: str) -> None:
    params = declared[step]
    if key not in params:
        raise M3LabError(f"{where}: step {step!r} has no parameter {key!r}",
                         hint=f"its parameters: {', '.join(params) or 'none'}")
    resolved[step][key] = coerce(params[key], value, where)


def coerce(param: Parameter, value: Any, where: str) -> Any:
    """Check ``value`` against the parameter's default type; ints widen to float."""
    default = param.default
    if is_null(value):
        return None
    if default is None:
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, (list, tuple)):
        ok = isinstance(value, (list, tuple))
        if ok:
            _check_elements(param, value, where)
    elif isinstance(default, dict):
        ok = isinstance(value, dict)
    elif isinstance(default, str):
        ok = isinstance(value, (str, int, float)) and not isinstance(value, bool)
        value = str(value) if ok else value
    else:
        ok = True
    if not ok:
        article = "an" if param.type_name[0] in "aeiou" else "a"
        raise M3LabError(f"{where}: parameter {param.name!r} takes {article} {param.type_name} "
                         f"(default {default!r}), got {value!r} ({type(value).__name__})")
    return value


def _kind(value: Any) -> str:
    """The element kind a list parameter's default shows: int, float, str, list or None."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (list, tuple)):
        return "list"
    return type(value).__name__


def _check_elements(param: Parameter, value: Any, where: str) -> None:
    """The elements of a list value have the kind of the default's elements (an int where floats are; null
    where the default holds one), so ``-p concurrencies=[1,x]`` fails here, not in the notebook."""
    kinds = {_kind(v) for v in param.default} - {"None"}
    if len(kinds) != 1:
        return
    (kind,) = kinds
    allowed = {kind, "int"} if kind == "float" else {kind}
    if None in param.default:
        allowed.add("None")
    for i, v in enumerate(value):
        if _kind(v) not in allowed:
            article = "an" if kind[0] in "aeiou" else "a"
            raise M3LabError(f"{where}: parameter {param.name!r} takes a list of {kind} values (default "
                             f"{param.default!r}); element {i} is {v!r} ({_kind(v)}), not {article} {kind}",
                             field=param.name)
