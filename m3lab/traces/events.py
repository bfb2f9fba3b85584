"""The common kernel-events table, format sniffing (:func:`load_trace`) and :func:`summarize`.

Kernel-events table (one row per GPU activity; every reader returns exactly these columns):

=============  ======================================================================================
name           kernel name as recorded (mangled or demangled); memcpy/memset rows keep their label
kind           ``kernel`` | ``memcpy`` | ``memset``
start_us       start time, µs, in the source's clock (Kineto: µs since its epoch; rocprof: ns / 1000)
dur_us         duration, µs
stream         stream (Kineto) or queue (rocprof) id
device         GPU index
grid           (x, y, z) in thread blocks / workgroups (rocprof's work-item grid divided by the
               workgroup size), or None
block          (x, y, z) threads per block / workgroup, or None
correlation    the launch correlation id (links a kernel to its runtime launch), or <NA>
cpu_op         the CPU operator that launched it (Kineto ``cpu_op`` via External id), or None
input_dims     that operator's ``Input Dims`` when shapes were recorded, or None
input_types    that operator's ``Input type``, or None
launch         runtime call that launched it (``cudaLaunchKernel``, ``hipGraphLaunch``, ...), or None
attribution    ``cpu_op`` (launch + operator found) | ``launch`` (runtime launch only) |
               ``graph_launch`` (replayed from a CUDA/HIP graph; attributed to the graph launch) |
               ``unattributed`` (no host-side link in the file). Rows are never dropped.
annotation     innermost ``record_function`` / user annotation around the launch (Kineto), e.g.
               ``m3lab::attention[L3]`` from the dispatcher, or None
=============  ======================================================================================

``df.attrs``: ``format`` (kineto, rocprofv3-json, rocprofv3-csv, aiter-log, m3lab.dispatch),
``source`` (the path) and, when known, ``device_name``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.traces.files import head_text, iter_lines

COLUMNS = ("name", "kind", "start_us", "dur_us", "stream", "device", "grid", "block", "correlation",
           "cpu_op", "input_dims", "input_types", "launch", "attribution", "annotation")
ATTRIBUTIONS = ("cpu_op", "launch", "graph_launch", "unattributed")
_INT_COLUMNS = ("stream", "device", "correlation")


def make_events(rows: Iterable[dict[str, Any]], *, fmt: str, source: str | Path,
                **meta: Any) -> pd.DataFrame:
    """Build a kernel-events table from row dicts (missing keys -> None), sorted by start time."""
    df = pd.DataFrame(list(rows), columns=list(COLUMNS))
    df["start_us"] = df["start_us"].astype(float)
    df["dur_us"] = df["dur_us"].astype(float)
    for col in _INT_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    df["attribution"] = df["attribution"].astype(object).where(df["attribution"].notna(), "unattributed")
    df = df.sort_values("start_us", kind="stable").reset_index(drop=True)
    df.attrs.update({"format": fmt, "source": str(source), **meta})
    return df


_MANGLED_PART = re.compile(r"(\d+)")


def _demangle_prefix(name: str) -> str:
    """The qualified name of an Itanium-mangled symbol, without template or argument parts
    (``_ZN5aiter24add_rmsnorm_quant_kernelI...`` -> ``aiter::add_rmsnorm_quant_kernel``)."""
    s = name[3:] if name.startswith("_ZN") else name[2:]
    parts, i = [], 0
    while i < len(s):
        m = _MANGLED_PART.match(s, i)
        if not m:
            break
        n, start = int(m.group(1)), m.end()
        parts.append(s[start:start + n])
        i = start + n
        if not name.startswith("_ZN"):
            break
    return "::".join(parts) if parts else name


def short_kernel_name(name: str, width: int = 60) -> str:
    """A readable label for a kernel: ``void at::native::foo<bar>(int)`` -> ``at::native::foo``;
    Itanium-mangled names keep their qualified name; the result is cut to ``width`` characters."""
    s = str(name).strip()
    if s.startswith("_Z"):
        s = _demangle_prefix(s)
    s = s.removeprefix("void ").replace("(anonymous namespace)::", "")
    out, depth = [], 0
    for ch in s:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            if ch == "(" and out:
                break
            out.append(ch)
    s = "".join(out).strip() or str(name)
    return s if len(s) <= width else s[: width - 1] + "…"


_AITER_MARKERS = ("[fused_moe] ", "shape is M:", "shape is B:")


def _has_aiter_lines(path: str | Path) -> bool:
    """True when any line of a text log is an AITER dispatch line (the whole file is scanned)."""
    return any(any(m in line for m in _AITER_MARKERS) for _, line in iter_lines(path))


def sniff_format(path: str | Path) -> str:
    """Name the format of a trace file from its first bytes (gzip or plain):
    ``m3lab.dispatch``, ``rocprofv3-json``, ``kineto``, ``rocprofv3-csv`` or ``aiter-log``."""
    head = head_text(path, 8192)
    first = head.lstrip().split("\n", 1)[0]
    if first.startswith("{") and '"format"' in first and "m3lab.dispatch" in first:
        return "m3lab.dispatch"
    if "rocprofiler-sdk-tool" in head:
        return "rocprofv3-json"
    if head.lstrip().startswith(("{", "[")):
        return "kineto"
    if ("Kernel_Name" in first or "KernelName" in first) and ("Timestamp" in first or "BeginNs" in first):
        return "rocprofv3-csv"
    if _has_aiter_lines(path):
        return "aiter-log"
    raise M3LabError(f"{path}: unrecognised trace format (first line: {first[:80]!r})", field="TRACE",
                     hint="expected an m3lab dispatch trace, a Kineto JSON, a rocprofv3 CSV/JSON or an "
                          "AITER log, optionally gzipped")


def load_trace(path: str | Path) -> pd.DataFrame:
    """Load any supported trace, sniffing the format.

    Returns the kernel-events table (see module docstring) for Kineto and rocprofv3 files, the
    dispatch table of :func:`m3lab.traces.dispatch.read_dispatch_trace` for m3lab dispatch traces,
    and the table of :func:`m3lab.traces.aiter_log.read_aiter_log` for AITER logs;
    ``df.attrs["format"]`` says which.

    >>> ev = load_trace("../shared/data/kineto/tracelens_sglang_Qwen3-8B_decode_MI300X.json.gz")
    >>> summarize(ev).head()
    """
    from m3lab.traces import aiter_log, dispatch, kineto, rocprof

    fmt = sniff_format(path)
    readers = {"m3lab.dispatch": dispatch.read_dispatch_trace, "kineto": kineto.read_kineto,
               "rocprofv3-json": rocprof.read_rocprof_json, "rocprofv3-csv": rocprof.read_rocprof_csv,
               "aiter-log": aiter_log.read_aiter_log}
    return readers[fmt](path)


def trace_format(df: pd.DataFrame) -> str:
    """The format a table came from (``df.attrs["format"]``, else guessed from its columns)."""
    fmt = df.attrs.get("format")
    if fmt:
        return fmt
    if {"seq", "op", "path", "rejected"} <= set(df.columns):
        return "m3lab.dispatch"
    if {"op", "kernels", "key"} <= set(df.columns):
        return "aiter-log"
    return "events"


def summarize_events(events: pd.DataFrame, by: str = "name") -> pd.DataFrame:
    """Per kernel (``by="name"``, or ``"short_name"`` to merge template variants, or any column such
    as ``"cpu_op"``): kind, count, total_us, mean_us, share (of the summed GPU activity time of all
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
    out["short_name"] = out["name"].map(short_kernel_name) if by == "name" else out["name"]
    out = out.sort_values("total_us", ascending=False, kind="stable").reset_index(drop=True)[cols]
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
        from m3lab.traces.aiter_log import summarize_aiter_log
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
