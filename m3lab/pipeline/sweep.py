"""Sweeps: one pipeline run per point of a parameter grid, locally or on a Ray cluster.

    m3lab sweep checklist -g tp=4,8 -g concurrency=[1,32,128] --out runs/
    m3lab sweep checklist -g tp=4,8 --ray auto        # one Ray task per grid point
    m3lab sweep --resume runs/sweep-checklist-...     # after Ctrl-C or a failure: finish it, rebuild the comparison

Every grid point is validated before the first run starts. The sweep folder
``<out>/sweep-<pipeline>-<timestamp>/`` holds one run folder per point, named by the point's overrides
(``tp=8,concurrency=32``; list values ``concurrencies=1+8``), and:

- ``sweep.json``: the grid, and each point's overrides, run folder (relative), status and failure reason,
  rewritten atomically as each point finishes;
- ``comparison.parquet``: one row per point: its overrides, status, and every number (with its label) the
  points' JSON artifacts hold (:mod:`m3lab.pipeline.sweep_report`), so the points compare in one table;
- ``sweep.html``: the headline numbers charted, that table, each failure's reason, a link to each point's report.

On Ray, workers must see the same m3lab checkout (a shared file system or the same image); each task runs
:func:`~m3lab.pipeline.runner.run_pipeline` and writes its run folder where the workers' file system puts it.
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from m3lab.atomic import write_json
from m3lab.errors import M3LabError
from m3lab.pipeline.params import resolve_parameters
from m3lab.pipeline.ray_executor import check_reachable, require_ray, run_tasks
from m3lab.pipeline.run_folder import SUMMARY, new_run_dir, relative
from m3lab.pipeline.runner import resume_run, run_pipeline
from m3lab.pipeline.spec import load_pipeline
from m3lab.pipeline.sweep_report import (COMPARISON, SWEEP, SWEEP_REPORT, comparison_table, point_name,  # noqa: F401
                                         point_status, write_comparison)


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
    ``ray_options``: what each task asks for, e.g. ``{"num_cpus": 1, "resources": {"gpu_slot": 1}}``).
    ``sweep.json`` is rewritten as each point finishes; Ctrl-C writes the comparison of what finished and raises
    :class:`SweepInterrupted` (continue with :func:`resume_sweep`)."""
    if executor not in (None, "local", "ray"):
        raise M3LabError(f"executor {executor!r} is unknown", field="executor", hint="local or ray")
    use_ray = executor == "ray" or (executor is None and ray_address is not None)
    pipe = load_pipeline(pipeline)
    base = list(overrides)
    points = [base + p for p in grid_points(axes)]
    for p in points:  # validate everything before running anything
        resolve_parameters(pipe, p)
    if use_ray:
        require_ray()
        check_reachable(ray_address)   # before a sweep folder is made: a wrong address leaves nothing behind
    folder = new_run_dir(out_dir, f"sweep-{pipe.name}")
    names = _unique([point_name(p[len(base):]) for p in points])
    record = {"pipeline": pipe.name, "pipeline_file": relative(pipe.source, folder), "axes": axes, "overrides": base,
              "executor": f"ray:{ray_address or 'default'}" if use_ray else "local",
              "points": [{"overrides": p, "name": n, "run_dir": n, "status": "pending", "error": None}
                         for p, n in zip(points, names)]}
    write_json(folder / SWEEP, record)
    finished = _recorder(folder, record)
    todo = list(range(len(points)))
    try:
        if use_ray:
            _run_on_ray(str(pipe.source), record, todo, str(folder.resolve()), ray_address, ray_options, echo,
                        finished)
        else:
            _run_locally(str(pipe.source), record, todo, folder, progress, echo, finished)
    except KeyboardInterrupt:
        _interrupted(folder, record, echo)
    return _finish(folder, record)


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: sweep.json and the comparison of the finished points are written; ``folder``
    resumes with ``m3lab sweep --resume FOLDER``."""

    def __init__(self, folder: Path):
        super().__init__(str(folder))
        self.folder = folder


def resume_sweep(folder: str | os.PathLike, *, progress: bool = False, echo: Callable[[str], None] = print) -> dict:
    """Finish the sweep in ``folder`` here (locally): resume each point whose run did not finish, run each point
    that never started, then rewrite sweep.json, comparison.parquet and sweep.html."""
    folder = Path(folder)
    record = load_sweep(folder)
    for entry in record["points"]:
        entry["status"], entry["error"] = point_status(folder, entry)
    todo = [i for i, e in enumerate(record["points"]) if e["status"] != "ok"]
    echo(f"resuming sweep: {len(record['points']) - len(todo)} finished point(s) kept, {len(todo)} to run")
    pipeline_file = folder / record["pipeline_file"]
    if todo and not pipeline_file.is_file():
        raise M3LabError(f"cannot resume {folder}: its pipeline file {record['pipeline_file']!r} is not found",
                         field="pipeline", hint="copy the pipeline file back beside the sweep folder as it was")
    try:
        _run_locally(str(pipeline_file), record, todo, folder, progress, echo, _recorder(folder, record))
    except KeyboardInterrupt:
        _interrupted(folder, record, echo)
    return _finish(folder, record)


def rebuild_comparison(folder: str | os.PathLike) -> Path:
    """Rewrite comparison.parquet and sweep.html of a sweep folder from its points as they are now (statuses read
    from each point's summary.json); returns the path of sweep.html."""
    folder = Path(folder)
    record = load_sweep(folder)
    for entry in record["points"]:
        entry["status"], entry["error"] = point_status(folder, entry)
    write_json(folder / SWEEP, record)
    write_comparison(folder, record)
    return folder / SWEEP_REPORT


def is_sweep_folder(path: str | os.PathLike) -> bool:
    return (Path(path) / SWEEP).is_file()


def load_sweep(folder: Path) -> dict:
    """A sweep folder's sweep.json, checked (one-line M3LabError otherwise)."""
    path = folder / SWEEP
    if not path.is_file():
        raise M3LabError(f"{folder} is not a sweep folder: it has no {SWEEP}", field="SWEEP",
                         hint="pass a folder made by 'm3lab sweep', e.g. runs/sweep-checklist-20261201-120000")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(record, dict) and isinstance(record["points"], list) and isinstance(record["axes"], dict)
        for entry in record["points"]:
            entry.setdefault("name", entry.get("run_dir") or point_name(entry["overrides"][len(record.get("overrides", [])):]))
            entry.setdefault("run_dir", entry["name"])
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as err:
        raise M3LabError(f"{path} is not a readable sweep record ({type(err).__name__})", field="SWEEP",
                         hint="the sweep folder is damaged; each point's run folder can still be reported") from None
    return record


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}-{seen[n]}")
    return out


def _recorder(folder: Path, record: dict) -> Callable[[int, str, str, str | None], None]:
    """``finished(i, run_dir, status, error)``: note point ``i``'s outcome and rewrite sweep.json at once."""
    def finished(i: int, run_dir: str, status: str, error: str | None) -> None:
        record["points"][i].update(run_dir=relative(run_dir, folder), status=status, error=error)
        write_json(folder / SWEEP, record)
    return finished


def _interrupted(folder: Path, record: dict, echo) -> None:
    for entry in record["points"]:
        entry["status"], entry["error"] = point_status(folder, entry)
    write_json(folder / SWEEP, record)
    try:
        write_comparison(folder, record)
    except OSError as err:
        echo(f"comparison not written: {err.strerror or err}")
    raise SweepInterrupted(folder) from None


def _finish(folder: Path, record: dict) -> dict:
    write_json(folder / SWEEP, record)
    write_comparison(folder, record)
    out = json.loads(json.dumps(record))
    out["folder"] = str(folder)
    for entry in out["points"]:
        entry["run_dir"] = str(folder / entry["run_dir"])
    return out


def _run_one(pipeline_file: str, overrides: list[str], name: str, out_dir: str, progress: bool = False,
             echo: Callable[[str], None] = lambda s: None) -> tuple[str, str, str | None]:
    res = run_pipeline(pipeline_file, overrides, out_dir, progress=progress, echo=echo, folder_name=name)
    failed = res.failed_step
    return str(res.run_dir), res.summary["status"], (f"{failed['name']}: {failed['error']}" if failed else None)


def _outcome_text(status: str, error: str | None) -> str:
    return "ok" if status == "ok" else f"{status.upper()}: {error or 'no reason recorded'}"


def _run_locally(pipeline_file, record, todo, folder, progress, echo, finished):
    for n, i in enumerate(todo, start=1):
        entry = record["points"][i]
        echo(f"sweep point {n}/{len(todo)}: {' '.join(entry['overrides']) or '(defaults)'}")
        run_dir = Path(folder) / entry["run_dir"]
        if (run_dir / SUMMARY).is_file():   # a point a Ctrl-C or a failure stopped: carry on where it stopped
            res = resume_run(run_dir, progress=progress, echo=echo)
            failed = res.failed_step
            outcome = (str(res.run_dir), res.summary["status"], f"{failed['name']}: {failed['error']}" if failed else None)
        else:
            if run_dir.is_dir() and not any(p.name != ".lock" for p in run_dir.iterdir()):
                shutil.rmtree(run_dir)   # a folder a run could not start in
            outcome = _run_one(pipeline_file, entry["overrides"], entry["name"], str(folder), progress, echo)
        finished(i, *outcome)
        echo(f"  -> {_outcome_text(outcome[1], outcome[2])}: {outcome[0]}")


def _run_on_ray(pipeline_file, record, todo, folder, address, options, echo, finished):
    names = [record["points"][i]["name"] for i in todo]

    def on_done(o) -> str:
        i = todo[o.index]
        outcome = o.value if o.ok else (str(Path(folder) / names[o.index]), "failed", o.error)
        finished(i, *outcome)
        return _outcome_text(outcome[1], outcome[2])
    run_tasks(_run_one, [(pipeline_file, record["points"][i]["overrides"], names[k], folder) for k, i in enumerate(todo)],
              address=address, options=options, labels=names, echo=echo, on_done=on_done)
