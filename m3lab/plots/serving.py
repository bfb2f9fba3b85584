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
    fig.update_xaxes(type="log", title="concurrency (requests in flight)", dtick=_log_dtick(df))
    fig.update_yaxes(title="output tokens/s per GPU", rangemode="tozero")
    fig.update_layout(title=_with_measured(title, df), height=430)
    return fig


def _measured_sources(df: pd.DataFrame) -> list[str]:
    return sorted({str(s) for s in df["source"] if str(s).startswith("measured")})


def _with_measured(title: str, df: pd.DataFrame) -> str:
    """The title, plus what the measured points are when there are any (never claims one that is not there)."""
    measured = _measured_sources(df)
    return f"{title}; {', '.join(measured)}" if measured else f"{title}; no measurement of this deployment"


def _log_dtick(df: pd.DataFrame):
    """Major ticks only on a log concurrency axis with few points (minor tick labels crowd it)."""
    return "D2" if df["concurrency"].nunique() > 6 else 1


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
        fig.update_xaxes(type="log", title="concurrency", dtick=_log_dtick(df))
    fig.update_yaxes(title_text="s", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="ms", row=1, col=2, rangemode="tozero")
    fig.update_layout(title=_with_measured(title, df), height=420)
    return fig


def measured_vs_estimate(table: pd.DataFrame, title: str) -> go.Figure:
    """One panel per metric (own unit): bars for measured (when the table has a measurement), calibrated and ceiling.
    ``table`` has ``metric, unit, [measured,] calibrated, ceiling`` (``m3lab.serving.estimate.compare_with_published``)."""
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


def disaggregation_bars(table: pd.DataFrame, title: str) -> go.Figure:
    """Output tokens/s/GPU per prefill:decode worker ratio, one panel per mode (ceiling, calibrated), bars coloured
    by the side that limits the request rate; ``table`` from :func:`m3lab.serving.disagg.disaggregated`."""
    modes = list(dict.fromkeys(table["mode"]))
    fig = make_subplots(rows=1, cols=len(modes), subplot_titles=modes, shared_yaxes=True)
    colours = {"prefill": "#b05a2f", "decode": "#2f6fb0"}
    shown: set = set()
    for col, mode in enumerate(modes, start=1):
        sub = table[table["mode"] == mode]
        for side, part in sub.groupby("limited_by", sort=False):
            fig.add_trace(go.Bar(x=part["ratio"], y=part["output_tokens_per_s_per_gpu"], name=f"limited by {side}",
                                 marker_color=colours.get(side, "#999999"), legendgroup=side,
                                 showlegend=side not in shown,
                                 text=[f"{v:.0f}" for v in part["output_tokens_per_s_per_gpu"]],
                                 textposition="outside"), row=1, col=col)
            shown.add(side)
        fig.update_xaxes(title_text="prefill:decode workers", type="category",
                         categoryorder="array", categoryarray=list(dict.fromkeys(sub["ratio"])), row=1, col=col)
    fig.update_yaxes(title_text="output tokens/s per GPU", rangemode="tozero", row=1, col=1)
    fig.update_layout(title=title, height=420)
    return fig
