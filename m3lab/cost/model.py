"""Time per op on a hardware profile: the roofline bound, and the time of the kernel vLLM runs for it.

``cost_optable(optable, hw, calibration)`` adds to every OpTable row (one op in one layer of one engine step):

| column | meaning |
|---|---|
| ``peak_dtype`` | dtype whose peak bounds the op (``roofline.compute_dtype``) |
| ``t_compute_us`` / ``t_memory_us`` / ``t_comm_us`` | flops / peak, (bytes_compute + bytes_weight + bytes_kv) / HBM bw, bytes_comm / link bw |
| ``t_bound_us``, ``bound`` | the largest term and its name (compute / memory / comm) |
| ``source`` | the cost source of the row's kernel (:mod:`m3lab.cost.sources`: by the row's vLLM ``path`` where the OpTable has one, else by kind) |
| ``efficiency`` | achievable fraction of the bound: 1 for the ceiling; else the source's |
| ``floor_us`` | launch/latency floor of the kernel (0 for the ceiling, for rows inside a neighbour's launch) |
| ``inside`` | the row's work is inside a kernel whose measured time covers it (0 µs when calibrated) |
| ``eff_terms`` / ``floor_term`` | the assumptions (:mod:`m3lab.cost.assumptions`) the efficiency / floor depend on |
| ``t_us`` | ``max(t_bound_us / efficiency, floor_us)`` (0 when ``inside``) |
| ``override``, ``override_ratio`` | only with ``op_overrides`` (:mod:`m3lab.cost.overrides`): the override that re-costed the row and its ratio |

``calibration=None`` gives the pure ceiling (labelled "uncalibrated bound"); a :class:`Calibration`
(or ``"default"`` for the hardware's shipped one) gives the estimate. ``cost_label`` names the hardware profile
and the calibration in every row. The cost of a deployment's step with the kernels vLLM runs for it is
:func:`m3lab.serving.step_cost.cost_step` (it builds the OpTable with the deployment's Dispatch).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from m3lab.arith import finite
from m3lab.cost.calibration import UNCALIBRATED, Calibration, default_calibration, load_calibration
from m3lab.cost.overrides import apply, replaced_paths, select
from m3lab.cost.roofline import bound_times_us, compute_dtype, peak_flops
from m3lab.cost.sources import cost_terms

MEMORY_COLUMNS = ("bytes_compute", "bytes_weight", "bytes_kv")


def resolve_calibration(hw, calibration) -> Calibration | None:
    """``"default"`` -> the hardware's shipped calibration (or None); a Calibration or None as given."""
    if isinstance(calibration, str):
        if calibration == "default":
            return default_calibration(hw)
        return load_calibration(calibration, hw)
    return calibration


def cost_label(hw, calibration: Calibration | None) -> str:
    if calibration is None:
        return f"ceiling: {UNCALIBRATED} (roofline on hardware profile {hw.name})"
    return f"estimate: {calibration.label}"


def _col(cols, name: str, n: int, fill=np.nan) -> np.ndarray:
    v = cols.get(name) if hasattr(cols, "get") else None
    if v is None:
        return np.full(n, fill, dtype=float if not isinstance(fill, str) and fill is not None else object)
    return np.asarray(v)


def cost_columns(cols, hw, calibration: Calibration | None, overrides=None, op_overrides=()) -> dict:
    """The cost model on column arrays (a dict or DataFrame of OpTable columns): returns the cost columns
    of the module docstring as numpy arrays. ``calibration`` must already be resolved (or None);
    ``overrides``: assumption values to use instead of :mod:`m3lab.cost.assumptions`' (the sensitivity table);
    ``op_overrides``: :class:`m3lab.cost.overrides.OpOverride` s of the calibrated cost (with any, the result also
    has ``override`` and ``override_ratio``)."""
    kind = np.asarray(cols["kind"], dtype=object)
    n = len(kind)
    w = np.asarray(_col(cols, "w_dtype", n, None), dtype=object)
    a = np.asarray(_col(cols, "act_dtype", n, "bf16"), dtype=object)
    pairs = {}
    peak_dtype = np.empty(n, dtype=object)
    for i, (wd, ad) in enumerate(zip(w, a)):
        key = (wd if isinstance(wd, str) else None, ad)
        if key not in pairs:
            pairs[key] = compute_dtype(key[0], ad, hw)
        peak_dtype[i] = pairs[key]
    peak = np.array([peak_flops(hw, d) for d in peak_dtype], dtype=float)
    mem = sum(finite(_col(cols, c, n, 0.0)) for c in MEMORY_COLUMNS)
    comm = finite(_col(cols, "bytes_comm", n, 0.0))
    flops = finite(_col(cols, "flops", n, 0.0))
    t_c, t_m, t_x, t_b, bound = bound_times_us(flops, mem, comm, peak, hw.hbm_bw, hw.link_bw)
    out = {"peak_dtype": peak_dtype, "t_compute_us": t_c, "t_memory_us": t_m, "t_comm_us": t_x,
           "t_bound_us": t_b, "bound": bound}
    if calibration is None:
        terms = {"source": np.full(n, "ceiling", dtype=object), "efficiency": np.ones(n), "floor_us": np.zeros(n),
                 "inside": np.zeros(n, bool), "eff_terms": np.full(n, "", dtype=object),
                 "floor_term": np.full(n, "", dtype=object)}
    else:
        chosen = select(cols, op_overrides, hw, calibration)
        terms = cost_terms(replaced_paths(cols, chosen), hw, calibration, overrides)
        if op_overrides:
            terms = apply(terms, cols, chosen, hw, calibration)
    t_us = np.where(terms["inside"], 0.0, np.maximum(t_b / terms["efficiency"], terms["floor_us"]))
    return {**out, **terms, "t_us": t_us}


def cost_optable(optable: pd.DataFrame, hw, calibration=None, op_overrides=()) -> pd.DataFrame:
    """Per-op time on ``hw``: the OpTable with the cost columns of the module docstring added (``op_overrides``: as
    for :func:`cost_columns`)."""
    cal = resolve_calibration(hw, calibration)
    out = optable.copy()
    for name, values in cost_columns(optable, hw, cal, op_overrides=op_overrides).items():
        out[name] = values
    out["cost_label"] = cost_label(hw, cal)
    return out
