"""Where things live and where a number came from: the repository root, the commit, the device, the date.

The one owner of these facts (every other module imports them from here):

- :data:`REPO_ROOT`: the folder that holds the ``m3lab`` package (the checkout; ``site-packages`` when
  installed), with :data:`TRACES_DIR` (``traces/``), :data:`TRACES_BENCH` (``traces/bench/``),
  :data:`NOTEBOOKS_DIR` and :data:`KERNELS_DIR` beside it;
- :func:`commit`: ``$GIT_COMMIT`` when set (a GPU box receives the tree without ``.git``), else the checkout's
  abbreviated sha (``git rev-parse --short HEAD``, ``-dirty`` when tracked files changed), else ``"unknown"``;
- :func:`device_name`: the accelerator torch sees (``"NVIDIA H200"``), else :func:`cpu_name`;
- :func:`today`: the UTC date, ``YYYY-MM-DD``;
- :func:`append_csv`: rows appended to a CSV table under ``traces/`` (header written once, never repeated).

Ground floor: imports nothing of m3lab but :mod:`m3lab.errors` (and the kernels' device helper, lazily).
"""
from __future__ import annotations

import csv
import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from m3lab.errors import M3LabError

REPO_ROOT = Path(__file__).resolve().parent.parent
TRACES_DIR = REPO_ROOT / "traces"
TRACES_BENCH = TRACES_DIR / "bench"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
KERNELS_DIR = REPO_ROOT / "kernels"
UNKNOWN = "unknown"


def commit(repo: str | os.PathLike | None = None) -> str:
    """The commit a result belongs to: ``$GIT_COMMIT``, else ``git rev-parse --short HEAD`` of ``repo``
    (default :data:`REPO_ROOT`) with ``-dirty`` when tracked files differ from it, else ``"unknown"``."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    cwd = Path(repo) if repo is not None else REPO_ROOT
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    return (sha + ("-dirty" if dirty else "")) if sha else UNKNOWN


def cpu_name() -> str:
    """``"cpu: <model> (<n> cores)"``: the processor's model name from /proc/cpuinfo where there is one."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {model} ({os.cpu_count()} cores)"


def device_name() -> str:
    """The accelerator torch sees (``"NVIDIA H200"``, ``"AMD Instinct MI355X"``), else :func:`cpu_name`."""
    try:
        import torch  # heavy: only a stamp needs it, not importing this module
        from m3lab.kernels.device import device_name as accelerator
        if torch.cuda.is_available():
            return accelerator("cuda")
    except Exception:  # torch missing or broken: still record the CPU
        pass
    return cpu_name()


def today() -> str:
    """The UTC date, ``YYYY-MM-DD``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")


def stamp() -> dict[str, str]:
    """``{"device", "commit", "date"}`` of a measurement taken now."""
    return {"device": device_name(), "commit": commit(), "date": today()}


def _cell(value) -> object:
    return f"{value:.6g}" if isinstance(value, float) else ("" if value is None else value)


def append_csv(path: str | os.PathLike, rows: Iterable[Mapping], columns: Sequence[str]) -> Path:
    """Append ``rows`` (mappings; missing columns left empty, floats as ``%.6g``) to the CSV at ``path``.

    The header ``columns`` is written when the file is new or empty; a file whose header differs is refused
    (appending would misalign every row).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    if not new:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if header != list(columns):
            raise M3LabError(f"{path}: its header {header} is not the table's columns {list(columns)}",
                             field=str(path), hint="move the old table aside or rewrite it with the current columns")
    rows = [dict(row) for row in rows]
    unknown = sorted({k for row in rows for k in row} - set(columns))
    if unknown:
        raise M3LabError(f"{path}: rows have columns {unknown} the table does not have", field=str(path))
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in columns})
    return path
