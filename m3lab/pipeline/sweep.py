"""Sweeps: one pipeline run per point of a parameter grid, locally or on a Ray cluster.

    m3lab sweep checklist -g tp=4,8 -g concurrency=[1,32,128] --out runs/
    m3lab sweep checklist -g tp=4,8 --ray auto        # one Ray task per grid point

Every grid point is validated before the first run starts. The sweep folder
``<out>/sweep-<pipeline>-<timestamp>/`` holds one run folder per point, named by the point's overrides
(``tp=8,concurrency=32``), and:

- ``sweep.json``: the grid, and each point's overrides, run folder (relative) and status, rewritten
  atomically as points finish;
- ``comparison.parquet``: one row per point: its overrides, status, and every number the points' JSON
  artifacts hold (``<step>.<artifact>.<key>`` columns), so the points compare in one table;
- ``sweep.html``: that table and a link to each point's report.

On Ray, workers must see the same m3lab checkout (a shared file system or the same image); each task runs
:func:`~m3lab.pipeline.runner.run_pipeline` and writes its run folder where the workers' file system puts it.
"""
from __future__ import annotations

import html
import itertools
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from m3lab.atomic import atomic_path, write_json, write_text
from m3lab.errors import M3LabError
from m3lab.pipeline.params import resolve_parameters
from m3lab.pipeline.run_folder import REPORT, new_run_dir, relative, safe_name
from m3lab.pipeline.runner import run_pipeline
from m3lab.pipeline.spec import load_pipeline

SWEEP = "sweep.json"
COMPARISON = "comparison.parquet"
SWEEP_REPORT = "sweep.html"


def parse_axes(items: Iterable[str]) -> dict[str, list[Any]]:
    """``["tp=4,8", "concurrency=[1, 32]"]`` -> ``{"tp": [4, 8], "concurrency": [1, 32]}``."""
    axes: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise M3LabError(f"grid axis {item!r} is not KEY=V1,V2,...", hint="e.g. -g tp=4,8 or -g isl=[1024,8192]")
        raw, key = raw.strip(), key.strip()
        try:
            values = yaml.safe_load(raw) if raw.startswith("[") else [yaml.safe_load(v) for v in raw.split(",")]
        except yaml.YAMLError as err:
            raise M3LabError(f"grid axis {key!r}: {raw!r} is not a list of values ({err.problem or 'bad YAML'})",
                             field=key, hint="e.g. -g tp=4,8 or -g 'tp=[4, 8]'") from None
        if not isinstance(values, list) or not values:
            raise M3LabError(f"grid axis {key!r}: give at least one value", field=key)
        if key in axes:
            raise M3LabError(f"grid axis {key!r} is given twice", field=key,
                             hint=f"give all its values in one -g, e.g. -g {key}=" +
                                  ",".join(str(v) for v in axes[key] + values))
        if len(set(map(repr, values))) != len(values):
            raise M3LabError(f"grid axis {key!r} repeats a value ({raw})", field=key)
        axes[key] = values
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
              echo: Callable[[str], None] = print, executor: str | None = None,
              ray_options: dict | None = None) -> dict:
    """Run ``pipeline`` once per grid point; returns the sweep record also written to ``sweep.json``.

    ``executor="ray"`` (or a ``ray_address``) runs each point as a Ray task (:mod:`m3lab.pipeline.ray_executor`;
    ``ray_options``: what each task asks for, e.g. ``{"num_cpus": 1, "resources": {"gpu_slot": 1}}``)."""
    if executor not in (None, "local", "ray"):
        raise M3LabError(f"executor {executor!r} is unknown", field="executor", hint="local or ray")
    use_ray = executor == "ray" or (executor is None and ray_address is not None)
    pipe = load_pipeline(pipeline)
    base = list(overrides)
    points = [base + p for p in grid_points(axes)]
    for p in points:  # validate everything before running anything
        resolve_parameters(pipe, p)
    if use_ray:
        _require_ray()
    folder = new_run_dir(out_dir, f"sweep-{pipe.name}")
    names = [point_name(p[len(base):]) for p in points]
    record = {"pipeline": pipe.name, "pipeline_file": relative(pipe.source, folder), "axes": axes, "overrides": base,
              "executor": f"ray:{ray_address or 'default'}" if use_ray else "local",
              "points": [{"overrides": p, "run_dir": None, "status": "pending", "error": None} for p in points]}
    write_json(folder / SWEEP, record)
    if use_ray:
        results = _run_on_ray(str(pipe.source), points, names, str(folder.resolve()), ray_address, ray_options, echo)
    else:
        results = _run_locally(str(pipe.source), points, names, folder, progress, echo)
    for entry, (run_dir, status, error) in zip(record["points"], results):
        entry.update(run_dir=relative(run_dir, folder), status=status, error=error)
    write_json(folder / SWEEP, record)
    table = comparison_table(folder, record)
    with atomic_path(folder / COMPARISON) as tmp:
        table.to_parquet(tmp, index=False)
    write_text(folder / SWEEP_REPORT, _sweep_html(folder, record, table))
    record["folder"] = str(folder)
    for entry in record["points"]:
        entry["run_dir"] = str(folder / entry["run_dir"])
    return record


def point_name(overrides: list[str]) -> str:
    """The run folder name of a grid point: its overrides joined, ``tp=8,concurrency=32``."""
    return safe_name(",".join(o.replace(" ", "") for o in overrides) or "defaults")


def comparison_table(folder: str | os.PathLike, record: dict | None = None):
    """One row per point of the sweep in ``folder``: its axis values, status, and the scalar numbers of
    every JSON artifact of its run (columns ``<step>.<artifact>.<key>``)."""
    import pandas as pd

    folder = Path(folder)
    record = record or json.loads((folder / SWEEP).read_text(encoding="utf-8"))
    rows = []
    for entry in record["points"]:
        run_dir = folder / entry["run_dir"] if entry.get("run_dir") else None
        row = {"point": point_name(entry["overrides"][len(record.get("overrides", [])):]),
               **{k: v for k, v in (o.split("=", 1) for o in entry["overrides"])},
               "status": entry["status"], "run_dir": entry.get("run_dir")}
        if run_dir is not None:
            for path in sorted((run_dir / "artifacts").glob("*/*.json")):
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if isinstance(data, dict):
                    for key, value in data.items():
                        if isinstance(value, (int, float)) and not isinstance(value, bool):
                            row[f"{path.parent.name}.{path.stem}.{key}"] = value
        rows.append(row)
    return pd.DataFrame(rows)


def _sweep_html(folder: Path, record: dict, table) -> str:
    def cell(v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return "<td></td>" if isinstance(v, float) and math.isnan(v) else f'<td class="num">{v:,.4g}</td>'
        return "<td></td>" if v is None else f"<td>{html.escape(str(v))}</td>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns if c != "run_dir") + "<th>report</th>"
    body = []
    for row in table.to_dict("records"):
        link = (f'<a href="{html.escape(row["run_dir"])}/{REPORT}">report</a>' if row.get("run_dir") else "")
        body.append("<tr>" + "".join(cell(v) for c, v in row.items() if c != "run_dir") + f"<td>{link}</td></tr>")
    axes = ", ".join(f"{k} = {v}" for k, v in record["axes"].items())
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>sweep {html.escape(folder.name)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5rem;color:#1d2330}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #dde;padding:2px 6px;text-align:left}}td.num{{text-align:right}}</style></head><body>
<h1>Sweep of pipeline {html.escape(record['pipeline'])}</h1><p>grid: {html.escape(axes)}; common parameters:
{html.escape(' '.join(record.get('overrides', [])) or 'none')}</p><p>One row per point: the numbers every point's JSON
artifacts hold, side by side (each labelled as its notebook labels it: projected, measured or published).</p>
<div style="overflow-x:auto"><table><tr>{head}</tr>{''.join(body)}</table></div></body></html>"""


def _run_one(pipeline_file: str, overrides: list[str], name: str, out_dir: str, progress: bool = False,
             echo: Callable[[str], None] = lambda s: None) -> tuple[str, str, str | None]:
    res = run_pipeline(pipeline_file, overrides, out_dir, progress=progress, echo=echo, folder_name=name)
    failed = res.failed_step
    return str(res.run_dir), res.summary["status"], (f"{failed['name']}: {failed['error']}" if failed else None)


def _run_locally(pipeline_file, points, names, folder, progress, echo):
    out = []
    for i, (p, name) in enumerate(zip(points, names), start=1):
        echo(f"sweep point {i}/{len(points)}: {' '.join(p) or '(defaults)'}")
        out.append(_run_one(pipeline_file, p, name, str(folder), progress, echo))
        echo(f"  -> {out[-1][1]}: {out[-1][0]}")
    return out


def _require_ray():
    try:
        import ray  # noqa: F401
    except ImportError:
        raise M3LabError("--ray needs the ray package", field="ray", hint="pip install 'm3lab[ray]'") from None


def _run_on_ray(pipeline_file, points, names, folder, address, options=None, echo=print):
    from m3lab.pipeline.ray_executor import run_tasks
    outcomes = run_tasks(_run_one, [(pipeline_file, p, name, folder) for p, name in zip(points, names)],
                         address=address, options=options, labels=names, echo=echo)
    return [o.value if o.ok else (str(Path(folder) / name), "failed", o.error) for o, name in zip(outcomes, names)]
