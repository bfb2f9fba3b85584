"""Figures of notebook 06 (iterative profiling): cache hit rates, KV usage, queues, latency distributions.

Each function takes a DataFrame from :mod:`m3lab.cache.analysis` or a serving run's tables and returns a
plotly figure; the caller's ``title`` says the unit and whether the numbers are simulated (m3lab's cache,
vLLM's semantics) or projected (step times from the cost model on a hardware profile).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

POLICY_COLOR = {"lru": "#2f6fb0", "lfu": "#d08c2f", "radix": "#5a9e6f"}


def hit_rate_vs_capacity(curve: pd.DataFrame, title: str) -> go.Figure:
    """Token hit rate against capacity (log x), one line per policy; the unlimited cache as a dashed line."""
    fig = go.Figure()
    for policy, sub in curve.groupby("policy", sort=False):
        fin = sub[np.isfinite(sub["capacity_tokens"])].sort_values("capacity_tokens")
        color = POLICY_COLOR.get(policy, "#777777")
        fig.add_trace(go.Scatter(x=fin["capacity_tokens"], y=fin["hit_rate_tokens"], mode="lines+markers",
                                 name=policy, line=dict(color=color)))
        inf = sub[np.isinf(sub["capacity_tokens"])]
        if len(inf):
            fig.add_hline(y=float(inf["hit_rate_tokens"].iloc[0]), line=dict(dash="dash", color="#444444"),
                          annotation_text="unlimited cache (theoretical)", annotation_position="bottom right")
    fig.update_xaxes(type="log", title="KV capacity (tokens)")
    fig.update_yaxes(title="prefix-cache hit rate (hit tokens / prompt tokens)", range=[0, 1])
    fig.update_layout(title=title, height=420)
    return fig


def policy_comparison(curve: pd.DataFrame, title: str) -> go.Figure:
    """Grouped bars: hit rate per policy at each finite capacity."""
    fin = curve[np.isfinite(curve["capacity_tokens"])]
    fig = go.Figure()
    for policy, sub in fin.groupby("policy", sort=False):
        fig.add_trace(go.Bar(x=[f"{c / 1e6:g}M" for c in sub["capacity_tokens"]], y=sub["hit_rate_tokens"],
                             name=policy, marker_color=POLICY_COLOR.get(policy, "#777777")))
    fig.update_layout(barmode="group", title=title, height=400, xaxis_title="KV capacity (tokens)",
                      yaxis_title="hit rate (tokens)")
    return fig


def run_timeline(timeline: pd.DataFrame, title: str) -> go.Figure:
    """Four panels over time: running / waiting requests, KV usage, cumulative evicted blocks, preemptions."""
    t = timeline["time_s"]
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.05,
                        subplot_titles=["requests running / waiting (queue)", "KV cache usage (vLLM's gauge, 0..1)",
                                        "evicted blocks (cumulative)", "preemptions (cumulative)"])
    fig.add_trace(go.Scatter(x=t, y=timeline["running"], name="running", line=dict(color="#2f6fb0")), 1, 1)
    fig.add_trace(go.Scatter(x=t, y=timeline["waiting"], name="waiting", line=dict(color="#c0392b")), 1, 1)
    fig.add_trace(go.Scatter(x=t, y=timeline["kv_usage"], name="KV usage", line=dict(color="#5a9e6f")), 2, 1)
    fig.add_trace(go.Scatter(x=t, y=timeline["evicted_blocks"], name="evicted", line=dict(color="#d08c2f")), 3, 1)
    fig.add_trace(go.Scatter(x=t, y=timeline["preemptions"], name="preemptions", line=dict(color="#7d3c98")), 4, 1)
    fig.update_xaxes(title_text="time (s)", row=4, col=1)
    fig.update_layout(title=title, height=760)
    return fig


def latency_cdf(requests: pd.DataFrame, title: str) -> go.Figure:
    """Empirical CDFs of TTFT (s) and TPOT (ms) per request."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["TTFT (s)", "TPOT (ms)"])
    for col, (metric, color) in enumerate((("ttft_s", "#2f6fb0"), ("tpot_ms", "#d08c2f")), start=1):
        x = np.sort(requests[metric].to_numpy(float))
        x = x[np.isfinite(x)]
        fig.add_trace(go.Scatter(x=x, y=np.arange(1, len(x) + 1) / max(len(x), 1), mode="lines", name=metric,
                                 line=dict(color=color)), 1, col)
    fig.update_yaxes(title_text="share of requests", range=[0, 1], row=1, col=1)
    fig.update_layout(title=title, height=380)
    return fig


def hit_share_by_turn(df: pd.DataFrame, title: str) -> go.Figure:
    """Mean share of the prompt found in the cache, by turn of the session."""
    fig = go.Figure(go.Bar(x=df["turn"], y=df["hit_share"], marker_color="#2f6fb0"))
    fig.update_layout(title=title, height=360, xaxis_title="turn within the session",
                      yaxis_title="hit tokens / prompt tokens", yaxis_range=[0, 1])
    return fig
