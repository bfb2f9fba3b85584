"""Sweeps: one pipeline run per point of a parameter grid, locally or on a Ray cluster.

    m3lab sweep checklist -g tp=4,8 -g concurrency=[1,32,128] --out runs/
    m3lab sweep checklist -g tp=4,8 --ray auto        # one Ray task per grid point

Every grid point is validated before the first run starts. The sweep folder
``<out>/sweep-<pipeline>-<timestamp>/`` holds one run folder per point and ``sweep.json`` (the grid, and
each point's overrides, run folder and status), rewritten atomically as points finish. On Ray, workers
must see the same m3lab checkout (a shared file system or the same image); each task runs
:func:`~m3lab.pipeline.runner.run_pipeline` and writes its run folder where the workers' file system puts it.
"""
from __future__ import annotations

import itertools
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from m3lab.atomic import write_json
from m3lab.errors import M3LabError
from m3lab.pipeline.params import resolve_parameters
from m3lab.pipeline.runner import run_pipeline
from m3lab.pipeline.spec import load_pipeline


def parse_axes(items: Iterable[str]) -> dict[str, list[Any]]:
    """``["tp=4,8", "concurrency=[1, 32]"]`` -> ``{"tp": [4, 8], "concurrency": [1, 32]}``."""
    axes: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise M3LabError(f"grid axis {item!r} is not KEY=V1,V2,...", hint="e.g. -g tp=4,8 or -g isl=[1024,8192]")
        raw = raw.strip()
        values = yaml.safe_load(raw) if raw.startswith("[") else [yaml.safe_load(v) for v in raw.split(",")]
        if not isinstance(values, list) or not values:
            raise M3LabError(f"grid axis {key!r}: give at least one value")
        axes[key.strip()] = values
    if not axes:
        raise M3LabError("a sweep needs at least one grid axis", hint="-g KEY=V1,V2")
    return axes


def grid_points(axes: dict[str, list[Any]]) -> list[list[str]]:
    """The Cartesian product of the axes, each point as ``-p`` override strings."""
    keys = list(axes)
    return [[f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
             for k, v in zip(keys, combo)] for combo in itertools.product(*(axes[k] for k in keys))]


def run_sweep(pipeline: str | os.PathLike, axes: dict[str, list[Any]], overrides: Iterable[str] = (),
              out_dir: str | os.PathLike = "runs", *, ray_address: str | None = None, progress: bool = False,
              echo: Callable[[str], None] = print) -> dict:
    """Run ``pipeline`` once per grid point; returns the sweep record also written to ``sweep.json``."""
    pipe = load_pipeline(pipeline)
    base = list(overrides)
    points = [base + p for p in grid_points(axes)]
    for p in points:  # validate everything before running anything
        resolve_parameters(pipe, p)
    folder = Path(out_dir) / f"sweep-{pipe.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=False)
    record = {"pipeline": pipe.name, "pipeline_file": str(pipe.source), "axes": axes, "overrides": base,
              "executor": f"ray:{ray_address}" if ray_address else "local",
              "points": [{"overrides": p, "run_dir": None, "status": "pending", "error": None} for p in points]}
    write_json(folder / "sweep.json", record)
    if ray_address:
        results = _run_on_ray(str(pipe.source), points, str(folder.resolve()), ray_address)
    else:
        results = _run_locally(str(pipe.source), points, folder, progress, echo)
    for entry, (run_dir, status, error) in zip(record["points"], results):
        entry.update(run_dir=run_dir, status=status, error=error)
    write_json(folder / "sweep.json", record)
    record["folder"] = str(folder)
    return record


def _run_one(pipeline_file: str, overrides: list[str], out_dir: str, progress: bool = False,
             echo: Callable[[str], None] = lambda s: None) -> tuple[str, str, str | None]:
    res = run_pipeline(pipeline_file, overrides, out_dir, progress=progress, echo=echo)
    failed = res.failed_step
    return str(res.run_dir), res.summary["status"], (f"{failed['name']}: {failed['error']}" if failed else None)


def _run_locally(pipeline_file, points, folder, progress, echo):
    out = []
    for i, p in enumerate(points, start=1):
        echo(f"sweep point {i}/{len(points)}: {' '.join(p) or '(defaults)'}")
        out.append(_run_one(pipeline_file, p, str(folder), progress, echo))
        echo(f"  -> {out[-1][1]}: {out[-1][0]}")
    return out


def _run_on_ray(pipeline_file, points, folder, address):
    try:
        import ray
    except ImportError:
        raise M3LabError("--ray needs the ray package", hint="pip install 'm3lab[ray]'") from None
    ray.init(address=address, ignore_reinit_error=True)
    task = ray.remote(_run_one)
    return ray.get([task.remote(pipeline_file, p, folder) for p in points])
