"""Open any supported trace file: sniff its format from the first bytes and call the format's reader."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.traces import aiter_log, dispatch, kineto, rocprof
from m3lab.traces.files import head_text, iter_lines

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


def load_trace(path: str | Path, progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Load any supported trace, sniffing the format.

    Returns the kernel-events table (see module docstring) for Kineto and rocprofv3 files, the
    dispatch table of :func:`m3lab.traces.dispatch.read_dispatch_trace` for m3lab dispatch traces,
    and the table of :func:`m3lab.traces.aiter_log.read_aiter_log` for AITER logs;
    ``df.attrs["format"]`` says which. ``progress(bytes_read, file_bytes)`` follows the reading of a Kineto
    trace (the large ones: 100 MB and more).
    """
    fmt = sniff_format(path)
    readers = {"m3lab.dispatch": dispatch.read_dispatch_trace, "kineto": kineto.read_kineto,
               "rocprofv3-json": rocprof.read_rocprof_json, "rocprofv3-csv": rocprof.read_rocprof_csv,
               "aiter-log": aiter_log.read_aiter_log}
    if fmt == "kineto":
        return kineto.read_kineto(path, progress=progress)
    return readers[fmt](path)
