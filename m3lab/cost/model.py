"""Time per op on a hardware profile: the roofline bound times an achievable efficiency, over OpTable rows.

``cost_optable(optable, hw, calibration)`` adds to every OpTable row (one op in one layer of one
engine step):

| column | meaning |
|---|---|
| ``peak_dtype`` | dtype whose peak bounds the op (``roofline.compute_dtype``) |
| ``t_compute_us`` / ``t_memory_us`` / ``t_comm_us`` | flops / peak, (bytes_compute + bytes_weight + bytes_kv) / HBM bw, bytes_comm / link bw |
| ``t_bound_us``, ``bound`` | the largest term and its name (compute / memory / comm) |
| ``efficiency`` | achievable fraction of the bound: 1 for the ceiling; when calibrated the dense-GEMM fit (GEMMs), the fused-MoE fit (grouped GEMMs; else the dense fit at the dense-equivalent shape) or the kind's default |
| ``floor_us`` | launch/latency floor of the kernel (0 for the ceiling and for ops fused into a neighbour) |
| ``t_us`` | ``max(t_bound_us / efficiency, floor_us)`` |

``calibration=None`` gives the pure ceiling (labelled "uncalibrated bound"); a :class:`Calibration`
(or ``"default"`` for the hardware's shipped one) gives the calibrated estimate. ``cost_label`` names
the hardware profile and the calibration in every row.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from m3lab.cost import kernel_defaults
from m3lab.cost.calibration import UNCALIBRATED, Calibration, default_calibration
from m3lab.cost.roofline import bound_times_us, compute_dtype, peak_flops
from m3lab.spec.gemm_cost import dense_equivalent

GEMM_KINDS = ("gemm", "lm_head")
MEMORY_COLUMNS = ("bytes_compute", "bytes_weight", "bytes_kv")


def resolve_calibration(hw, calibration) -> Calibration | None:
    """``"default"`` -> the hardware's shipped calibration (or None); a Calibration or None as given."""
    if isinstance(calibration, str):
        if calibration == "default":
            return default_calibration(hw)
        from m3lab.cost.calibration import load_calibration
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


def _gemm_shape(cols, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, n, k) of the GEMM ``rows``; a grouped GEMM as its :func:`~m3lab.spec.gemm_cost.dense_equivalent`
    (its launch floor is charged once per kernel)."""
    n_all = len(cols["kind"])
    m, n, k = (_col(cols, c, n_all).astype(float)[rows] for c in ("m", "n", "k"))
    grouped = np.asarray(cols["kind"])[rows] == "grouped_gemm"
    if grouped.any():
        routed = _col(cols, "routed_tokens", n_all).astype(float)[rows]
        active = _col(cols, "experts_active", n_all).astype(float)[rows]
        fallback = np.minimum(_col(cols, "experts", n_all).astype(float)[rows], routed)
        active = np.where(np.isnan(active), fallback, active)
        m_eq, side = dense_equivalent(routed, active, n, k)
        m = np.where(grouped, m_eq, m)
        n = np.where(grouped, side, n)
        k = np.where(grouped, side, k)
    return np.nan_to_num(m, nan=1.0), np.nan_to_num(n, nan=1.0), np.nan_to_num(k, nan=1.0)


def _efficiency(cols, calibration: Calibration) -> np.ndarray:
    kind = np.asarray(cols["kind"], dtype=object)
    eff = np.array([kernel_defaults.achievable(x) for x in kind], dtype=float)
    m_known = ~np.isnan(_col(cols, "m", len(kind)).astype(float))
    rows = np.flatnonzero(np.isin(kind, GEMM_KINDS + ("grouped_gemm",)) & m_known)
    if len(rows):
        m, n, k = _gemm_shape(cols, rows)
        w = np.asarray(_col(cols, "w_dtype", len(kind), "bf16"), dtype=object)[rows].astype(str)
        grouped = kind[rows] == "grouped_gemm"
        if grouped.any():  # a fused-MoE fit, where the calibration has one, sees the whole MoE's regime
            n_all = len(kind)
            routed, active, inter, hidden = (_col(cols, c, n_all).astype(float)[rows] for c in
                                             ("routed_tokens", "experts_active", "inter", "hidden"))
            g_m, g_side = dense_equivalent(routed, active, 3.0 * inter, hidden)  # gate_up + down weights
        for wd in np.unique(w):
            idx = np.flatnonzero(w == wd)
            # every layer repeats the same few shapes: fit each distinct (m, n, k) once
            shapes, inverse = np.unique(np.column_stack([m[idx], n[idx], k[idx]]), axis=0, return_inverse=True)
            eff[rows[idx]] = calibration.gemm_efficiency(shapes[:, 0], shapes[:, 1], shapes[:, 2], wd)[inverse.ravel()]
            gidx = idx[grouped[idx]]
            if len(gidx):
                g = calibration.grouped_efficiency(g_m[gidx], g_side[gidx], wd)
                if g is not None:
                    eff[rows[gidx]] = g
    return eff


def cost_columns(cols, hw, calibration: Calibration | None) -> dict:
    """The cost model on column arrays (a dict or DataFrame of OpTable columns): returns the cost columns
    of the module docstring as numpy arrays. ``calibration`` must already be resolved (or None)."""
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
    mem = sum(np.nan_to_num(_col(cols, c, n, 0.0).astype(float)) for c in MEMORY_COLUMNS)
    comm = np.nan_to_num(_col(cols, "bytes_comm", n, 0.0).astype(float))
    flops = np.nan_to_num(_col(cols, "flops", n, 0.0).astype(float))
    t_c, t_m, t_x, t_b, bound = bound_times_us(flops, mem, comm, peak, hw.hbm_bw, hw.link_bw)
    if calibration is None:
        eff, floor = np.ones(n), np.zeros(n)
    else:
        eff = _efficiency(cols, calibration)
        fused = np.isin(np.asarray(cols["op"], dtype=object), list(kernel_defaults.FUSED_INTO))
        floor = np.where(fused, 0.0, np.array([calibration.floor_us(x) for x in kind], dtype=float))
    t_us = np.maximum(t_b / eff, floor)
    if calibration is not None:   # all-reduces measured on this device (traces/bench/collectives.csv) take that time
        from m3lab.pd.collective_time import measured_comm_us
        t_us = measured_comm_us(cols, hw, t_us)
    return {"peak_dtype": peak_dtype, "t_compute_us": t_c, "t_memory_us": t_m, "t_comm_us": t_x,
            "t_bound_us": t_b, "bound": bound, "efficiency": eff, "floor_us": floor, "t_us": t_us}


def cost_optable(optable: pd.DataFrame, hw, calibration=None) -> pd.DataFrame:
    """Per-op time on ``hw``: the OpTable with the cost columns of the module docstring added."""
    cal = resolve_calibration(hw, calibration)
    out = optable.copy()
    for name, values in cost_columns(optable, hw, cal).items():
        out[name] = values
    out["cost_label"] = cost_label(hw, cal)
    return out


def cost_step(deployment, step, *, calibration="default", routing=None) -> pd.DataFrame:
    """Build the OpTable of one engine ``step`` of ``deployment`` (its model, plan and quantisation) and cost it
    on its hardware."""
    from m3lab.optable import build_optable

    d = deployment
    return cost_optable(build_optable(d.model, d.plan, d.quant, step, routing), d.hardware, calibration)
