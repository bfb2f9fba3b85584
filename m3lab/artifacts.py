"""Artifacts: the one way notebook steps hand results to later steps.

A DataFrame is saved as parquet, a dict (or list) as JSON, under
``<run_dir>/artifacts/<step>/<name>.{parquet,json}``. Inside a pipeline run the runner sets
``M3LAB_RUN_DIR`` and ``M3LAB_STEP``; in an interactive session artifacts go to
``runs/interactive/`` under the current directory. Writes are atomic.

    artifacts.save("gemm_shapes", df)        # in step 01
    df = artifacts.load("gemm_shapes")       # in any later step of the same run
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from m3lab.atomic import atomic_path, write_json
from m3lab.errors import M3LabError

RUN_DIR_ENV = "M3LAB_RUN_DIR"
STEP_ENV = "M3LAB_STEP"
INTERACTIVE_STEP = "interactive"


def run_dir() -> Path:
    """The current run folder (``$M3LAB_RUN_DIR``, else ``./runs/interactive``)."""
    return Path(os.environ.get(RUN_DIR_ENV) or Path.cwd() / "runs" / "interactive")


def current_step() -> str:
    """The step being executed (``$M3LAB_STEP``, else ``interactive``)."""
    return os.environ.get(STEP_ENV) or INTERACTIVE_STEP


def artifacts_dir(run: str | os.PathLike | None = None) -> Path:
    return Path(run) / "artifacts" if run is not None else run_dir() / "artifacts"


class Saved(os.PathLike):
    """Where :func:`save` wrote an artifact: a path (``os.fspath`` works) shown relative to the run folder,
    so a notebook's output never leaks the absolute path of the machine it ran on."""

    def __init__(self, path: Path):
        self.path = path

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        try:
            shown = self.path.relative_to(run_dir()).as_posix()
        except ValueError:
            shown = self.path.name
        return f"saved {shown}"


def save(name: str, obj: Any, *, step: str | None = None) -> Saved:
    """Save a DataFrame (parquet) or a dict/list (JSON) under the current step; returns where (:class:`Saved`)."""
    _check_name(name)
    folder = artifacts_dir() / (step or current_step())
    if _is_dataframe(obj):
        target = folder / f"{name}.parquet"
        with atomic_path(target) as tmp:
            obj.to_parquet(tmp, index=not _has_default_index(obj))
        return Saved(target)
    if isinstance(obj, (dict, list)):
        return Saved(write_json(folder / f"{name}.json", obj))
    raise M3LabError(f"artifact {name!r}: cannot save a {type(obj).__name__}",
                     hint="save a pandas DataFrame (parquet) or a dict/list (JSON)")


def load(name: str, *, step: str | None = None, run: str | os.PathLike | None = None) -> Any:
    """Load an artifact saved earlier in this run (by any step unless ``step`` is given)."""
    _check_name(name)
    root = artifacts_dir(run)
    matches = sorted(p for p in root.glob(f"*/{name}.*") if p.suffix in (".parquet", ".json")
                     and (step is None or p.parent.name == step))
    if not matches:
        have = sorted({p.stem for p in root.glob("*/*") if p.suffix in (".parquet", ".json")})
        raise M3LabError(f"artifact {name!r} not found in {root}",
                         hint=f"available: {', '.join(have) or 'none'}; run the step that saves it first")
    if len(matches) > 1 and step is None:
        raise M3LabError(f"artifact {name!r} was saved by several steps ({', '.join(p.parent.name for p in matches)})",
                         hint="pass step=... to choose one")
    path = matches[0]
    if path.suffix == ".json":
        return json.loads(path.read_text(encoding="utf-8"))
    import pandas as pd
    return pd.read_parquet(path)


def list_artifacts(run: str | os.PathLike) -> dict[str, list[str]]:
    """``{step: [file names]}`` of the artifacts in a run folder."""
    root = artifacts_dir(run)
    out: dict[str, list[str]] = {}
    for p in sorted(root.glob("*/*")):
        if p.suffix in (".parquet", ".json"):
            out.setdefault(p.parent.name, []).append(p.name)
    return out


def _check_name(name: str) -> None:
    if not name or any(c in name for c in "/\\") or name.startswith("."):
        raise M3LabError(f"artifact name {name!r} is not a plain file name", hint="use letters, digits, '_' or '-'")


def _is_dataframe(obj: Any) -> bool:
    return type(obj).__name__ == "DataFrame" and hasattr(obj, "to_parquet")


def _has_default_index(df: Any) -> bool:
    import pandas as pd
    return isinstance(df.index, pd.RangeIndex) and df.index.start == 0 and df.index.step == 1
