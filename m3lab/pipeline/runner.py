"""Execute a pipeline with papermill into a run folder, and resume a failed run.

Run folder ``runs/<pipeline>-<YYYYmmdd-HHMMSS>/``:

- ``NN_<notebook>.ipynb``: each executed notebook (a failed one keeps its traceback cell);
- ``artifacts/<step>/<name>.parquet|json``: what steps saved through :mod:`m3lab.artifacts`;
- ``summary.json``: parameters, environment (versions, git commit, device), each step's status,
  duration and artifacts, and the run's status (``running``, ``ok`` or ``failed``);
- ``report.html``: every executed notebook in one self-contained page (:mod:`m3lab.pipeline.report`).

Every file is written atomically; ``summary.json`` is rewritten after each step.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from m3lab import artifacts
from m3lab.atomic import atomic_path, write_json
from m3lab.errors import M3LabError
from m3lab.pipeline import environment
from m3lab.pipeline.params import resolve_parameters
from m3lab.pipeline.spec import Pipeline, Step, load_pipeline

SUMMARY = "summary.json"
REPORT = "report.html"
KERNEL = "python3"


@dataclass
class RunResult:
    """The outcome of :func:`run_pipeline` / :func:`resume_run`."""

    run_dir: Path
    summary: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.summary["status"] == "ok"

    @property
    def failed_step(self) -> dict[str, Any] | None:
        return next((s for s in self.summary["steps"] if s["status"] == "failed"), None)


def run_pipeline(pipeline: str | os.PathLike | Pipeline = "checklist", overrides: Iterable[str] = (),
                 out_dir: str | os.PathLike = "runs", *, progress: bool = True,
                 echo: Callable[[str], None] = print) -> RunResult:
    """Validate every parameter, create a run folder and execute the steps in order.

    Raises :class:`M3LabError` before anything runs when a parameter is unknown or mistyped.
    A step that raises stops the run; the summary marks it failed (see :func:`resume_run`).
    """
    pipe = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
    overrides = list(overrides)
    params = resolve_parameters(pipe, overrides)
    run_dir = _new_run_dir(Path(out_dir), pipe.name)
    summary = {
        "pipeline": pipe.name,
        "pipeline_file": str(pipe.source),
        "run_id": run_dir.name,
        "created": _now(),
        "finished": None,
        "status": "running",
        "overrides": overrides,
        "parameters": params,
        "environment": environment.describe(),
        "steps": [_step_entry(i, s) for i, s in enumerate(pipe.steps)],
    }
    write_json(run_dir / SUMMARY, summary)
    return _execute(pipe, run_dir, summary, progress=progress, echo=echo)


def resume_run(run_dir: str | os.PathLike, *, progress: bool = True,
               echo: Callable[[str], None] = print) -> RunResult:
    """Re-run the steps of ``run_dir`` that did not finish, with the parameters it was started with."""
    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    pipe = load_pipeline(summary["pipeline_file"])
    names = [s["name"] for s in summary["steps"]]
    if names != [s.name for s in pipe.steps]:
        raise M3LabError(f"cannot resume {run_dir}: pipeline {summary['pipeline_file']} now has other steps "
                         f"({', '.join(s.name for s in pipe.steps)}; the run had {', '.join(names)})",
                         hint="start a new run")
    # The notebooks may have been fixed since: check the stored parameters against them again.
    resolve_parameters(Pipeline(pipe.name, pipe.description,
                                tuple(Step(s.name, s.notebook, summary["parameters"].get(s.name, {}))
                                      for s in pipe.steps), pipe.source), [])
    summary["status"] = "running"
    summary["resumed"] = summary.get("resumed", []) + [_now()]
    summary["environment"] = environment.describe()
    write_json(run_dir / SUMMARY, summary)
    return _execute(pipe, run_dir, summary, progress=progress, echo=echo)


def load_summary(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Read a run folder's summary.json (clear error if it is not a run folder)."""
    path = Path(run_dir) / SUMMARY
    if not path.is_file():
        raise M3LabError(f"{run_dir} is not a run folder: it has no {SUMMARY}",
                         hint="pass a folder made by 'm3lab run', e.g. runs/checklist-20261129-120000")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise M3LabError(f"{path} is not valid JSON ({err.msg} at line {err.lineno})") from None


def _execute(pipe: Pipeline, run_dir: Path, summary: dict, *, progress: bool, echo) -> RunResult:
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    todo = [(i, s) for i, s in enumerate(pipe.steps) if summary["steps"][i]["status"] != "ok"]
    done = len(pipe.steps) - len(todo)
    if done:
        echo(f"resuming: {done} finished step(s) kept, {len(todo)} to run")
    for n, (i, step) in enumerate(todo, start=1):
        entry = summary["steps"][i]
        echo(f"[{done + n}/{len(pipe.steps)}] {step.name} ({step.notebook.name})")
        entry.update(status="running", started=_now(), error=None)
        write_json(run_dir / SUMMARY, summary)
        t0 = time.perf_counter()
        error = None
        with _step_env(run_dir, step.name), atomic_path(run_dir / entry["output"]) as tmp:
            try:
                pm.execute_notebook(str(step.notebook), str(tmp), parameters=summary["parameters"][step.name],
                                    kernel_name=KERNEL, progress_bar=progress, cwd=str(run_dir),
                                    language="python")
            except PapermillExecutionError as err:
                error = f"{err.ename}: {err.evalue}"
            except Exception as err:  # the kernel died, the notebook could not be read, ...
                error = f"{type(err).__name__}: {err}"
        entry["duration_s"] = round(time.perf_counter() - t0, 3)
        entry["artifacts"] = artifacts.list_artifacts(run_dir).get(step.name, [])
        entry["status"] = "failed" if error else "ok"
        entry["error"] = error
        if error:
            summary["status"] = "failed"
            summary["finished"] = _now()
            write_json(run_dir / SUMMARY, summary)
            echo(f"  step {step.name!r} failed: {error}")
            break
        echo(f"  ok in {entry['duration_s']:.1f} s, artifacts: {', '.join(entry['artifacts']) or 'none'}")
        write_json(run_dir / SUMMARY, summary)
    else:
        summary["status"] = "ok"
        summary["finished"] = _now()
        write_json(run_dir / SUMMARY, summary)
    from m3lab.pipeline.report import build_report
    build_report(run_dir)
    return RunResult(run_dir, summary)


class _step_env:
    """Set M3LAB_RUN_DIR / M3LAB_STEP for the kernel papermill starts (it inherits os.environ)."""

    def __init__(self, run_dir: Path, step: str):
        self.values = {artifacts.RUN_DIR_ENV: str(run_dir.resolve()), artifacts.STEP_ENV: step}

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _step_entry(i: int, step: Step) -> dict[str, Any]:
    return {"name": step.name, "notebook": str(step.notebook), "output": f"{i:02d}_{step.notebook.name}"
            if not step.notebook.name[:2].isdigit() else step.notebook.name,
            "status": "pending", "started": None, "duration_s": None, "artifacts": [], "error": None}


def _new_run_dir(out_dir: Path, name: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for k in range(1, 1000):
        cand = out_dir / (f"{name}-{stamp}" if k == 1 else f"{name}-{stamp}-{k}")
        try:
            cand.mkdir(parents=True)
            return cand
        except FileExistsError:
            continue
    raise M3LabError(f"could not create a run folder under {out_dir}")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
