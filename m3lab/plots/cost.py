"""Figures of the repetition estimate, byte planes and the roofline (notebooks 02 and 03).

Every function takes DataFrames from ``m3lab.analysis`` / ``m3lab.cost`` and returns a plotly figure
whose title names the unit and the hardware profile the projection is for.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

PLANE_COLORS = {"compute": "#2f6fb0", "persistent": "#d08c2f", "communication": "#5a9e6f"}


def time_by_op_bars(frames: dict[str, pd.DataFrame], label: str, top: int = 10) -> go.Figure:
    """Stacked bars, one per scenario (``{name: repetition table}``), segments = the ``top`` ops by share
    (the rest as "other"); y = µs per engine step."""
    rows = []
    for name, rep in frames.items():
        keep = rep.nlargest(top, "us_per_step")
        rows += [{"scenario": name, "op": r.op, "us": r.us_per_step} for r in keep.itertuples()]
        rest = rep["us_per_step"].sum() - keep["us_per_step"].sum()
        rows.append({"scenario": name, "op": "other", "us": rest})
    df = pd.DataFrame(rows)
    fig = px.bar(df, x="scenario", y="us", color="op", title=f"Time per engine step by op (µs) — projected, {label}")
    fig.update_layout(yaxis_title="µs per engine step", barmode="stack", legend_title="op")
    return fig


def ranking_bars(rep: pd.DataFrame, label: str, top: int = 20, unit: str = "ms_per_1k_output_tokens") -> go.Figure:
    """Horizontal bars: ops ranked by their share of the total, x = ``unit`` (default ms per 1,000 output
    tokens), hover shows calls per step and µs per call."""
    df = rep.nsmallest(top, "rank").iloc[::-1]
    fig = go.Figure(go.Bar(
        x=df[unit], y=df["op"], orientation="h", marker_color="#2f6fb0",
        text=[f"{s:.1%}" for s in df["share"]], textposition="outside",
        customdata=np.column_stack([df["calls_per_step"], df["us_per_call"], df["kind"]]),
        hovertemplate="%{y} (%{customdata[2]}): %{x:.3g}<br>%{customdata[0]:.0f} calls/step × "
                      "%{customdata[1]:.3g} µs/call<extra></extra>"))
    fig.update_layout(title=f"Ranking of ops by total time ({unit.replace('_', ' ')}) — projected, {label}",
                      xaxis_title=unit.replace("_", " "), height=max(350, 22 * len(df) + 120))
    return fig


def plane_bars(planes: dict[str, pd.DataFrame], per: str = "bytes_per_gpu") -> go.Figure:
    """Stacked bars of bytes by plane and part, one bar per scenario (``{name: byte_planes table}``), in GB."""
    rows = []
    for name, df in planes.items():
        rows += [{"scenario": name, "plane": r.plane, "part": f"{r.plane}: {r.part}", "GB": getattr(r, per) / 1e9}
                 for r in df.itertuples()]
    df = pd.DataFrame(rows)
    fig = px.bar(df, x="scenario", y="GB", color="part", pattern_shape="plane",
                 title=f"Bytes per engine step by plane ({per.replace('_', ' ')}, GB) — analytic")
    fig.update_layout(barmode="stack", yaxis_title="GB")
    return fig


def time_by_plane_bars(frames: dict[str, pd.DataFrame], label: str) -> go.Figure:
    """Stacked bars of time per step attributed to planes (``{name: analysis.byte_planes.time_by_plane}``), ms."""
    rows = [{"scenario": name, "plane": r.plane, "ms": r.us / 1e3} for name, df in frames.items()
            for r in df.itertuples()]
    fig = px.bar(pd.DataFrame(rows), x="scenario", y="ms", color="plane",
                 title=f"Time per engine step by plane (ms) — projected, {label}")
    fig.update_layout(barmode="stack", yaxis_title="ms per engine step")
    return fig


def roofline_plot(costed: pd.DataFrame, hw, label: str) -> go.Figure:
    """Each op (summed over layers) placed by arithmetic intensity (FLOP/byte of HBM traffic) and attained
    FLOP/s (its FLOPs over its estimated time), under the hardware's roofs (bf16 and its fastest dtype)."""
    df = costed.assign(mem=costed[["bytes_compute", "bytes_weight", "bytes_kv"]].fillna(0).sum(axis=1))
    g = df.groupby(["op", "kind"]).agg(flops=("flops", "sum"), mem=("mem", "sum"), t_us=("t_us", "sum")).reset_index()
    g = g[(g["flops"] > 0) & (g["mem"] > 0)]
    g["intensity"] = g["flops"] / g["mem"]
    g["tflops"] = g["flops"] / (g["t_us"] * 1e-6) / 1e12
    x = np.logspace(-1, 5, 200)
    fig = go.Figure()
    for dtype in sorted({"bf16", max(hw.peak_flops, key=hw.peak_flops.get)}):
        roof = np.minimum(x * hw.hbm_bw, hw.peak_flops[dtype]) / 1e12
        fig.add_trace(go.Scatter(x=x, y=roof, mode="lines", name=f"roof {dtype}", line=dict(dash="dash")))
    for kind, sub in g.groupby("kind"):
        fig.add_trace(go.Scatter(x=sub["intensity"], y=sub["tflops"], mode="markers+text", name=kind,
                                 text=sub["op"], textposition="top center", marker=dict(size=10)))
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP / HBM byte)")
    fig.update_yaxes(type="log", title="attained TFLOP/s")
    fig.update_layout(title=f"Roofline of one engine step's ops on {hw.name} — projected, {label}", height=520)
    return fig


def calibration_residuals_plot(residuals: pd.DataFrame, name: str) -> go.Figure:
    """Measured vs fitted GEMM time (µs, log-log) for every calibration point, coloured by (N, K)."""
    df = residuals.assign(shape=lambda d: "N=" + d["n"].astype(str) + ",K=" + d["k"].astype(str))
    fig = px.scatter(df, x="us", y="predicted_us", color="shape", symbol="family", log_x=True, log_y=True,
                     hover_data=["m", "rel_error"],
                     title=f"GEMM calibration {name}: fitted vs measured time (µs, measured on the table's device)")
    lo, hi = df["us"].min() / 1.3, df["us"].max() * 1.3
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line=dict(color="grey", dash="dot")))
    return fig
