"""The run folder on disk: its file names, reading ``summary.json``, creating folders, and the run lock.

Shared by the runner (which writes a run folder), the report (which reads one) and sweeps (which make
folders of run folders). Paths inside ``summary.json`` are relative to the run folder (executed notebooks,
artifacts) or to the notebooks folder (a step's source notebook), so a run folder can be moved, copied off
a GPU box, resumed or re-reported from another checkout.
"""
from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from m3lab.errors import M3LabError

SUMMARY = "summary.json"
REPORT = "report.html"
LOCK = ".lock"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=+-]+")


def load_summary(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Read and check a run folder's summary.json (one-line M3LabError if it is not a readable run folder)."""
    run_dir = Path(run_dir)
    path = run_dir / SUMMARY
    if not run_dir.is_dir():
        raise M3LabError(f"{run_dir} is not a run folder (no such folder)", field="run_dir",
                         hint="pass a folder made by 'm3lab run', e.g. runs/checklist-20261129-120000")
    if not path.is_file():
        raise M3LabError(f"{run_dir} is not a run folder: it has no {SUMMARY}", field="run_dir",
                         hint="pass a folder made by 'm3lab run', e.g. runs/checklist-20261129-120000")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise M3LabError(f"{path} is not valid JSON ({err.msg} at line {err.lineno})", field="summary.json",
                         hint="the run folder is damaged; start a new run") from None
    except (OSError, UnicodeDecodeError) as err:
        raise M3LabError(f"{path} cannot be read ({getattr(err, 'strerror', None) or err})",
                         field="summary.json") from None
    _check_summary(summary, path)
    return summary


def _check_summary(summary: Any, path: Path) -> None:
    bad = "a JSON object with a list of steps" if not isinstance(summary, dict) else None
    if bad is None and not isinstance(summary.get("steps"), list):
        bad = "a 'steps' list"
    if bad is None:
        for i, step in enumerate(summary["steps"]):
            if not isinstance(step, dict) or not {"name", "status", "output"} <= set(step):
                bad = f"steps[{i}] with name, status and output"
                break
    if bad:
        raise M3LabError(f"{path} is not an m3lab run summary: it needs {bad}", field="summary.json",
                         hint="the run folder is damaged; start a new run")


def new_run_dir(out_dir: str | os.PathLike, name: str, *, stamp: bool = True) -> Path:
    """Create ``<out_dir>/<name>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3`` … on a collision) and return it.

    With ``stamp=False`` the folder is ``<out_dir>/<name>`` (``-2`` … on a collision). Safe against
    several processes creating folders in the same second: ``mkdir`` either creates or fails.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise M3LabError(f"--out {out_dir} is a file, not a folder", field="out", hint="give a folder path")
    base = f"{safe_name(name)}-{datetime.now().strftime('%Y%m%d-%H%M%S')}" if stamp else safe_name(name)
    for k in range(1, 1000):
        cand = out_dir / (base if k == 1 else f"{base}-{k}")
        try:
            cand.mkdir(parents=True)
            return cand
        except FileExistsError:
            continue
    raise M3LabError(f"could not create a run folder under {out_dir}", field="out")


def safe_name(text: str, limit: int = 80) -> str:
    """A folder name made of ``text`` (``tp=8,concurrency=64``): unsafe characters become ``_``."""
    name = _UNSAFE.sub("_", text).strip("._") or "run"
    return name[:limit]


def relative(path: str | os.PathLike, base: str | os.PathLike) -> str:
    """``path`` relative to ``base`` (POSIX separators), for storing in summary.json / sweep.json."""
    return Path(os.path.relpath(Path(path).resolve(), Path(base).resolve())).as_posix()


class RunLock:
    """An exclusive lock on a run folder for the life of this process's run or resume.

    ``filelock.FileLock`` on ``<run_dir>/.lock`` (``flock`` underneath: the kernel releases it when the process
    ends, however it ends, so a crashed run never leaves a folder locked). The file records the holder's pid
    for the message.
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK
        self._lock = FileLock(self.path, timeout=0)

    def __enter__(self) -> "RunLock":
        try:
            self._lock.acquire()
        except Timeout:
            try:
                holder = self.path.read_text(errors="replace").strip()[:64] or "another process"
            except OSError:
                holder = "another process"
            raise M3LabError(f"run folder {self.path.parent} is in use by pid {holder}", field="run_dir",
                             hint="wait for that run to finish, or start a new run") from None
        try:
            self.path.write_text(str(os.getpid()))
        except OSError:  # a full disk: the lock holds without the pid
            pass
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()
