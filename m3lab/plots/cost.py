"""Figures of the repetition estimate, byte planes and the roofline (notebooks 02 and 03).

Every function takes DataFrames from ``m3lab.analysis`` / ``m3lab.cost`` and returns a plotly figure
whose title names the unit and the hardware profile the projection is for.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

def _shares(df: pd.DataFrame, value: str, unit: str, scale: float = 1.0) -> pd.DataFrame:
    """Add ``share`` (% of its scenario) and label each scenario with its total (scenarios differ by 100x, so
    absolute stacked bars would hide the small ones)."""
    totals = df.groupby("scenario", sort=False)[value].sum()
    df = df.assign(share=100 * df[value] / df["scenario"].map(totals), absolute=df[value] * scale)
    df["scenario"] = df["scenario"].map({k: f"{k}<br>({v * scale:,.3g} {unit})" for k, v in totals.items()})
    return df


def time_by_op_bars(frames: dict[str, pd.DataFrame], label: str, top: int = 10) -> go.Figure:
    """100%-stacked bars, one per scenario (``{name: repetition table}``): each of the ``top`` ops' share of the
    step's time (the rest as "other"); the step's total time is under its name, each op's µs in the hover."""
    rows = []
    for name, rep in frames.items():
        keep = rep.nlargest(top, "us_per_step")
        rows += [{"scenario": name, "op": r.op, "us": r.us_per_step} for r in keep.itertuples()]
        rest = rep["us_per_step"].sum() - keep["us_per_step"].sum()
        rows.append({"scenario": name, "op": "other", "us": rest})
    df = _shares(pd.DataFrame(rows), "us", "µs")
    fig = px.bar(df, x="scenario", y="share", color="op", custom_data=["absolute"],
                 title=f"Share of engine-step time by op (%, step total under each bar) — projected, {label}")
    fig.update_traces(hovertemplate="%{fullData.name}: %{y:.1f}% (%{customdata[0]:,.4g} µs)<extra></extra>")
    fig.update_layout(yaxis_title="% of the step's time", barmode="stack", legend_title="op",
                      yaxis_range=[0, 100])
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
    """100%-stacked bars of bytes by plane and part, one bar per scenario (``{name: byte_planes table}``): shares,
    with each step's total GB under its name and each part's GB in the hover."""
    rows = []
    for name, df in planes.items():
        rows += [{"scenario": name, "plane": r.plane, "part": f"{r.plane}: {r.part}", "GB": getattr(r, per) / 1e9}
                 for r in df.itertuples()]
    df = _shares(pd.DataFrame(rows), "GB", "GB")
    fig = px.bar(df, x="scenario", y="share", color="part", pattern_shape="plane", custom_data=["absolute"],
                 title=f"Share of bytes per engine step by plane ({per.replace('_', ' ')}, %) — analytic")
    fig.update_traces(hovertemplate="%{fullData.name}: %{y:.1f}% (%{customdata[0]:,.4g} GB)<extra></extra>")
    fig.update_layout(barmode="stack", yaxis_title="% of the step's bytes", yaxis_range=[0, 100])
    return fig


def time_by_plane_bars(frames: dict[str, pd.DataFrame], label: str) -> go.Figure:
    """100%-stacked bars of time per step attributed to planes (``{name: analysis.byte_planes.time_by_plane}``),
    with each step's total ms under its name."""
    rows = [{"scenario": name, "plane": r.plane, "ms": r.us / 1e3} for name, df in frames.items()
            for r in df.itertuples()]
    df = _shares(pd.DataFrame(rows), "ms", "ms")
    fig = px.bar(df, x="scenario", y="share", color="plane", custom_data=["absolute"],
                 title=f"Share of engine-step time by plane (%) — projected, {label}")
    fig.update_traces(hovertemplate="%{fullData.name}: %{y:.1f}% (%{customdata[0]:,.4g} ms)<extra></extra>")
    fig.update_layout(barmode="stack", yaxis_title="% of the step's time", yaxis_range=[0, 100])
    return fig


def roofline_plot(costed: pd.DataFrame, hw, label: str, labelled: int = 8) -> go.Figure:
    """Each op (summed over layers) placed by arithmetic intensity (FLOP/byte of HBM traffic) and attained
    FLOP/s (its FLOPs over its estimated time), under the roofs of the compute dtypes the ops run at
    (``peak_dtype``); the ``labelled`` slowest ops are named on the plot, every op in the hover."""
    df = costed.assign(mem=costed[["bytes_compute", "bytes_weight", "bytes_kv"]].fillna(0).sum(axis=1))
    g = df.groupby(["op", "kind"]).agg(flops=("flops", "sum"), mem=("mem", "sum"), t_us=("t_us", "sum")).reset_index()
    g = g[(g["flops"] > 0) & (g["mem"] > 0)]
    g["intensity"] = g["flops"] / g["mem"]
    g["tflops"] = g["flops"] / (g["t_us"] * 1e-6) / 1e12
    x = np.logspace(-1, 5, 200)
    fig = go.Figure()
    used = [d for d in costed.get("peak_dtype", pd.Series(dtype=object)).dropna().unique() if d in hw.peak_flops]
    for dtype in sorted(set(used) or {"bf16"}, key=lambda d: hw.peak_flops[d]):
        roof = np.minimum(x * hw.hbm_bw, hw.peak_flops[dtype]) / 1e12
        fig.add_trace(go.Scatter(x=x, y=roof, mode="lines", name=f"roof {dtype}", line=dict(dash="dash")))
    named = set(g.nlargest(labelled, "t_us")["op"])
    for kind, sub in g.groupby("kind"):
        fig.add_trace(go.Scatter(x=sub["intensity"], y=sub["tflops"], mode="markers+text", name=kind,
                                 text=[op if op in named else "" for op in sub["op"]], customdata=sub["op"],
                                 hovertemplate="%{customdata}: %{x:.3g} FLOP/B, %{y:.3g} TFLOP/s<extra></extra>",
                                 textposition="top center", marker=dict(size=10)))
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
