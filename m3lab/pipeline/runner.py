"""Execute a pipeline with papermill into a run folder, and resume a failed or changed run.

Run folder ``runs/<pipeline>-<YYYYmmdd-HHMMSS>/`` (files: :mod:`m3lab.pipeline.run_folder`):

- ``NN_<notebook>.ipynb``: each executed notebook (a failed one keeps its traceback cell);
- ``artifacts/<step>/<name>.parquet|json``: what steps saved through :mod:`m3lab.artifacts`;
- ``summary.json``: parameters (what the pipeline file and ``-p`` set: what papermill injects), parameter_values
  (every value each step ran with, defaults included), environment (versions, git commit, device), each step's status,
  duration and artifacts, and the run's status (``running``, ``ok``, ``failed`` or ``interrupted``);
- ``report.html``: every executed notebook in one self-contained page (:mod:`m3lab.pipeline.report`);
- ``kernel.log``: what the notebook kernels' processes printed to stderr (their logs, not cell output).

Every file is written atomically (an executed notebook replaces its old copy only once it is complete and
readable), ``summary.json`` is rewritten after each step, and a lock keeps a second run or resume out of a
folder in use. Paths in ``summary.json`` are relative, so a run folder can be resumed from another checkout.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from m3lab import artifacts
from m3lab.atomic import atomic_path, write_json
from m3lab.errors import M3LabError
from m3lab.pipeline import environment
from m3lab.pipeline.notebook_stack import require_notebook_stack
from m3lab.pipeline.params import parameter_values, resolve_parameters
from m3lab.pipeline.report import build_report
from m3lab.pipeline.run_folder import SUMMARY, RunLock, load_summary, new_run_dir, relative
from m3lab.pipeline.spec import DEFAULT_PIPELINE, Pipeline, Step, list_pipelines, load_pipeline, notebooks_dir

KERNEL = "python3"
# The kernel process's own stderr (its log: a warning about its localhost TCP sockets at every start, and
# tracebacks from its message loop when a run is interrupted) goes here, not to the terminal; what the
# notebook's cells print stays in the executed notebook.
KERNEL_LOG = "kernel.log"


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


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the summary says ``interrupted`` and names the step; ``run_dir`` can be resumed."""

    def __init__(self, run_dir: Path):
        super().__init__(str(run_dir))
        self.run_dir = run_dir


class _Incomplete(Exception):
    """The executed notebook papermill left behind is not a whole notebook (e.g. the disk filled up)."""


def run_pipeline(pipeline: str | os.PathLike | Pipeline = DEFAULT_PIPELINE, overrides: Iterable[str] = (),
                 out_dir: str | os.PathLike = "runs", *, progress: bool = True, echo: Callable[[str], None] = print,
                 folder_name: str | None = None) -> RunResult:
    """Validate every parameter, create a run folder and execute the steps in order.

    Raises :class:`M3LabError` before anything runs when a parameter is unknown, mistyped or has a value
    the library rejects. A step that raises stops the run; the summary marks it failed (see
    :func:`resume_run`). ``folder_name``: the run folder's name (default ``<pipeline>-<timestamp>``).
    """
    pipe = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
    overrides = list(overrides)
    params = resolve_parameters(pipe, overrides)
    require_notebook_stack()
    run_dir = new_run_dir(Path(out_dir), folder_name or pipe.name, stamp=folder_name is None)
    summary = _new_summary(pipe, run_dir, overrides, params)
    lock = RunLock(run_dir)
    try:
        lock.__enter__()
        write_json(run_dir / SUMMARY, summary)
    except OSError as err:   # a full or read-only disk before anything ran: leave no folder that cannot be resumed
        lock.__exit__(None, None, None)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise M3LabError(f"could not start a run in {run_dir.parent}: {err.strerror or err}", field="out",
                         hint="free some space or make the folder writable, then start the run again "
                              "(no run folder was kept)") from None
    try:
        return _execute(pipe, run_dir, summary, progress=progress, echo=echo)
    finally:
        lock.__exit__(None, None, None)


def _new_summary(pipe: Pipeline, run_dir: Path, overrides: list[str], params: dict) -> dict:
    return {
        "pipeline": pipe.name,
        "pipeline_file": relative(pipe.source, run_dir),
        "run_id": run_dir.name,
        "created": _now(),
        "finished": None,
        "status": "running",
        "overrides": overrides,
        "parameters": params,
        "parameter_values": parameter_values(pipe, params),
        "environment": environment.describe(),
        "steps": [_step_entry(i, s) for i, s in enumerate(pipe.steps)],
    }


def resume_run(run_dir: str | os.PathLike, overrides: Iterable[str] = (), *, pipeline: str | None = None,
               progress: bool = True, echo: Callable[[str], None] = print) -> RunResult:
    """Re-run the steps of ``run_dir`` that did not finish, with the parameters it was started with.

    ``overrides`` (``-p`` as for a new run) change those parameters: every step from the first one whose
    parameters change is run again. ``pipeline``, when given, must be the run's pipeline name.
    """
    run_dir = Path(run_dir)
    load_summary(run_dir)  # a clear error for a folder that is not a run folder, before taking the lock
    require_notebook_stack()
    with RunLock(run_dir):
        summary = load_summary(run_dir)
        if pipeline is not None and pipeline not in (summary["pipeline"], summary.get("pipeline_file")):
            raise M3LabError(f"--resume {run_dir}: that run is of pipeline {summary['pipeline']!r}, not {pipeline!r}",
                             field="pipeline", hint=f"drop the pipeline argument, or start a new {pipeline} run")
        pipe = _run_pipeline_of(summary, run_dir)
        names = [s["name"] for s in summary["steps"]]
        if names != [s.name for s in pipe.steps]:
            raise M3LabError(f"cannot resume {run_dir}: pipeline {pipe.name!r} now has other steps "
                             f"({', '.join(s.name for s in pipe.steps)}; the run had {', '.join(names)})",
                             field="pipeline", hint="start a new run")
        stored = Pipeline(pipe.name, pipe.description,
                          tuple(Step(s.name, s.notebook, summary["parameters"].get(s.name, {})) for s in pipe.steps),
                          pipe.source)
        overrides = list(overrides)
        # The notebooks may have been fixed since: check the stored parameters (and any new ones) against them.
        params = resolve_parameters(stored, overrides)
        changed = next((i for i, s in enumerate(pipe.steps)
                        if params[s.name] != summary["parameters"].get(s.name, {})), None)
        if changed is not None:
            for entry in summary["steps"][changed:]:
                entry.update(status="pending", started=None, duration_s=None, artifacts=[], error=None)
                _clear_artifacts(run_dir, entry["name"])
            echo(f"parameters changed from step {summary['steps'][changed]['name']!r} on: re-running it and the "
                 f"steps after it")
        _reopen_lost_steps(run_dir, summary, echo)
        summary["parameters"] = params
        summary["parameter_values"] = parameter_values(pipe, params)
        summary["overrides"] = summary.get("overrides", []) + overrides
        summary["pipeline_file"] = relative(pipe.source, run_dir)
        summary["status"] = "running"
        summary["finished"] = None
        summary["resumed"] = summary.get("resumed", []) + [_now()]
        summary["environment"] = environment.describe()
        _write_summary(run_dir, summary)
        return _execute(pipe, run_dir, summary, progress=progress, echo=echo)


def _reopen_lost_steps(run_dir: Path, summary: dict, echo) -> None:
    """A finished step whose executed notebook is missing or unreadable (a partial copy of the run folder) is
    run again: its entry goes back to pending, so the report and the summary never point at a lost notebook."""
    for entry in summary["steps"]:
        if entry["status"] != "ok":
            continue
        problem = notebook_problem(run_dir / entry["output"])
        if problem:
            echo(f"step {entry['name']!r}: its executed notebook {entry['output']} {problem}; running it again")
            entry.update(status="pending", started=None, duration_s=None, error=None)


def notebook_problem(path: Path) -> str | None:
    """None when ``path`` is a readable notebook, else what is wrong with it ('is missing', 'cannot be read
    (NotJSONError)')."""
    if not path.is_file():
        return "is missing"
    try:
        _check_complete(path)
    except _Incomplete as err:
        return f"cannot be read ({str(err).split(': ')[-1]})"
    return None


def _run_pipeline_of(summary: dict, run_dir: Path) -> Pipeline:
    """The run's pipeline: its file (stored relative to the run folder), else the built-in of that name."""
    ref = summary.get("pipeline_file")
    if ref:
        path = Path(ref) if Path(ref).is_absolute() else run_dir / ref
        if path.is_file():
            return load_pipeline(path)
    if summary.get("pipeline") in list_pipelines():
        return load_pipeline(summary["pipeline"])
    raise M3LabError(f"cannot resume {run_dir}: its pipeline file {ref!r} is not found from here and "
                     f"{summary.get('pipeline')!r} is not a built-in pipeline", field="pipeline",
                     hint="copy the pipeline file beside the run folder as it was, or start a new run")


def _clear_artifacts(run_dir: Path, step: str) -> None:
    shutil.rmtree(artifacts.artifacts_dir(run_dir) / step, ignore_errors=True)


def _run_notebook(step, out: Path, parameters: dict, run_dir: Path, progress: bool) -> str | None:
    """Execute ``step``'s notebook into ``out`` (kernel output appended to the run's kernel log): the error in one
    line, None when every cell ran. Ctrl-C, in this process or in the kernel, raises KeyboardInterrupt."""
    import papermill as pm  # the notebook stack, absent on a bare GPU box
    from papermill.exceptions import PapermillExecutionError

    try:
        with open(run_dir / KERNEL_LOG, "ab") as kernel_log:
            pm.execute_notebook(str(step.notebook), str(out), parameters=parameters, kernel_name=KERNEL,
                                progress_bar=progress, cwd=str(run_dir), language="python",
                                log_output=False, kernel_manager_class=_kernel_manager(kernel_log))
    except PapermillExecutionError as err:
        if err.ename == "KeyboardInterrupt":
            raise KeyboardInterrupt from None
        return f"{err.ename}: {err.evalue}"
    except KeyboardInterrupt:
        raise
    except Exception as err:  # the kernel died, the notebook could not be written, ...
        return f"{type(err).__name__}: {err}"
    return None


def _execute(pipe: Pipeline, run_dir: Path, summary: dict, *, progress: bool, echo) -> RunResult:
    _quiet_papermill_inspection()
    todo = [(i, s) for i, s in enumerate(pipe.steps) if summary["steps"][i]["status"] != "ok"]
    done = len(pipe.steps) - len(todo)
    if done:
        echo(f"resuming: {done} finished step(s) kept, {len(todo)} to run")
    for n, (i, step) in enumerate(todo, start=1):
        entry = summary["steps"][i]
        echo(f"[{done + n}/{len(pipe.steps)}] {step.name} ({step.notebook.name})")
        entry.update(status="running", started=_now(), error=None)
        _write_summary(run_dir, summary)
        t0 = time.perf_counter()
        error = None
        try:
            with _step_env(run_dir, step.name), atomic_path(run_dir / entry["output"]) as tmp:
                error = _run_notebook(step, tmp, summary["parameters"][step.name], run_dir, progress)
                _check_complete(tmp)  # a half-written notebook never replaces the last good one
        except KeyboardInterrupt:
            entry.update(status="interrupted", error="interrupted (Ctrl-C)",
                         duration_s=round(time.perf_counter() - t0, 3))
            summary.update(status="interrupted", finished=_now())
            _write_quietly(run_dir, summary, echo)
            _report_quietly(run_dir, echo)
            raise RunInterrupted(run_dir) from None
        except (_Incomplete, OSError) as err:
            error = error or f"{type(err).__name__}: {err}"
            if isinstance(err, _Incomplete):
                error += " (the executed notebook could not be written completely; nothing of it was kept)"
        entry["duration_s"] = round(time.perf_counter() - t0, 3)
        entry["artifacts"] = artifacts.list_artifacts(run_dir).get(step.name, [])
        entry["status"] = "failed" if error else "ok"
        entry["error"] = error
        if error:
            summary["status"] = "failed"
            summary["finished"] = _now()
            _write_quietly(run_dir, summary, echo)
            echo(f"  step {step.name!r} failed: {error}")
            break
        echo(f"  ok in {entry['duration_s']:.1f} s, artifacts: {', '.join(entry['artifacts']) or 'none'}")
        _write_summary(run_dir, summary)
    else:
        summary["status"] = "ok"
        summary["finished"] = _now()
        _write_summary(run_dir, summary)
    _report_quietly(run_dir, echo)
    return RunResult(run_dir, summary)


class _UnparsedLine(logging.Filter):
    """Drops papermill's "Unable to parse line N" and nothing else. papermill re-reads a parameters cell with a regex
    only to warn about unknown parameters, which :mod:`m3lab.pipeline.params` has already checked with Python's own
    parser; the regex fails on any line with '=' in its comment (``accept_len = 2.7  # with spec_tokens=3``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Unable to parse line")


def _quiet_papermill_inspection() -> None:
    log = logging.getLogger("papermill.translators")
    if not any(isinstance(f, _UnparsedLine) for f in log.filters):
        log.addFilter(_UnparsedLine())


def _kernel_manager(stderr):
    """jupyter_client's kernel manager, starting the kernel with its stderr going to ``stderr`` (a file)."""
    from jupyter_client.manager import AsyncKernelManager

    class LoggedKernelManager(AsyncKernelManager):
        async def start_kernel(self, **kw):
            kw.setdefault("stderr", stderr)
            return await super().start_kernel(**kw)

    return LoggedKernelManager


def _check_complete(path: Path) -> None:
    import nbformat
    try:
        nbformat.read(path, as_version=4)
    except Exception as err:  # truncated JSON, a missing file, an unreadable disk
        raise _Incomplete(f"{path.name}: {type(err).__name__}") from None


def _write_summary(run_dir: Path, summary: dict) -> None:
    """Rewrite summary.json; an OS error (a full or read-only disk) becomes one line saying how to go on."""
    try:
        write_json(run_dir / SUMMARY, summary)
    except OSError as err:
        raise M3LabError(f"cannot write {run_dir / SUMMARY}: {err.strerror or err}", field="run_dir",
                         hint=f"free some space or make the folder writable, then: m3lab run --resume {run_dir}"
                         ) from None


def _write_quietly(run_dir: Path, summary: dict, echo) -> None:
    """Write the summary after a failure or Ctrl-C; a full disk must not hide the first error."""
    try:
        write_json(run_dir / SUMMARY, summary)
    except OSError as err:
        echo(f"  could not update {SUMMARY}: {err.strerror or err}")


def _report_quietly(run_dir: Path, echo) -> None:
    """Build report.html; on an OS error (a full disk, a read-only folder) say so instead of failing the run."""
    try:
        build_report(run_dir)
    except OSError as err:
        echo(f"report not written: {err.strerror or err} (rebuild it later with: m3lab report {run_dir})")


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
    nb_dir = notebooks_dir().resolve()
    notebook = (step.notebook.relative_to(nb_dir).as_posix() if step.notebook.is_relative_to(nb_dir)
                else step.notebook.name)
    return {"name": step.name, "notebook": notebook, "output": f"{i:02d}_{step.notebook.name}"
            if not step.notebook.name[:2].isdigit() else step.notebook.name,
            "status": "pending", "started": None, "duration_s": None, "artifacts": [], "error": None}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
