"""rocprofv3 kernel traces (CSV and JSON) -> the kernel-events table.

CSV (``--kernel-trace --output-format csv``, ``kernel_trace.csv``; timestamps in ns). Current header::

    "Kind","Agent_Id","Queue_Id","Stream_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name",
    "Correlation_Id","Start_Timestamp","End_Timestamp",...,"Workgroup_Size_X",...,"Grid_Size_Z"

Older rocprofv3 versions lack ``Stream_Id`` (queue used instead) and may write ``Agent_Id`` as text
("Agent 2"); the legacy rocprof ``results.csv`` (``KernelName``, ``BeginNs``, ``EndNs``, ``gpu-id``,
``queue-id``, ``grd``, ``wgr``) is read too. JSON (``--output-format json``): the records of
``buffer_records.kernel_dispatch`` named through ``kernel_symbols`` (kernel_id -> name), agents
mapped to GPU indices. rocprof's grid is counted in work-items; the table stores workgroups
(grid / workgroup size, rounded up) like Kineto's blocks. A kernel trace has no host-side launch
link, so every row is ``unattributed`` (kept, never dropped).
"""
from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.traces.table import make_events
from m3lab.traces.files import read_json, read_text

# table column -> accepted CSV headers, first match wins
_CSV_ALIASES: dict[str, tuple[str, ...]] = {
    "name": ("Kernel_Name", "KernelName"),
    "start_ns": ("Start_Timestamp", "BeginNs"),
    "end_ns": ("End_Timestamp", "EndNs"),
    "device": ("Agent_Id", "gpu-id"),
    "stream": ("Stream_Id", "Queue_Id", "queue-id"),
    "correlation": ("Correlation_Id", "Index"),
}
_REQUIRED = ("name", "start_ns", "end_ns")
_XYZ = ("X", "Y", "Z")


def _int(value: Any) -> int | None:
    """``"3"`` / ``"Agent 3"`` / ``3`` -> 3; blanks -> None."""
    if value is None:
        return None
    m = re.search(r"-?\d+", str(value))
    return int(m.group()) if m else None


def _workgroups(grid: list[int | None], block: list[int | None]) -> tuple[int, ...] | None:
    if any(v is None for v in grid) or any(v is None for v in block):
        return None
    return tuple(math.ceil(g / b) if b else g for g, b in zip(grid, block))


def _triple(row: dict[str, str], prefix: str) -> list[int | None]:
    return [_int(row.get(f"{prefix}_{axis}")) for axis in _XYZ]


def _legacy_triple(text: str | None) -> list[int | None]:
    parts = [_int(p) for p in re.findall(r"\d+", text or "")]
    return (parts + [1, 1, 1])[:3] if parts else [None, None, None]


def read_rocprof_csv(path: str | Path) -> pd.DataFrame:
    """Read a rocprofv3 ``kernel_trace.csv`` (current or older header) into the kernel-events table."""
    path = Path(path)
    reader = csv.DictReader(io.StringIO(read_text(path)))
    header = reader.fieldnames or []
    found = {col: next((h for h in names if h in header), None) for col, names in _CSV_ALIASES.items()}
    missing = [_CSV_ALIASES[c][0] for c in _REQUIRED if found[c] is None]
    if missing:
        raise M3LabError(f"{path}: kernel-trace CSV lacks column(s) {', '.join(missing)} "
                         f"(header: {', '.join(header[:8])}...)", field="TRACE",
                         hint="pass rocprofv3 --kernel-trace --output-format csv output (kernel_trace.csv)")
    legacy = "grd" in header
    rows = []
    for number, row in enumerate(reader, start=2):
        start, end = _int(row.get(found["start_ns"])), _int(row.get(found["end_ns"]))
        if start is None or end is None or None in row.values():
            raise M3LabError(f"{path}: line {number} is incomplete (missing timestamps or fields)",
                             field="TRACE", hint="the CSV is truncated; re-export it")
        if legacy:
            grid, block = _legacy_triple(row.get("grd")), _legacy_triple(row.get("wgr"))
        else:
            grid, block = _triple(row, "Grid_Size"), _triple(row, "Workgroup_Size")
        rows.append({"name": row[found["name"]], "kind": "kernel", "start_us": start / 1e3,
                     "dur_us": (end - start) / 1e3,
                     "stream": _int(row.get(found["stream"])) if found["stream"] else None,
                     "device": _int(row.get(found["device"])) if found["device"] else None,
                     "grid": _workgroups(grid, block),
                     "block": tuple(block) if None not in block else None,
                     "correlation": _int(row.get(found["correlation"])) if found["correlation"] else None,
                     "attribution": "unattributed"})
    return make_events(rows, fmt="rocprofv3-csv", source=path)


def _tool_record(path: Path, doc: Any) -> dict[str, Any]:
    try:
        tool = doc["rocprofiler-sdk-tool"]
        tool = tool[0] if isinstance(tool, list) else tool
        tool["buffer_records"]["kernel_dispatch"]
        tool["kernel_symbols"]
    except (KeyError, IndexError, TypeError):
        raise M3LabError(f"{path}: rocprofv3 JSON lacks buffer_records.kernel_dispatch or kernel_symbols",
                         field="TRACE", hint="record with rocprofv3 --kernel-trace --output-format json") from None
    return tool


def _gpu_index(agents: list[dict[str, Any]]) -> tuple[dict[int, int], str | None]:
    """agent handle -> GPU index (logical_node_type_id), and the GPU product name."""
    index, names = {}, set()
    for agent in agents:
        handle = (agent.get("id") or {}).get("handle")
        if agent.get("type") == 2 and handle is not None:
            index[handle] = agent.get("logical_node_type_id", agent.get("node_id"))
            names.add(agent.get("product_name") or agent.get("name"))
    return index, ", ".join(sorted(n for n in names if n)) or None


def _symbol_names(symbols: list[dict[str, Any]]) -> dict[int, str]:
    return {s["kernel_id"]: (s.get("formatted_kernel_name") or s.get("kernel_name")
                             or s.get("truncated_kernel_name") or str(s["kernel_id"]))
            for s in symbols if "kernel_id" in s}


def read_rocprof_json(path: str | Path) -> pd.DataFrame:
    """Read a rocprofv3 JSON results file into the kernel-events table (43,915 dispatches ≈ 1 s)."""
    path = Path(path)
    tool = _tool_record(path, read_json(path))
    names = _symbol_names(tool["kernel_symbols"])
    gpus, device_name = _gpu_index(tool.get("agents") or [])
    rows = []
    dims: dict[tuple, tuple] = {}  # (grid, workgroup) -> (grid in workgroups, block); few distinct
    for number, rec in enumerate(tool["buffer_records"]["kernel_dispatch"]):
        try:
            info = rec["dispatch_info"]
            start, end = rec["start_timestamp"], rec["end_timestamp"]
            wg, grid = info.get("workgroup_size") or {}, info.get("grid_size") or {}
            key = (grid.get("x"), grid.get("y"), grid.get("z"), wg.get("x"), wg.get("y"), wg.get("z"))
            kernel_id = info["kernel_id"]
        except (KeyError, TypeError, AttributeError):
            raise M3LabError(f"{path}: kernel_dispatch record {number} is malformed", field="TRACE",
                             hint="the JSON is not a rocprofv3 kernel trace") from None
        if key not in dims:
            block = list(key[3:])
            dims[key] = (_workgroups(list(key[:3]), block), tuple(block) if None not in block else None)
        agent = (info.get("agent_id") or {}).get("handle")
        rows.append({"name": names.get(kernel_id, f"kernel_id={kernel_id}"), "kind": "kernel",
                     "start_us": start / 1e3, "dur_us": (end - start) / 1e3,
                     "stream": (info.get("queue_id") or {}).get("handle"),
                     "device": gpus.get(agent, agent), "grid": dims[key][0], "block": dims[key][1],
                     "correlation": (rec.get("correlation_id") or {}).get("internal"),
                     "attribution": "unattributed"})
    return make_events(rows, fmt="rocprofv3-json", source=path, device_name=device_name)
