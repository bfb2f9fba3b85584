"""The common kernel-events table: its columns, :func:`make_events` (every reader builds its rows
with it) and readable kernel names.


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

import re
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

COLUMNS = ("name", "kind", "start_us", "dur_us", "stream", "device", "grid", "block", "correlation",
           "cpu_op", "input_dims", "input_types", "launch", "attribution", "annotation")
ATTRIBUTIONS = ("cpu_op", "launch", "graph_launch", "unattributed")
_INT_COLUMNS = ("stream", "device", "correlation")


def make_events(rows: Iterable[dict[str, Any]] | dict[str, list], *, fmt: str, source: str | Path,
                **meta: Any) -> pd.DataFrame:
    """Build a kernel-events table from row dicts (missing keys -> None), or from a dict of column lists
    (what a streaming reader builds: no dict per row), sorted by start time."""
    df = pd.DataFrame(rows if isinstance(rows, dict) else list(rows), columns=list(COLUMNS))
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
