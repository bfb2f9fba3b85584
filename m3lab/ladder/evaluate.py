"""One rung of the ladder: a deployment's serving figures and where its decode step spends its time, with chosen
code fixes in their state before (:mod:`m3lab.ladder.before`).

The ladder, the advisor and notebook 12 estimate only through :func:`evaluate`: the serving estimate
(``m3lab.serving.estimate.estimate``, with the states before as per-op overrides of its cost) gives output
tokens/s/GPU, median TTFT and mean TPOT as its scheduler model gives them, and one decode step at the run's mean
decode batch and context, costed op by op with the kernels vLLM runs (``m3lab.serving.breakdown.
decode_step_breakdown``), gives the per-op time shares. Figures are **projected** for the deployment's hardware
profile under the named calibration (calibrated where one exists, else the ceiling).

A rung is kept per process on its key (the record's key, the fixes undone and their scales, the calibration): the
ladder, the toggles and the advisor ask for the same rungs again. Its sensitivity table
(``m3lab.cost.sensitivity``, seconds) is computed where it is shown, on first access of :attr:`Rung.sensitivity`,
and kept with the rung.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pandas as pd

from m3lab.cost.model import resolve_calibration
from m3lab.cost.sensitivity import sensitivity as cost_sensitivity
from m3lab.ladder.before import overrides_for
from m3lab.serving.breakdown import decode_step_breakdown, run_decode_point
from m3lab.serving.capacity import capacity
from m3lab.serving.dispatch import dispatch_for
from m3lab.serving.estimate import estimate
from m3lab.workload.deployed import acceptance, fixed_contents

FIGURES = ("output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms")
RUNG_CACHE_SIZE = 32
_RUNGS: dict = {}


@dataclass
class Rung:
    """A deployment's estimate: ``figures`` (:data:`FIGURES` plus ``kind``, ``label``, ``calibration``) and
    ``decode_ops``, the per-op breakdown of one decode step (``m3lab.serving.breakdown``: ``op``, ``path``,
    ``kernel``, ``optable_ops``, ``us``, ``share``, ...; shares sum to 1) at ``decode_step`` (batch, context).
    ``estimate`` is the serving estimate itself (its coster keeps every costed row, for exact re-timing)."""

    deployment: object
    undone: tuple[str, ...]
    figures: dict
    decode_ops: pd.DataFrame
    decode_step: dict
    estimate: object = field(default=None, repr=False)
    scales: tuple = ()                                   # (fix, scale) of the undone fixes moved off their value
    _sensitivity: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def throughput(self) -> float:
        return self.figures["output_tokens_per_s_per_gpu"]

    @property
    def sensitivity(self) -> pd.DataFrame | None:
        """``m3lab.cost.sensitivity`` of the run (None for a ceiling), computed on first access."""
        if self._sensitivity is None and self.estimate is not None and self.estimate.kind == "calibrated":
            self._sensitivity = cost_sensitivity(self.estimate)
        return self._sensitivity


def check(deployment) -> None:
    """Raise M3LabError (naming the field) for what the serving estimate of ``deployment`` would refuse: a workload
    that is no fixed closed loop, speculative decoding without an acceptance length, a deployment vLLM refuses to
    start (vLLM's own message, from the resolver), a KV cache that does not fit. The ladder and the advisor call it
    on every deployment before estimating any."""
    d = deployment.validate()
    wl, limits = d.workload, d.scheduler_limits()
    fixed_contents(d, what="the serving estimate")
    acceptance(d)
    disp = dispatch_for(d)   # what vLLM runs (cached: the estimate reads the same answer)
    if disp is not None:
        disp.check_serves()
    capacity(d.model, d.plan, d.quant, d.hardware, isl=wl.isl, osl=wl.osl,
             gpu_memory_utilization=limits.gpu_memory_utilization,
             spec_tokens=d.serving.spec_tokens).check(wl.concurrency)


def _cal_key(cal) -> tuple | None:
    return None if cal is None else (cal.name, cal.hardware, cal.source, cal.label)


def evaluate(deployment, undone: tuple[str, ...] = (), *, calibration="default",
             scales: Mapping[str, float] | None = None) -> Rung:
    """Estimate ``deployment`` with the code fixes ``undone`` in their state before (``scales``: fix -> scale of
    its assumption, :data:`m3lab.ladder.before.ASSUMPTIONS`; missing: the assumption's value). Kept per process on
    the rung's key (see the module docstring)."""
    cal = resolve_calibration(deployment.hardware, calibration)
    undone = tuple(undone)
    moved = tuple(sorted((f, float(s)) for f, s in (scales or {}).items() if f in undone))
    key = (deployment.key(), undone, moved, _cal_key(cal))
    if key not in _RUNGS:
        if len(_RUNGS) >= RUNG_CACHE_SIZE:
            _RUNGS.pop(next(iter(_RUNGS)))
        _RUNGS[key] = _estimate(deployment, undone, cal, dict(moved))
    return _RUNGS[key]


def _estimate(deployment, undone: tuple[str, ...], cal, scales: dict) -> Rung:
    ov = overrides_for(undone, scales) if cal is not None else ()
    est = estimate(deployment, calibration=cal, op_overrides=ov)
    top = est.results[est.kind]
    figures = {k: float(top[k]) for k in FIGURES}
    figures.update(kind=est.kind, label=top["label"], calibration=est.config["calibration"])
    batch, context = run_decode_point(est)
    ops = decode_step_breakdown(deployment, batch=batch, context=context, calibration=cal, op_overrides=ov)
    return Rung(deployment, undone, figures, ops, {"batch": batch, "context": context,
                                                   "query_len": 1 + deployment.serving.spec_tokens}, est,
                tuple(sorted(scales.items())))


def op_changes(before: pd.DataFrame, after: pd.DataFrame, rtol: float = 1e-9) -> pd.DataFrame:
    """Per op, the decode-step time before and after (two breakdowns, ``Rung.decode_ops``; an op's paths summed)
    and the change, for the ops whose time changed (an op only one side has counts as 0 µs on the other):
    ``[op, before_us, after_us, delta_us, before_share, after_share]``, largest saving first."""
    a = before.groupby("op")[["us", "share"]].sum()
    b = after.groupby("op")[["us", "share"]].sum()
    both = a.merge(b, how="outer", left_index=True, right_index=True, suffixes=("_before", "_after")).fillna(0.0)
    both["delta_us"] = both["us_after"] - both["us_before"]
    moved = ~np.isclose(both["us_after"], both["us_before"], rtol=rtol, atol=1e-9)
    out = both[moved].rename(columns={"us_before": "before_us", "us_after": "after_us",
                                      "share_before": "before_share", "share_after": "after_share"})
    return out.reset_index()[["op", "before_us", "after_us", "delta_us", "before_share", "after_share"]] \
        .sort_values("delta_us", ignore_index=True)
