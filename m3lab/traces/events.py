"""Summaries of a loaded trace: per-kernel time shares of a kernel-events table (columns:
:mod:`m3lab.traces.table`), per (op, path) counts of a dispatch trace, per (op, kernels) counts of an
AITER log (:func:`summarize`), and the JSON-ready totals (:func:`summary_totals`)."""
from __future__ import annotations

import json
from typing import Any

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.traces.aiter_log import summarize_aiter_log
from m3lab.traces.table import ATTRIBUTIONS, short_kernel_name, trace_format

def _numbered(names: pd.Series) -> pd.Series:
    """Short names made unique: template instances that share one get `` #1``, `` #2`` ... (by total time)."""
    rank = names.groupby(names).cumcount() + 1
    shared = names.map(names.value_counts()) > 1
    return names.where(~shared, names + " #" + rank.astype(str))


def summarize_events(events: pd.DataFrame, by: str = "name") -> pd.DataFrame:
    """Per kernel (``by="name"``, or ``"short_name"`` to merge template variants, or any column such
    as ``"cpu_op"``): short_name (unique: template instances sharing one are numbered `` #1``, `` #2`` by
    total time), kind, count, total_us, mean_us, share (of the summed GPU activity time of all
    rows, overlapping streams counted separately), and how many calls were attributed to an
    operator / a plain launch / a graph launch / nothing. ``attrs["total_us"]`` is the sum."""
    cols = ["name", "short_name", "kind", "count", "total_us", "mean_us", "share", *ATTRIBUTIONS]
    if events.empty:
        return pd.DataFrame(columns=cols)
    if by == "short_name" and "short_name" not in events.columns:
        events = events.assign(short_name=events["name"].map(short_kernel_name))
    if by not in events.columns:
        raise M3LabError(f"summarize: no column {by!r} to group by", field="by",
                         hint="use name, short_name, cpu_op, kind, stream, ...")
    key = events[by].astype(object).where(events[by].notna(), "(none)").astype(str)
    counts = pd.crosstab(key, events["attribution"])
    for a in ATTRIBUTIONS:
        if a not in counts.columns:
            counts[a] = 0
    g = events.groupby(key, sort=False)
    out = pd.DataFrame({"kind": g["kind"].first(), "count": g.size(), "total_us": g["dur_us"].sum(),
                        "mean_us": g["dur_us"].mean()})
    out = out.join(counts[list(ATTRIBUTIONS)])
    out.index.name = "name"
    out = out.reset_index()
    total = float(events["dur_us"].sum())
    out["share"] = out["total_us"] / total if total > 0 else float("nan")
    out = out.sort_values("total_us", ascending=False, kind="stable").reset_index(drop=True)
    out["short_name"] = _numbered(out["name"].map(short_kernel_name)) \
        if by == "name" else out["name"]
    out = out[cols]
    out.attrs.update({"total_us": total, "n_events": int(len(events)), "by": by,
                      "source": events.attrs.get("source"), "device_name": events.attrs.get("device_name")})
    return out


def summarize_dispatch(dispatch: pd.DataFrame) -> pd.DataFrame:
    """Per (op, path) of a dispatch trace: calls, layers, kernels, total t_us and its share
    (NaN when the trace carries no timings), and how often another path was rejected."""
    cols = ["op", "path", "calls", "layers", "kernels", "total_us", "share", "rejected_paths"]
    if dispatch.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (op, path), grp in dispatch.groupby(["op", "path"], sort=False):
        kernels = sorted({k for ks in grp["kernels"] for k in ks})
        rejected = sorted({item["path"] for items in grp["rejected"] for item in items})
        rows.append({"op": op, "path": path, "calls": len(grp), "layers": int(grp["layer"].nunique()),
                     "kernels": ", ".join(kernels), "total_us": grp["t_us"].sum(min_count=1),
                     "rejected_paths": ", ".join(rejected)})
    out = pd.DataFrame(rows)
    total = float(dispatch["t_us"].sum())
    out["share"] = out["total_us"] / total if total > 0 else float("nan")
    return out[cols]


def summarize(trace: pd.DataFrame, by: str = "name") -> pd.DataFrame:
    """Per-kernel time shares of a kernel-events table (Kineto, rocprofv3), per (op, path) counts of a
    dispatch trace, or per (op, kernels) counts of an AITER log; picks by ``trace_format``.

    Kernel tables give: name, short_name, kind, count, total_us, mean_us, share, and the counts
    per attribution (cpu_op, launch, graph_launch, unattributed); ``attrs["total_us"]`` is the sum.
    ``by`` (kernel tables only) groups by another column: ``"short_name"``, ``"cpu_op"``, ...
    """
    fmt = trace_format(trace)
    if fmt == "m3lab.dispatch":
        return summarize_dispatch(trace)
    if fmt == "aiter-log":
        return summarize_aiter_log(trace)
    return summarize_events(trace, by=by)


def summary_totals(trace: pd.DataFrame) -> dict[str, Any]:
    """A JSON-ready dict: format, row count, total GPU time (µs) and rows per attribution."""
    fmt = trace_format(trace)
    out: dict[str, Any] = {"format": fmt, "source": trace.attrs.get("source"), "rows": int(len(trace))}
    if "dur_us" in trace.columns:
        out["total_us"] = float(trace["dur_us"].sum())
        out["attribution"] = {a: int((trace["attribution"] == a).sum()) for a in ATTRIBUTIONS}
        out["kinds"] = {str(k): int(v) for k, v in trace["kind"].value_counts().items()}
        if trace.attrs.get("device_name"):
            out["device_name"] = trace.attrs["device_name"]
    if fmt == "m3lab.dispatch":
        out["header"] = json.loads(json.dumps(trace.attrs.get("header", {}), default=str))
    return out
