"""Predicted time of one kernel (a GEMM or a MoE grouped GEMM pair) on a hardware profile.

    kernel_time("mi355x", "gemm", m=32, n=2560, k=6144, quant="mxfp8")
    kernel_time("mi355x", "grouped_gemm", tokens=32, hidden=6144, inter=768, experts=129, topk=5, quant="mxfp8")

Rows are made with the OpTable's own row formulas (``m3lab.optable.ops``) and costed by
:func:`m3lab.cost.model.cost_optable`; the result (:class:`KernelTime`) names the limiting bound, the ceiling
and the calibration.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import pandas as pd

from m3lab.cost.model import cost_label, cost_optable, resolve_calibration
from m3lab.errors import M3LabError
from m3lab.optable import ops
from m3lab.optable.routing import make_routing
from m3lab.spec.hardware import load_hardware

OPS = ("gemm", "grouped_gemm")
WEIGHT_DTYPES = ("bf16", "fp8", "mxfp8", "mxfp4")


class _Record:
    """Fixed fields, also readable as ``r["name"]`` (an unknown name raises KeyError)."""

    def __getitem__(self, name: str):
        if name not in {f.name for f in fields(self)}:
            raise KeyError(f"{type(self).__name__} has no field {name!r}")
        return getattr(self, name)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class KernelPart(_Record):
    """One kernel of the estimate (a GEMM, or a grouped GEMM's gate_up or down): µs on the hardware."""

    op: str
    us: float
    ceiling_us: float
    bound: str
    efficiency: float
    m: float
    n: float
    k: float


@dataclass(frozen=True)
class KernelTime(_Record):
    """Predicted time of one kernel (``parts``: its GEMMs) on a hardware profile.

    us: calibrated µs where a calibration exists (``kind`` "calibrated"), else the ceiling's (``kind``
    "ceiling"); bound: what limits the slowest part (compute, memory, comm or "launch floor");
    shape: the arguments that gave the problem (m, n, k or tokens, hidden, inter, experts, topk, routing).
    """

    hardware: str
    op: str
    quant: str
    shape: dict
    us: float
    bound: str
    kind: str
    ceiling_us: float
    flops: float
    bytes: float
    label: str
    parts: tuple[KernelPart, ...]

    def to_dict(self) -> dict:
        """Flat JSON-ready dict: the shape's arguments at the top level, parts as dicts."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("shape", "parts")}
        return {**out, **self.shape, "parts": [p.to_dict() for p in self.parts]}


def _positive(**values) -> None:
    for name, v in values.items():
        if v is None or not isinstance(v, int) or v < 1:
            raise M3LabError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}", field=name)


def kernel_rows(op: str, *, quant: str, m=None, n=None, k=None, tokens=None, hidden=None, inter=None,
                experts=None, topk=None, routing=None) -> pd.DataFrame:
    """OpTable-style rows of the kernel(s): one GEMM, or a grouped GEMM's gate_up and down."""
    if quant not in WEIGHT_DTYPES:
        raise M3LabError(f"--quant {quant!r} is not a weight dtype", field="quant", hint=f"use one of {', '.join(WEIGHT_DTYPES)}")
    if op == "gemm":
        _positive(m=m, n=n, k=k)
        return pd.DataFrame([dict(ops.gemm("gemm", m, n, k, quant), layer=-1)])
    if op == "grouped_gemm":
        _positive(tokens=tokens, hidden=hidden, inter=inter, experts=experts, topk=topk)
        r = make_routing(routing, experts, topk)
        routed = float(r.routed_tokens(tokens)[0])
        g = dict(experts=experts, topk=topk, hidden=hidden, inter=inter,
                 active_experts=float(r.active_experts(tokens)[0]), max_load=float(r.max_load(tokens)[0]))
        rows = [ops.grouped_gemm("moe_gate_up", routed, 2 * inter, hidden, quant, **g),
                ops.grouped_gemm("moe_down", routed, hidden, inter, quant, **g)]
        return pd.DataFrame([dict(x, layer=-1) for x in rows])
    raise M3LabError(f"--op {op!r} is not supported", field="op", hint=f"use one of {', '.join(OPS)}")


def kernel_time(hardware, op: str, *, quant: str, calibration="default", **shape) -> KernelTime:
    """Predicted µs (calibrated where a calibration exists, else the ceiling), the limiting bound, and the
    ceiling's µs; ``parts`` lists gate_up/down for a grouped GEMM."""
    hw = load_hardware(hardware)
    cal = resolve_calibration(hw, calibration)
    rows = kernel_rows(op, quant=quant, **shape)
    ceiling = cost_optable(rows, hw, None)
    est = cost_optable(rows, hw, cal) if cal is not None else ceiling
    limit = est.loc[est["t_us"].idxmax()]
    bound = "launch floor" if limit["floor_us"] >= limit["t_bound_us"] / limit["efficiency"] else str(limit["bound"])
    parts = tuple(KernelPart(op=r.op, us=float(r.t_us), ceiling_us=float(c), bound=str(r.bound),
                             efficiency=float(r.efficiency), m=float(r.m), n=float(r.n), k=float(r.k))
                  for r, c in zip(est.itertuples(), ceiling["t_us"]))
    return KernelTime(hardware=hw.name, op=op, quant=quant, shape=dict(shape), us=float(est["t_us"].sum()),
                      bound=bound, kind="calibrated" if cal is not None else "ceiling",
                      ceiling_us=float(ceiling["t_us"].sum()), flops=float(est["flops"].sum()),
                      bytes=float(est[["bytes_compute", "bytes_weight"]].sum().sum()), label=cost_label(hw, cal),
                      parts=parts)
