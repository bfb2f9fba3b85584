"""Checklist step 2, the repetition estimate: a small per-call cost seen at its true total.

Input: a costed OpTable (``m3lab.cost.model.cost_optable``) of one engine step — one row per op per
layer — or the accumulated table of a whole serving run (``ServingEstimate.op_totals``), which has
the same ``op``/``kind``/``t_us`` columns plus ``calls`` (kernel launches over the run).

``repetition(costed, ...)`` multiplies each op's per-call cost by its calls (layers × steps) and
reports, per op: calls per step, µs per call, µs per step, ms per request, ms per 1,000 output
tokens, its share of the total, and its rank, with the work behind it (GFLOP and HBM MB per request).
``active_requests`` and ``output_tokens`` are per step for a single step, or run totals for a whole run
(:func:`of_run`).
"""
from __future__ import annotations

import pandas as pd

from m3lab.errors import M3LabError

KEYS = ["op", "kind"]


HBM_BYTES = ("bytes_compute", "bytes_weight", "bytes_kv")   # the OpTable's HBM planes (bytes_comm: the link)


def per_op(costed: pd.DataFrame) -> pd.DataFrame:
    """Sum a costed table by op: ``[op, kind, calls, t_us, t_bound_us, flops, hbm_bytes, bound]`` (the bound of
    its largest row; ``flops``/``hbm_bytes`` NaN when the table has no such columns)."""
    df = costed.copy()
    if "calls" not in df:
        df["calls"] = 1.0
    df["hbm_bytes"] = sum(df[c].fillna(0) for c in HBM_BYTES) if all(c in df for c in HBM_BYTES) else float("nan")
    if "flops" not in df:
        df["flops"] = float("nan")
    agg = df.groupby(KEYS, sort=False).agg(calls=("calls", "sum"), t_us=("t_us", "sum"),
                                           t_bound_us=("t_bound_us", "sum"), flops=("flops", "sum"),
                                           hbm_bytes=("hbm_bytes", "sum"))
    bound = df.sort_values("t_us").groupby(KEYS, sort=False)["bound"].last()
    return agg.join(bound).reset_index()


def repetition(costed: pd.DataFrame, *, output_tokens: float, active_requests: float,
               steps: float = 1.0) -> pd.DataFrame:
    """Per-op totals and shares, ranked (see module docstring). ``steps`` is how many engine steps the
    table covers (1 for one step's OpTable)."""
    for name, value in (("output_tokens", output_tokens), ("active_requests", active_requests), ("steps", steps)):
        if not value or value <= 0:
            raise M3LabError(f"{name}={value!r} must be positive", field=name)
    df = per_op(costed)
    total = df["t_us"].sum()
    df["calls_per_step"] = df["calls"] / steps
    df["us_per_call"] = df["t_us"] / df["calls"]
    df["us_per_step"] = df["t_us"] / steps
    df["ms_per_request"] = df["t_us"] / 1e3 / active_requests
    df["ms_per_1k_output_tokens"] = df["t_us"] / 1e3 / output_tokens * 1e3
    df["share"] = df["t_us"] / total if total > 0 else 0.0
    df = df.sort_values("t_us", ascending=False).reset_index(drop=True)
    df["rank"] = range(1, len(df) + 1)
    df["cumulative_share"] = df["share"].cumsum()
    df["gflop_per_request"] = df["flops"] / 1e9 / active_requests
    df["mb_per_request"] = df["hbm_bytes"] / 1e6 / active_requests
    out = df[["rank", "op", "kind", "calls", "calls_per_step", "us_per_call", "us_per_step", "ms_per_request",
              "ms_per_1k_output_tokens", "share", "cumulative_share", "bound", "gflop_per_request",
              "mb_per_request"]]
    out.attrs.update(total_us=float(total), output_tokens=float(output_tokens), active_requests=float(active_requests),
                     steps=float(steps))
    return out


def of_run(est) -> pd.DataFrame:
    """:func:`repetition` of a whole serving run (a :class:`~m3lab.serving.estimate.ServingEstimate`): every
    engine step's ops summed, per request over the run's requests, per output token over their outputs."""
    n = est.config["num_requests"]
    return repetition(est.op_totals(), output_tokens=n * est.config["osl"], active_requests=n,
                      steps=int(est.steps["repeat"].sum()))


def by_kind(rep: pd.DataFrame) -> pd.DataFrame:
    """Shares summed by op kind (gemm, grouped_gemm, attention, norm, allreduce, ...), largest first."""
    cols = ["us_per_step", "ms_per_request", "ms_per_1k_output_tokens", "share"]
    return rep.groupby("kind")[cols].sum().sort_values("share", ascending=False).reset_index()


def small_ops(rep: pd.DataFrame, us_per_call_below: float = 10.0) -> pd.DataFrame:
    """Ops whose single call is cheap (< ``us_per_call_below`` µs) but whose repeated total is not:
    the view that shows e.g. norms, the router and all-reduces at their true total."""
    out = rep[rep["us_per_call"] < us_per_call_below]
    return out.sort_values("share", ascending=False).reset_index(drop=True)


def gap_by_op(ceiling_totals: pd.DataFrame, calibrated_totals: pd.DataFrame) -> pd.DataFrame:
    """Where the calibrated estimate loses time against the ceiling, per op: ``[op, kind, ceiling_s,
    calibrated_s, gap_s, share_of_gap]`` largest gap first (the ops that hold the ceiling down)."""
    a = per_op(ceiling_totals).set_index(KEYS)["t_us"]
    b = per_op(calibrated_totals).set_index(KEYS)["t_us"]
    out = pd.DataFrame({"ceiling_s": a / 1e6, "calibrated_s": b / 1e6}).fillna(0.0)
    out["gap_s"] = out["calibrated_s"] - out["ceiling_s"]
    out["share_of_gap"] = out["gap_s"] / out["gap_s"].sum()
    return out.sort_values("gap_s", ascending=False).reset_index()
