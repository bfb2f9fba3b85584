"""One rung of the ladder: a deployment's serving figures and where its decode step spends its time, with chosen
code fixes in their state before (:mod:`m3lab.ladder.before`).

The ladder, the advisor and notebook 12 estimate only through :func:`evaluate`: the serving estimate
(``m3lab.serving.estimate.estimate``) gives output tokens/s/GPU, median TTFT and mean TPOT as its scheduler model
gives them, and one decode step at the run's mean batch and context, costed op by op
(``m3lab.cost.model.cost_step``), gives the per-op time shares. Figures are **projected** for the deployment's
hardware profile under the named calibration (calibrated where one exists, else the roofline ceiling).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from m3lab.cost.model import cost_step, resolve_calibration
from m3lab.ladder.before import SCALE, BeforeCalibration
from m3lab.serving.capacity import capacity
from m3lab.serving.estimate import estimate, spec_decode_steps
from m3lab.workload.deployed import fixed_workload
from m3lab.workload.step import EngineStep

FIGURES = ("output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms")


@dataclass
class Rung:
    """A deployment's estimate: ``figures`` (:data:`FIGURES` plus ``kind`` and ``label``) and ``decode_ops``, the
    per-op time of one decode step (``[op, kind, t_us, share]``, largest first; shares sum to 1)."""

    deployment: object
    undone: tuple[str, ...]
    figures: dict
    decode_ops: pd.DataFrame
    decode_step: dict            # {"batch", "context", "query_len"} of the step decode_ops costs

    @property
    def throughput(self) -> float:
        return self.figures["output_tokens_per_s_per_gpu"]


def _calibration(deployment, calibration, undone: tuple[str, ...], scale: float):
    cal = resolve_calibration(deployment.hardware, calibration)
    if cal is None or not undone:
        return cal
    return BeforeCalibration(cal, tuple(undone), scale)


def mean_decode_step(est, deployment) -> EngineStep:
    """The decode step at the run's mean decode batch (weighted by the steps each run of the schedule repeats) and
    mean decode context (``isl + osl / 2``), each request verifying ``1 + spec_tokens`` rows."""
    steps = est.steps
    batch = max(1, int(round(np.average(steps["decodes"], weights=steps["repeat"])))) if len(steps) else 1
    wl, k = deployment.workload, deployment.serving.spec_tokens
    context = wl.isl + wl.osl // 2 + k
    return EngineStep(np.full(batch, 1 + k, np.int64), np.full(batch, context, np.int64))


def decode_ops(deployment, step: EngineStep, calibration) -> pd.DataFrame:
    """Per-op time of ``step`` (µs summed over layers) and its share of the step: ``[op, kind, t_us, share]``."""
    rows = cost_step(deployment, step, calibration=calibration)
    ops = rows.groupby(["op", "kind"], as_index=False, sort=False)["t_us"].sum()
    ops["share"] = ops["t_us"] / ops["t_us"].sum()
    return ops.sort_values("t_us", ascending=False, ignore_index=True)


def check(deployment) -> None:
    """Raise M3LabError (naming the field) for what the serving estimate of ``deployment`` would refuse: a workload
    that is no fixed closed loop, speculative decoding without an acceptance length, a KV cache that does not fit.
    The ladder and the advisor call it on every deployment before estimating any."""
    d = deployment.validate()
    wl, limits = d.workload, d.scheduler_limits()
    fixed_workload(d, osl=spec_decode_steps(wl.osl, d.serving.spec_tokens, d.acceptance.accept_len))
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
    step = mean_decode_step(est, deployment)
    return Rung(deployment, tuple(undone), figures, decode_ops(deployment, step, cal),
                {"batch": len(step.new_tokens), "context": int(step.context_lens[0]),
                 "query_len": int(step.new_tokens[0])})


def op_changes(before: pd.DataFrame, after: pd.DataFrame, rtol: float = 1e-9) -> pd.DataFrame:
    """Per op, the decode-step time before and after (two :func:`decode_ops` tables) and the change, for the ops
    whose time changed (an op only one side has counts as 0 µs on the other): ``[op, before_us, after_us, delta_us,
    before_share, after_share]``, largest saving first."""
    a = before.groupby("op")[["t_us", "share"]].sum()
    b = after.groupby("op")[["t_us", "share"]].sum()
    both = a.merge(b, how="outer", left_index=True, right_index=True, suffixes=("_before", "_after")).fillna(0.0)
    both["delta_us"] = both["t_us_after"] - both["t_us_before"]
    moved = ~np.isclose(both["t_us_after"], both["t_us_before"], rtol=rtol, atol=1e-9)
    out = both[moved].rename(columns={"t_us_before": "before_us", "t_us_after": "after_us",
                                      "share_before": "before_share", "share_after": "after_share"})
    return out.reset_index()[["op", "before_us", "after_us", "delta_us", "before_share", "after_share"]] \
        .sort_values("delta_us", ignore_index=True)
