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
from typing import Any, Callable

import ijson
import pandas as pd

from m3lab.errors import M3LabError
from m3lab.traces.files import head_text, iter_json_items, json_value_before, read_json
from m3lab.traces.table import make_events

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


def _dims(value: Any) -> tuple[int, ...] | None:
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else None


def _frozen(value: Any) -> Any:
    """A hashable key for nested lists of numbers and strings."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


class _Events:
    """What one pass over a trace's events keeps, each as a small tuple rather than the event itself (a 141 MB
    trace holds 1.5 M events): GPU activities, runtime launches by correlation id, operators by External id,
    and user annotations. Repeated names are stored once."""

    def __init__(self, path: Path):
        self.path, self.count = path, 0
        self.gpu: list[tuple] = []                   # (index, kind, name, ts, dur, corr, ext, stream, device, grid, block)
        self.launches: dict[Any, tuple] = {}         # corr -> (name, External id, pid, tid, ts)
        self.ops: dict[Any, tuple] = {}              # External id -> (name, Input Dims, Input type)
        self.annotations: list[tuple] = []           # (pid, tid, ts, dur, name)
        self.device_names: set[str] = set()
        self._names: dict[str, str] = {}
        self._values: dict[Any, Any] = {}

    def _name(self, event: dict) -> str:
        name = str(event.get("name"))
        return self._names.setdefault(name, name)

    def _shared(self, value: Any) -> Any:
        """One object for every equal grid, block, Input Dims or Input type (they repeat across events)."""
        if value is None:
            return None
        key = _frozen(value)
        return self._values.setdefault(key, value)

    def add(self, event: Any) -> None:
        index, self.count = self.count, self.count + 1
        if not isinstance(event, dict) or event.get("ph") != "X":
            return
        cat = _category(event)
        args = event.get("args") or {}
        if cat in _GPU_KIND:
            kind = _GPU_KIND[cat]
            if "ts" not in event or "dur" not in event:
                raise M3LabError(f"{self.path}: event {index} ({kind} {str(event.get('name'))[:40]!r}) lacks ts/dur",
                                 field="TRACE", hint="the trace is malformed; re-export it")
            self.gpu.append((index, kind, self._name(event), float(event["ts"]), float(event["dur"]),
                             args.get("correlation"), args.get("External id"), args.get("stream"), args.get("device"),
                             self._shared(_dims(args.get("grid"))), self._shared(_dims(args.get("block")))))
        elif cat in _LAUNCH_CATEGORIES and "correlation" in args:
            self.launches[args["correlation"]] = (self._name(event), args.get("External id"), event.get("pid"),
                                                  event.get("tid"), event.get("ts"))
        elif cat == "cpu_op" and "External id" in args:
            self.ops[args["External id"]] = (self._name(event), self._shared(args.get("Input Dims")),
                                             self._shared(args.get("Input type")))
        elif cat == "user_annotation" and "ts" in event:
            self.annotations.append((event.get("pid"), event.get("tid"), float(event["ts"]),
                                     float(event.get("dur", 0)), self._name(event)))

    def add_properties(self, props: Any) -> None:
        self.device_names |= {p["name"] for p in props or [] if isinstance(p, dict) and p.get("name")}


def _innermost_annotations(annotations: list[tuple], launches: dict[Any, tuple]) -> dict[Any, str]:
    """correlation id of a launch -> name of the innermost annotation that contains it on the same host thread
    (a sweep over start times with a stack of open annotations)."""
    items = [((str(pid), str(tid)), ts, 0, -dur, i, name) for i, (pid, tid, ts, dur, name) in enumerate(annotations)]
    items += [((str(pid), str(tid)), float(ts), 1, 0.0, i, corr)
              for i, (corr, (_, _, pid, tid, ts)) in enumerate(launches.items()) if ts is not None]
    items.sort(key=lambda it: it[:5])
    out: dict[Any, str] = {}
    stack: list[tuple[float, str]] = []
    thread = None
    for key, ts, is_launch, neg_dur, _, value in items:
        if key != thread:
            thread, stack = key, []
        while stack and stack[-1][0] <= ts:
            stack.pop()
        if is_launch:
            if stack:
                out[value] = stack[-1][1]
        else:
            stack.append((ts - neg_dur, value))
    return out


def _columns(ev: _Events) -> dict[str, list]:
    """The kernel-events table's columns (:mod:`m3lab.traces.table`) from what the pass kept."""
    annotated = _innermost_annotations(ev.annotations, ev.launches)
    cols: dict[str, list] = {c: [] for c in ("name", "kind", "start_us", "dur_us", "stream", "device", "grid", "block",
                                             "correlation", "cpu_op", "input_dims", "input_types", "launch",
                                             "attribution", "annotation")}
    for _, kind, name, ts, dur, corr, ext, stream, device, grid, block in ev.gpu:
        launch = ev.launches.get(corr) if corr is not None else None
        ext = ext if ext is not None else (launch[1] if launch else None)
        op = ev.ops.get(ext) if ext is not None else None
        launch_name = launch[0] if launch else None
        if is_graph_launch(launch_name):
            attribution, op = "graph_launch", None
        else:
            attribution = "cpu_op" if op is not None else "launch" if launch is not None else "unattributed"
        for key, value in (("name", name), ("kind", kind), ("start_us", ts), ("dur_us", dur), ("stream", stream),
                           ("device", device), ("grid", grid), ("block", block), ("correlation", corr),
                           ("cpu_op", op[0] if op else None), ("input_dims", op[1] if op else None),
                           ("input_types", op[2] if op else None), ("launch", launch_name),
                           ("attribution", attribution),
                           ("annotation", annotated.get(corr) if launch else None)):
            cols[key].append(value)
    return cols


def _read_whole(path: Path, ev: _Events) -> None:
    """The whole-document path: for what the streaming parser refuses (NaN, or a malformed file, whose
    message :func:`read_json` words)."""
    doc = read_json(path)
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        events = doc["traceEvents"]
    elif isinstance(doc, list):
        events = doc
    else:
        raise M3LabError(f"{path}: not a Chrome trace (no traceEvents list)", field="TRACE",
                         hint="pass a PyTorch profiler JSON written by export_chrome_trace or on_trace_ready")
    for event in events:
        ev.add(event)
    if isinstance(doc, dict):
        ev.add_properties(doc.get("deviceProperties"))


def read_kineto(path: str | Path, progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Read a Kineto Chrome trace (``.json`` or ``.json.gz``) into the kernel-events table.

    No GPU row is dropped: the sum of ``dur_us`` over ``kind == "kernel"`` equals the sum of
    ``dur`` over the file's kernel events. ``attrs["device_name"]`` comes from deviceProperties.
    The file is parsed as a stream (memory grows with the kept events, not with the file);
    ``progress(bytes_read, file_bytes)`` follows it.
    """
    path = Path(path)
    ev = _Events(path)
    top_list = head_text(path, 4096).lstrip().startswith("[")
    try:
        if not top_list:
            found, props = json_value_before(path, "deviceProperties", "traceEvents")
            ev.add_properties(props)
        for event in iter_json_items(path, "item" if top_list else "traceEvents.item", progress):
            ev.add(event)
        if not top_list and not found:   # written after the events: one more pass, over the whole file
            ev.add_properties(next(iter_json_items(path, "deviceProperties"), None))
    except ijson.JSONError:
        ev = _Events(path)
        _read_whole(path, ev)
    if not top_list and ev.count == 0:   # no traceEvents list at all, or an empty one: say which
        _read_whole(path, _Events(path))
    return make_events(_columns(ev), fmt="kineto", source=path, device_name=", ".join(sorted(ev.device_names)) or None)
