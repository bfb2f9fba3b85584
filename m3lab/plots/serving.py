"""Figures of the serving estimates (notebook 10): measured vs estimated throughput and latency.

Inputs are DataFrames with one row per (source, concurrency): ``source`` in {"measured", "ceiling",
"calibrated", ...}, ``concurrency``, ``output_tokens_per_s_per_gpu``, ``ttft_s``, ``tpot_ms``.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

SOURCE_STYLE = {"measured": dict(color="#222222", symbol="diamond"), "ceiling": dict(color="#2f6fb0", symbol="circle"),
                "calibrated": dict(color="#d08c2f", symbol="square")}


def _style(source: str) -> dict:
    return SOURCE_STYLE.get(source.split(" ")[0], dict(color="#5a9e6f", symbol="x"))


def throughput_vs_concurrency(df: pd.DataFrame, title: str) -> go.Figure:
    """Output tokens/s/GPU against concurrency, one line per source (measured points as markers)."""
    fig = go.Figure()
    for source, sub in df.sort_values("concurrency").groupby("source", sort=False):
        st = _style(str(source))
        mode = "markers" if str(source).startswith("measured") else "lines+markers"
        fig.add_trace(go.Scatter(x=sub["concurrency"], y=sub["output_tokens_per_s_per_gpu"], mode=mode, name=str(source),
                                 marker=dict(color=st["color"], symbol=st["symbol"], size=11),
                                 line=dict(color=st["color"])))
    fig.update_xaxes(type="log", title="concurrency (requests in flight)")
    fig.update_yaxes(title="output tokens/s per GPU", rangemode="tozero")
    fig.update_layout(title=title, height=430)
    return fig


def latency_vs_concurrency(df: pd.DataFrame, title: str) -> go.Figure:
    """Two panels: TTFT (s) and TPOT (ms) against concurrency, one line per source."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["TTFT (s)", "TPOT (ms)"])
    for source, sub in df.sort_values("concurrency").groupby("source", sort=False):
        st = _style(str(source))
        mode = "markers" if str(source).startswith("measured") else "lines+markers"
        for col, metric in ((1, "ttft_s"), (2, "tpot_ms")):
            fig.add_trace(go.Scatter(x=sub["concurrency"], y=sub[metric], mode=mode, name=str(source),
                                     legendgroup=str(source), showlegend=col == 1,
                                     marker=dict(color=st["color"], symbol=st["symbol"], size=10),
                                     line=dict(color=st["color"])), row=1, col=col)
        fig.update_xaxes(type="log", title="concurrency")
    fig.update_yaxes(title_text="s", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="ms", row=1, col=2, rangemode="tozero")
    fig.update_layout(title=title, height=420)
    return fig


def measured_vs_estimate(table: pd.DataFrame, title: str) -> go.Figure:
    """One panel per metric (own unit): bars for measured, calibrated and ceiling. ``table`` has
    ``metric, unit, measured, calibrated, ceiling`` (from ``m3lab.serving.estimate.compare_with_measured``)."""
    sources = [c for c in ("measured", "calibrated", "ceiling") if c in table.columns]
    fig = make_subplots(rows=1, cols=len(table), subplot_titles=[f"{r.metric} ({r.unit})" for r in table.itertuples()])
    for i, r in enumerate(table.itertuples(), start=1):
        vals = [getattr(r, s) for s in sources]
        fig.add_trace(go.Bar(x=sources, y=vals, marker_color=[_style(s)["color"] for s in sources],
                             text=[f"{v:.3g}" for v in vals], textposition="outside", showlegend=False), row=1, col=i)
        fig.update_yaxes(title_text=r.unit, row=1, col=i, rangemode="tozero")
    fig.update_layout(title=title, height=420, margin=dict(t=100))
    return fig


def step_timeline(steps: pd.DataFrame, title: str) -> go.Figure:
    """Engine-step time (ms) over the run, coloured by prefill tokens in the step (the chunked-prefill bumps)."""
    fig = go.Figure(go.Scatter(x=steps["start_s"], y=steps["t_ms"], mode="markers",
                               marker=dict(color=steps["prefill_tokens"], colorscale="Viridis", size=4,
                                           colorbar=dict(title="prefill tokens")),
                               hovertemplate="t=%{x:.2f}s step %{y:.2f} ms<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="time since start (s)", yaxis_title="engine-step time (ms)", height=380)
    return fig
