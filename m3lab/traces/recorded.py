"""The real traces committed under the repository's ``traces/`` folder (GPU captures of the reference model)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd

from m3lab.provenance import TRACES_DIR

_KINDS = {"dispatch": "*.dispatch.jsonl.gz", "kineto": "*.kineto.json.gz"}


def recorded_traces(root: str | Path | None = None) -> pd.DataFrame:
    """One row per committed trace: ``name, kind (dispatch|kineto), device, commit, path``, oldest first.

    Device and commit come from the capture's ``<name>.summary.json`` (or the dispatch header).
    An installed wheel carries no traces: the table is then empty.
    """
    root = Path(root) if root is not None else TRACES_DIR
    rows = []
    for kind, pattern in _KINDS.items():
        for path in sorted((root / ("dispatch" if kind == "dispatch" else "profiler")).glob(pattern)):
            name = path.name.split(".")[0]
            meta = _meta(root / "dispatch" / f"{name}.summary.json", path if kind == "dispatch" else None)
            rows.append({"name": name, "kind": kind, "device": meta.get("device"), "commit": meta.get("commit"),
                         "path": str(path)})
    return pd.DataFrame(rows, columns=["name", "kind", "device", "commit", "path"])


def _meta(summary: Path, dispatch: Path | None) -> dict:
    if summary.is_file():
        return json.loads(summary.read_text())
    if dispatch is not None:
        with gzip.open(dispatch, "rt") as f:
            return json.loads(f.readline())
    return {}
