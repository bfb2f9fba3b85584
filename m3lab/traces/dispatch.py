"""The m3lab dispatch trace: JSON Lines, one header line, then one record per dispatched call.

Format (version 1; documented in m3lab/traces/README.md)::

    {"format": "m3lab.dispatch", "version": 1, "device": "cpu", "commit": "6ffbd4c",
     "model": "minimax-m3-mini", "plan": {"tp": 4, "ep": 1}, ...extra header keys}
    {"seq": 0, "op": "attention", "layer": 3, "shapes": {"q": [8, 16, 128]},
     "dtypes": {"q": "bfloat16"}, "path": "sparse_paged", "kernels": ["sparse_paged_attn"],
     "rejected": [{"path": "...", "condition": "..."}], "device": "cuda:0", "t_us": 12.5}

``rejected`` lists, for every declared path that was *not* taken, the readable condition that
failed. ``t_us`` (measured time of the call in µs) is optional. Files ending in ``.gz`` are gzip.

The dispatcher (:mod:`m3lab.dispatch`) writes through :class:`DispatchTraceWriter`;
:func:`read_dispatch_trace` returns one DataFrame row per call with the header in ``df.attrs``.
"""
from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.provenance import commit as provenance_commit
from m3lab.traces.files import iter_lines

FORMAT = "m3lab.dispatch"
VERSION = 1
RECORD_KEYS = ("seq", "op", "layer", "shapes", "dtypes", "path", "kernels", "rejected")
COLUMNS = ("seq", "op", "layer", "path", "kernels", "rejected", "shapes", "dtypes", "device", "t_us")


def _dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``; strings pass through."""
    return str(dtype).removeprefix("torch.")


def _dims(shape: Any) -> list[int]:
    return [int(d) for d in shape]


def _rejections(rejected: Iterable[Any]) -> list[dict[str, str]]:
    """Accept ``{"path", "condition"}`` dicts or ``(path, condition)`` pairs."""
    out = []
    for item in rejected:
        if isinstance(item, Mapping):
            out.append({"path": str(item["path"]), "condition": str(item["condition"])})
        else:
            path, condition = item
            out.append({"path": str(path), "condition": str(condition)})
    return out


class DispatchTraceWriter:
    """Write a dispatch trace (JSON Lines; gzip when the name ends in ``.gz``).

    >>> with DispatchTraceWriter("run.jsonl.gz", device="cuda:0", model="minimax-m3",
    ...                          plan={"tp": 4}) as w:
    ...     w.write("attention", layer=3, shapes={"q": [8, 16, 128]}, dtypes={"q": "bfloat16"},
    ...             path="sparse_paged", kernels=["sparse_paged_attn"],
    ...             rejected=[("torch_ref", "not chosen: lower priority")])
    """

    def __init__(self, path: str | Path, *, device: str, commit: str | None = None,
                 model: str | None = None, plan: Mapping[str, Any] | None = None, **extra: Any):
        self.path = Path(path)
        self.device = str(device)
        self.header = {"format": FORMAT, "version": VERSION, "device": self.device,
                       "commit": commit or provenance_commit(),
                       "model": model, "plan": dict(plan or {}), **extra}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        raw = gzip.open(self.path, "wb") if self.path.name.endswith(".gz") else open(self.path, "wb")
        self._fh = io.TextIOWrapper(raw, encoding="utf-8")
        self._seq = 0
        self._emit(self.header)

    def _emit(self, obj: Mapping[str, Any]) -> None:
        self._fh.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def write(self, op: str, *, layer: int, shapes: Mapping[str, Any], dtypes: Mapping[str, Any],
              path: str, kernels: Iterable[str] = (), rejected: Iterable[Any] = (),
              device: str | None = None, t_us: float | None = None) -> dict[str, Any]:
        """Append one call: op, layer (-1 for non-layer ops), shapes {name: dims}, dtypes {name:
        dtype}, the path that ran, its kernel names, and the (path, failed condition) of every
        path not taken. Returns the record written."""
        if not op or not path:
            raise M3LabError("dispatch record needs a non-empty op and path", field="op/path")
        record: dict[str, Any] = {
            "seq": self._seq, "op": str(op), "layer": int(layer),
            "shapes": {str(k): _dims(v) for k, v in shapes.items()},
            "dtypes": {str(k): _dtype_name(v) for k, v in dtypes.items()},
            "path": str(path), "kernels": [str(k) for k in kernels],
            "rejected": _rejections(rejected), "device": str(device or self.device)}
        if t_us is not None:
            record["t_us"] = float(t_us)
        self._emit(record)
        self._seq += 1
        return record

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> "DispatchTraceWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _parse_line(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise M3LabError(f"{path}: line {number} is not valid JSON ({err.msg} at column {err.colno})",
                         field="TRACE", hint="the trace is truncated or corrupt; re-record it") from None
    if not isinstance(obj, dict):
        raise M3LabError(f"{path}: line {number} is not a JSON object", field="TRACE",
                         hint="each line of a dispatch trace is one JSON object")
    return obj


def _check_header(path: Path, header: dict[str, Any]) -> None:
    if header.get("format") != FORMAT:
        raise M3LabError(f"{path}: line 1 is not an m3lab dispatch-trace header "
                         f"(format={header.get('format')!r})", field="TRACE",
                         hint=f'the first line must be {{"format": "{FORMAT}", "version": {VERSION}, ...}}')
    version = header.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise M3LabError(f"{path}: dispatch-trace version {version!r} is not supported (reader knows "
                         f"<= {VERSION})", field="version", hint="update m3lab or re-record the trace")


def _check_record(path: Path, number: int, rec: dict[str, Any]) -> None:
    missing = [k for k in RECORD_KEYS if k not in rec]
    if missing:
        raise M3LabError(f"{path}: line {number} lacks {', '.join(missing)}", field="TRACE",
                         hint="each record needs " + ", ".join(RECORD_KEYS))
    if not isinstance(rec["shapes"], dict) or not isinstance(rec["dtypes"], dict):
        raise M3LabError(f"{path}: line {number}: shapes and dtypes must be objects", field="TRACE")
    if not isinstance(rec["kernels"], list) or not isinstance(rec["rejected"], list):
        raise M3LabError(f"{path}: line {number}: kernels and rejected must be lists", field="TRACE")
    for item in rec["rejected"]:
        if not isinstance(item, dict) or "path" not in item or "condition" not in item:
            raise M3LabError(f"{path}: line {number}: each rejected entry needs path and condition",
                             field="TRACE")


def read_dispatch_header(path: str | Path) -> dict[str, Any]:
    """The header line of a dispatch trace (validated)."""
    path = Path(path)
    for number, line in iter_lines(path):
        header = _parse_line(path, number, line)
        _check_header(path, header)
        return header
    raise M3LabError(f"{path}: empty dispatch trace", field="TRACE", hint="no header line")


def read_dispatch_trace(path: str | Path) -> pd.DataFrame:
    """Read a dispatch trace into one row per call.

    Columns: seq, op, layer, path, kernels (list[str]), rejected (list of {path, condition}),
    shapes (dict name -> dims), dtypes (dict), device, t_us (NaN when not recorded).
    ``df.attrs``: ``format`` ("m3lab.dispatch"), ``header`` (the header dict), ``source``.
    Raises M3LabError naming the line for a corrupt, truncated or malformed file.
    """
    path = Path(path)
    header: dict[str, Any] | None = None
    rows = []
    for number, line in iter_lines(path):
        if not line.strip():
            continue
        obj = _parse_line(path, number, line)
        if header is None:
            _check_header(path, obj)
            header = obj
            continue
        _check_record(path, number, obj)
        obj.setdefault("device", header.get("device"))
        obj.setdefault("t_us", float("nan"))
        rows.append({k: obj[k] for k in COLUMNS})
    if header is None:
        raise M3LabError(f"{path}: empty dispatch trace", field="TRACE", hint="no header line")
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["t_us"] = df["t_us"].astype(float)
    df.attrs.update({"format": FORMAT, "header": header, "source": str(path)})
    return df


def rejections(dispatch: pd.DataFrame) -> pd.DataFrame:
    """One row per (call, path not taken): seq, op, layer, ran (the path chosen), rejected_path,
    condition. Answers "why did the fast path not run?" with a group-by."""
    rows = [{"seq": r.seq, "op": r.op, "layer": r.layer, "ran": r.path,
             "rejected_path": item["path"], "condition": item["condition"]}
            for r in dispatch.itertuples(index=False) for item in r.rejected]
    return pd.DataFrame(rows, columns=["seq", "op", "layer", "ran", "rejected_path", "condition"])
