"""PyTorch profiler (Kineto) Chrome-trace JSON -> the kernel-events table.

Kernel, memcpy and memset events (``ph == "X"``, ``cat`` kernel / gpu_memcpy / gpu_memset) become
rows. Each is linked to its runtime launch through ``args.correlation`` and to the launching
``cpu_op`` through ``External id`` (on the kernel or on the launch), whose ``Input Dims`` /
``Input type`` are copied when shapes were recorded. Kernels replayed from a CUDA/HIP graph share
the correlation id of one ``cudaGraphLaunch`` / ``hipGraphLaunch`` runtime event: they are kept and
marked ``attribution == "graph_launch"`` (``launch`` names the graph launch, ``correlation`` identifies
the replay). Kernels with no host-side link are kept as ``unattributed``. ``annotation`` names the
innermost ``user_annotation`` (``record_function``) around the launch on the host thread, e.g. the
dispatcher's ``m3lab::attention[L3]``, so kernel time can be grouped by model op.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.traces.table import make_events
from m3lab.traces.files import read_json

# category spellings of older profilers -> the current ones
_CATEGORY = {"runtime": "cuda_runtime", "driver": "cuda_driver", "operator": "cpu_op",
             "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
_GPU_KIND = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


def _category(event: dict[str, Any]) -> str:
    cat = str(event.get("cat", "")).lower()
    return _CATEGORY.get(cat, cat)


def is_graph_launch(api_name: str | None) -> bool:
    """True for cudaGraphLaunch / cuGraphLaunch / hipGraphLaunch (any suffix)."""
    return bool(api_name) and "GraphLaunch" in api_name


def _trace_events(path: Path, doc: Any) -> list[dict[str, Any]]:
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return doc["traceEvents"]
    raise M3LabError(f"{path}: not a Chrome trace (no traceEvents list)", field="TRACE",
                     hint="pass a PyTorch profiler JSON written by export_chrome_trace or on_trace_ready")


def _innermost_annotations(annotations: list[dict], launches: list[dict]) -> dict[int, str]:
    """id(launch) -> name of the innermost annotation that contains it on the same host thread
    (a sweep over start times with a stack of open annotations)."""
    items = [((a["pid"], a["tid"]), float(a["ts"]), 0, -float(a.get("dur", 0)), i, a)
             for i, a in enumerate(annotations) if "ts" in a]
    items += [((e["pid"], e["tid"]), float(e["ts"]), 1, 0.0, i, e) for i, e in enumerate(launches) if "ts" in e]
    items.sort(key=lambda it: (str(it[0]), it[1], it[2], it[3], it[4]))
    out: dict[int, str] = {}
    stack: list[tuple[float, str]] = []
    thread = None
    for key, ts, is_launch, neg_dur, _, event in items:
        if key != thread:
            thread, stack = key, []
        while stack and stack[-1][0] <= ts:
            stack.pop()
        if is_launch:
            if stack:
                out[id(event)] = stack[-1][1]
        else:
            stack.append((ts - neg_dur, str(event.get("name"))))
    return out


def _dims(value: Any) -> tuple[int, ...] | None:
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else None


def _row(path: Path, index: int, event: dict[str, Any], kind: str, launches: dict[Any, dict],
         ops: dict[Any, dict], annotated: dict[int, str]) -> dict[str, Any]:
    args = event.get("args") or {}
    if "ts" not in event or "dur" not in event:
        raise M3LabError(f"{path}: event {index} ({kind} {str(event.get('name'))[:40]!r}) lacks ts/dur",
                         field="TRACE", hint="the trace is malformed; re-export it")
    corr = args.get("correlation")
    launch = launches.get(corr) if corr is not None else None
    launch_args = (launch or {}).get("args") or {}
    ext = args.get("External id", launch_args.get("External id"))
    op = ops.get(ext) if ext is not None else None
    launch_name = launch.get("name") if launch else None
    if is_graph_launch(launch_name):
        attribution, op = "graph_launch", None
    elif op is not None:
        attribution = "cpu_op"
    elif launch is not None:
        attribution = "launch"
    else:
        attribution = "unattributed"
    op_args = (op or {}).get("args") or {}
    return {"name": str(event.get("name")), "kind": kind, "start_us": float(event["ts"]),
            "dur_us": float(event["dur"]), "stream": args.get("stream"), "device": args.get("device"),
            "grid": _dims(args.get("grid")), "block": _dims(args.get("block")), "correlation": corr,
            "cpu_op": op.get("name") if op else None, "input_dims": op_args.get("Input Dims"),
            "input_types": op_args.get("Input type"), "launch": launch_name, "attribution": attribution,
            "annotation": annotated.get(id(launch)) if launch else None}


def read_kineto(path: str | Path) -> pd.DataFrame:
    """Read a Kineto Chrome trace (``.json`` or ``.json.gz``) into the kernel-events table.

    No GPU row is dropped: the sum of ``dur_us`` over ``kind == "kernel"`` equals the sum of
    ``dur`` over the file's kernel events. ``attrs["device_name"]`` comes from deviceProperties.
    """
    path = Path(path)
    doc = read_json(path)
    events = _trace_events(path, doc)
    launches: dict[Any, dict] = {}
    ops: dict[Any, dict] = {}
    gpu: list[tuple[int, dict, str]] = []
    annotations: list[dict] = []
    for index, event in enumerate(events):
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        cat = _category(event)
        args = event.get("args") or {}
        if cat in _GPU_KIND:
            gpu.append((index, event, _GPU_KIND[cat]))
        elif cat in _LAUNCH_CATEGORIES and "correlation" in args:
            launches[args["correlation"]] = event
        elif cat == "cpu_op" and "External id" in args:
            ops[args["External id"]] = event
        elif cat == "user_annotation":
            annotations.append(event)
    annotated = _innermost_annotations(annotations, list(launches.values()))
    rows = [_row(path, i, e, kind, launches, ops, annotated) for i, e, kind in gpu]
    props = doc.get("deviceProperties") if isinstance(doc, dict) else None
    names = sorted({p.get("name") for p in props or [] if isinstance(p, dict) and p.get("name")})
    return make_events(rows, fmt="kineto", source=path, device_name=", ".join(names) or None)
