"""One rung of the ladder: a deployment's serving figures and where its decode step spends its time, with chosen
code fixes in their state before (:mod:`m3lab.ladder.before`).

The ladder, the advisor and notebook 12 estimate only through :func:`evaluate`: the serving estimate
(``m3lab.serving.estimate.estimate``) gives output tokens/s/GPU, median TTFT and mean TPOT as its scheduler model
gives them, and one decode step at the run's mean decode batch and context, costed op by op with the kernels vLLM
runs (``m3lab.serving.breakdown.decode_step_breakdown``), gives the per-op time shares. Figures are **projected**
for the deployment's hardware profile under the named calibration (calibrated where one exists, else the ceiling).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from m3lab.cost.model import resolve_calibration
from m3lab.cost.sensitivity import sensitivity
from m3lab.ladder.before import SCALE, BeforeCalibration
from m3lab.serving.breakdown import decode_step_breakdown, run_decode_point
from m3lab.serving.capacity import capacity
from m3lab.serving.dispatch import dispatch_for
from m3lab.serving.estimate import estimate
from m3lab.workload.deployed import acceptance, fixed_contents

FIGURES = ("output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms")


@dataclass
class Rung:
    """A deployment's estimate: ``figures`` (:data:`FIGURES` plus ``kind``, ``label``, ``calibration``) and
    ``decode_ops``, the per-op breakdown of one decode step (``m3lab.serving.breakdown``: ``op``, ``path``,
    ``kernel``, ``optable_ops``, ``us``, ``share``, ...; shares sum to 1) at ``decode_step`` (batch, context)."""

    deployment: object
    undone: tuple[str, ...]
    figures: dict
    decode_ops: pd.DataFrame
    decode_step: dict
    sensitivity: pd.DataFrame | None = None   # m3lab.cost.sensitivity of the run (None for a ceiling)

    @property
    def throughput(self) -> float:
        return self.figures["output_tokens_per_s_per_gpu"]


def _calibration(deployment, calibration, undone: tuple[str, ...], scale: float):
    cal = resolve_calibration(deployment.hardware, calibration)
    if cal is None or not undone:
        return cal
    return BeforeCalibration(cal, tuple(undone), scale)


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


def evaluate(deployment, undone: tuple[str, ...] = (), *, calibration="default", scale: float = SCALE) -> Rung:
    """Estimate ``deployment`` with the code fixes ``undone`` in their state before (``scale``: the sensitivity
    factor of their measured ratios, :data:`m3lab.ladder.before.SCALE`)."""
    cal = _calibration(deployment, calibration, tuple(undone), scale)
    est = estimate(deployment, calibration=cal)
    top = est.results[est.kind]
    figures = {k: float(top[k]) for k in FIGURES}
    figures.update(kind=est.kind, label=top["label"], calibration=est.config["calibration"])
    batch, context = run_decode_point(est)
    ops = decode_step_breakdown(deployment, batch=batch, context=context, calibration=cal)
    sens = sensitivity(est) if est.kind == "calibrated" else None
    return Rung(deployment, tuple(undone), figures, ops, {"batch": batch, "context": context,
                                                          "query_len": 1 + deployment.serving.spec_tokens}, sens)


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
