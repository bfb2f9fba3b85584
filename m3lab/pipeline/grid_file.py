"""A sweep described in one YAML file: ``m3lab sweep GRID.yaml [--executor local|ray] [--address ADDR]``.

    # grid.yaml
    pipeline: checklist          # a built-in pipeline name, or a pipeline .yaml path (relative to this file)
    axes:                        # the grid: every combination of these values is one run
      tp: [4, 8]
      quant: [mxfp8, mxfp4]
      concurrency: [1, 32, 128]
    overrides:                   # parameters every point shares (as -p KEY=VALUE; STEP.KEY for one step)
      isl: 8192
    executor: local              # optional: local (default) or ray; the command line's --executor wins
    address: null                # optional: the Ray cluster (null: ray.init()'s default; 'auto': a running one)
    ray:                         # optional: what each point asks Ray for (task options)
      num_cpus: 1
      resources: {gpu_slot: 1}

Each axis is a list of values (a scalar means one value); an axis may not also be an override.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from m3lab.errors import M3LabError
from m3lab.pipeline.spec import read_yaml

FIELDS = ("pipeline", "axes", "overrides", "executor", "address", "ray", "description")
EXECUTORS = ("local", "ray")
RAY_OPTIONS = ("num_cpus", "num_gpus", "resources", "memory", "max_retries")


@dataclass(frozen=True)
class GridFile:
    pipeline: str
    axes: dict[str, list[Any]]
    overrides: list[str] = field(default_factory=list)
    executor: str = "local"
    address: str | None = None
    ray: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def _value_text(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def is_grid_file(path: str | Path) -> bool:
    """True for a YAML file with an ``axes`` mapping (a pipeline file has ``steps`` instead). A YAML file that
    cannot be read (not UTF-8, not YAML) raises the one-line error that says why."""
    p = Path(path)
    if p.suffix not in (".yaml", ".yml") or not p.is_file():
        return False
    raw = read_yaml(p, "YAML file")
    return isinstance(raw, dict) and "axes" in raw


def load_grid(path: str | Path) -> GridFile:
    """Read and check a grid file; every problem names the field."""
    p = Path(path)
    if not p.is_file():
        raise M3LabError(f"grid file {str(p)!r} does not exist", field="GRID")
    raw = read_yaml(p, "grid file")
    if not isinstance(raw, dict):
        raise M3LabError(f"grid file {p}: must be a mapping with 'pipeline' and 'axes'", field="GRID")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise M3LabError(f"grid file {p}: unknown field(s) {unknown}", field=unknown[0],
                         hint=f"allowed: {', '.join(FIELDS)}")
    axes_raw = raw.get("axes")
    if not isinstance(axes_raw, dict) or not axes_raw:
        raise M3LabError(f"grid file {p}: 'axes' must map each parameter to its values", field="axes",
                         hint="e.g. axes: {tp: [4, 8]}")
    axes: dict[str, list[Any]] = {}
    for key, values in axes_raw.items():
        values = values if isinstance(values, list) else [values]
        if not values:
            raise M3LabError(f"grid file {p}: axis {key!r} has no values", field=f"axes.{key}")
        if len(set(map(repr, values))) != len(values):
            raise M3LabError(f"grid file {p}: axis {key!r} repeats a value", field=f"axes.{key}")
        axes[str(key)] = values
    over_raw = raw.get("overrides") or {}
    if not isinstance(over_raw, dict):
        raise M3LabError(f"grid file {p}: 'overrides' must be a mapping KEY: VALUE", field="overrides")
    both = sorted(set(map(str, over_raw)) & set(axes))
    if both:
        raise M3LabError(f"grid file {p}: {both[0]!r} is both an axis and an override", field=f"overrides.{both[0]}",
                         hint="keep it in one place")
    executor = str(raw.get("executor") or "local")
    if executor not in EXECUTORS:
        raise M3LabError(f"grid file {p}: executor {executor!r} is unknown", field="executor", hint="local or ray")
    ray = raw.get("ray") or {}
    if not isinstance(ray, dict) or set(ray) - set(RAY_OPTIONS):
        raise M3LabError(f"grid file {p}: 'ray' takes {', '.join(RAY_OPTIONS)}", field="ray")
    pipeline = raw.get("pipeline")
    if not pipeline:
        raise M3LabError(f"grid file {p}: 'pipeline' is required", field="pipeline", hint="e.g. pipeline: checklist")
    pipeline = str(pipeline)
    if pipeline.endswith((".yaml", ".yml")) and not Path(pipeline).is_absolute():
        pipeline = str((p.parent / pipeline).resolve())
    return GridFile(pipeline=pipeline, axes=axes, overrides=[f"{k}={_value_text(v)}" for k, v in over_raw.items()],
                    executor=executor, address=raw.get("address"), ray=dict(ray), source=str(p))
