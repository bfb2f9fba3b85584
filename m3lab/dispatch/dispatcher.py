"""The dispatcher: every op of the reference model goes through :meth:`Dispatcher.call`.

For a call it builds a :class:`CallContext`, tries the declared fast paths in order, runs the first
whose conditions hold (else the plain-torch reference), and records one dispatch-trace record
(format in ``m3lab.traces.dispatch``): op, layer, shapes, dtypes, path, kernels, and for every path
not chosen the condition that failed. ``kernels`` names what ran: the kernels the path's implementation
reported launching (``m3lab.kernels.launches``; the GEMM launcher picks its kernel from the tuned table),
else the path's declared kernels, else the reference function.
"""
import time
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any, Callable, Protocol

import torch

from m3lab.dispatch.fastpath import CallContext, plan_fields
from m3lab.dispatch.registry import FastPathRegistry, m3_registry
from m3lab.kernels.launches import recording
from m3lab.spec.plan import as_plan

FALLBACK = "torch"  # name of the plain-torch reference path

def dtype_name(dt: torch.dtype) -> str:
    """Dtype name used in traces, as torch prints it without the prefix (bfloat16, float8_e4m3fn, ...)."""
    return str(dt).removeprefix("torch.")


def plan_dict(plan: Any) -> dict[str, Any]:
    """A plan (ParallelPlan, dict of its fields, or None for its defaults) as a plain dict of its fields."""
    plan = as_plan(plan)
    return asdict(plan) if is_dataclass(plan) else dict(vars(plan))


class TraceWriter(Protocol):
    """The writer interface of m3lab.traces.dispatch.DispatchTraceWriter."""

    def write(self, op: str, *, layer: int, shapes: dict, dtypes: dict, path: str, kernels: Any = (),
              rejected: Any = (), device: str | None = None, t_us: float | None = None) -> dict: ...


@dataclass
class Dispatcher:
    """Chooses a path per call and records it.

    plan: ParallelPlan or dict; registry: the declared fast paths; writer: a DispatchTraceWriter (or
    None); keep: also keep every record (with ``kind`` and op ``attrs``) in ``self.records``;
    timed: measure each call (synchronises a GPU) into ``t_us``.
    """

    plan: Any = None
    registry: FastPathRegistry | None = None
    writer: TraceWriter | None = None
    keep: bool = True
    timed: bool = False

    def __post_init__(self):
        self.plan_info = plan_dict(self.plan)
        self._plan_fields = plan_fields(self.plan_info)
        self.registry = self.registry if self.registry is not None else m3_registry()
        self.seq = 0
        self.records: list[dict[str, Any]] = []

    def call(self, op: str, layer: int, kind: str, ref: Callable[..., Any], tensors: dict[str, torch.Tensor],
             attrs: dict[str, Any] | None = None, params: dict[str, Any] | None = None) -> Any:
        """Run ``op`` on named tensors: the first applicable fast path, else ``ref(**tensors, **params)``."""
        attrs = attrs or {}
        params = params or {}
        present = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        device = next(iter(present.values())).device.type if present else "cpu"
        ctx = CallContext(op=op, layer=layer, kind=kind,
                          shapes={k: list(v.shape) for k, v in present.items()},
                          dtypes={k: dtype_name(v.dtype) for k, v in present.items()},
                          device=device, plan=self._plan_fields, attrs=attrs)
        chosen, fn, kernels, rejected = FALLBACK, ref, [f"{ref.__module__}.{ref.__qualname__}"], []
        for path in self.registry.candidates(op, kind):
            why = path.first_failure(ctx)
            if why is None and chosen == FALLBACK:
                chosen, fn, kernels = path.name, path.impl, list(path.kernels)
            elif why is not None:  # a later path that would also run is not listed as rejected
                rejected.append({"path": path.name, "condition": why})
        if self.timed and device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter() if self.timed else 0.0
        with torch.profiler.record_function(f"m3lab::{op}[L{layer}]"), recording() as launched:
            out = fn(**tensors, **params)
        if launched and chosen != FALLBACK:
            kernels = list(dict.fromkeys(launched))
        record = {"op": op, "layer": layer, "shapes": ctx.shapes, "dtypes": ctx.dtypes,
                  "path": chosen, "kernels": kernels, "rejected": rejected, "device": device}
        if self.timed:
            if device == "cuda":
                torch.cuda.synchronize()
            record["t_us"] = (time.perf_counter() - t0) * 1e6
        if self.writer is not None:
            self.writer.write(**record)
        record = {"seq": self.seq, **record}
        if self.keep:
            self.records.append({**record, "kind": kind, "attrs": _jsonable(attrs)})
        self.seq += 1
        return out


def _jsonable(attrs: dict[str, Any]) -> dict[str, Any]:
    """Op attributes as JSON scalars."""
    out = {}
    for k, v in attrs.items():
        out[k] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
    return out
