"""Out-of-sample checks of the GEMM calibration; ``python -m m3lab.cost.validate`` prints them.

Two protocols on a measured table (default: the shipped AITER MI355X tables):

- ``every_other_m``: fit on every other M (sorted M values 0, 2, 4, ...) of each table and predict the
  remaining M values;
- ``leave_shape_out``: for each (N, K), fit on all other shapes and predict that shape entirely.

Required of the shipped calibration (tests/test_cost_calibration.py): median absolute relative error ≤ 15%
(every other M) and ≤ 25% (shape left out).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from m3lab.cost.calibration import (BANDWIDTH, CALIBRATIONS, DATA_DIR, fit_gemm, gemm_regime,
                                    grouped_regime, read_measured_table)
from m3lab.spec.hardware import load_hardware

LIMITS = {"every_other_m": 0.15, "leave_shape_out": 0.25, "moe_every_other_tokens": 0.15,
          "moe_leave_shape_out": 0.25}  # the MoE limits are the GEMM ones, for comparison (not an acceptance)


def _predict(train: pd.DataFrame, test: pd.DataFrame, hw, bandwidth: float) -> pd.DataFrame:
    fit = fit_gemm(train, hw, bandwidth)
    fam = str(test["w_dtype"].iloc[0])
    reg = gemm_regime(test, hw)
    eff = fit[fam].efficiency(reg["m"], reg["n"], reg["k"])
    return reg.assign(predicted_us=reg["t_bound_us"] / eff, rel_error=reg["t_bound_us"] / eff / reg["us"] - 1)


def out_of_sample(table: pd.DataFrame, hw, bandwidth: float = BANDWIDTH) -> pd.DataFrame:
    """Per-point predictions of both protocols on the GEMM rows: ``[protocol, held_out, m, n, k, w_dtype, us,
    predicted_us, rel_error]`` (one dtype family per table is validated on its own)."""
    rows = []
    if "op" in table:
        table = table[table["op"] == "gemm"].astype({"m": int, "n": int, "k": int})
    for w, tab in table.groupby("w_dtype"):
        tab = tab.reset_index(drop=True)
        ms = np.sort(tab["m"].unique())
        train = tab[tab["m"].isin(ms[::2])]
        test = tab[~tab["m"].isin(ms[::2])]
        rows.append(_predict(train, test, hw, bandwidth).assign(protocol="every_other_m", held_out="odd M"))
        for (n, k), shape in tab.groupby(["n", "k"]):
            rest = tab.drop(shape.index)
            rows.append(_predict(rest, shape, hw, bandwidth).assign(protocol="leave_shape_out",
                                                                   held_out=f"N={n},K={k}"))
    out = pd.concat(rows, ignore_index=True)
    return out[["protocol", "held_out", "w_dtype", "m", "n", "k", "us", "predicted_us", "rel_error"]]


def moe_out_of_sample(table: pd.DataFrame, hw, bandwidth: float = BANDWIDTH) -> pd.DataFrame:
    """The same two protocols on fused-MoE rows (informational): every other token count, and each
    (inter_dim, experts) shape left out. Columns as :func:`out_of_sample` (m, n, k: the equivalent regime)."""
    moe = table[table["op"] == "fused_moe"].reset_index(drop=True)
    rows = []

    def predict(train, test, protocol, held):
        fit = fit_gemm(train, hw, bandwidth)
        fam = str(test["w_dtype"].iloc[0]) + "_grouped"
        reg = grouped_regime(test, hw)
        pred = reg["t_bound_us"] / fit[fam].efficiency(reg["m"], reg["n"], reg["k"])
        rows.append(reg.assign(predicted_us=pred, rel_error=pred / reg["us"] - 1, protocol=protocol, held_out=held))

    toks = np.sort(moe["tokens"].unique())
    predict(moe[moe["tokens"].isin(toks[::2])], moe[~moe["tokens"].isin(toks[::2])], "moe_every_other_tokens", "odd")
    for (inter, e), shape in moe.groupby(["inter", "experts"]):
        predict(moe.drop(shape.index), shape, "moe_leave_shape_out", f"inter={inter},E={e}")
    out = pd.concat(rows, ignore_index=True)
    return out[["protocol", "held_out", "w_dtype", "m", "n", "k", "us", "predicted_us", "rel_error"]]


def summarize(points: pd.DataFrame) -> pd.DataFrame:
    """Median absolute error per protocol and dtype, with the acceptance limit and pass/fail."""
    g = points.assign(abs_error=points["rel_error"].abs()).groupby(["protocol", "w_dtype"])
    out = g["abs_error"].agg(median_abs_error="median", max_abs_error="max", points="size").reset_index()
    out["limit"] = out["protocol"].map(LIMITS)
    out["passes"] = out["median_abs_error"] <= out["limit"]
    return out


def shipped_table(name: str = "aiter-mi355x") -> pd.DataFrame:
    """The measured rows of a shipped calibration."""
    return pd.concat([read_measured_table(DATA_DIR / f) for f in CALIBRATIONS[name].files], ignore_index=True)


def main() -> None:
    entry = CALIBRATIONS["aiter-mi355x"]
    hw = load_hardware(entry.hardware)
    points = out_of_sample(shipped_table(), hw)
    print(f"GEMM calibration out of sample: {entry.source}; roofline on hardware profile {hw.name}")
    print(summarize(points).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    per_shape = (points[points["protocol"] == "leave_shape_out"].assign(abs_error=lambda d: d["rel_error"].abs())
                 .groupby(["w_dtype", "held_out"])["abs_error"].median())
    print("\nleave-one-shape-out, median |error| per held-out shape:")
    print(per_shape.to_string(float_format=lambda v: f"{v:.3f}"))
    moe = moe_out_of_sample(shipped_table(), hw)
    print("\nfused MoE (AITER MiniMax-M2.5 table, informational):")
    print(summarize(moe).to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
