"""Latency distributions of a simulated run (notebooks 06, 10, 11): TTFT split into its parts, TPOT over time,
queue length over time.

Inputs are the runs' own tables: per request (``ServingEstimate.ttft_parts()``, ``PDServing.requests``,
``CachedServing.requests``) and per engine step (``ServingEstimate.steps``, ``PDServing.engines``,
``CachedServing.timeline``). Times in s, TPOT in ms.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

PART_COLOURS = {"queueing_s": "#b05a2f", "prefill_s": "#2f6fb0", "handoff_s": "#8c6bb1", "first_decode_s": "#5a9e6f"}


def ttft_parts(requests: pd.DataFrame, parts: list[str], title: str) -> go.Figure:
    """Each request's TTFT as stacked parts, requests sorted by TTFT (the parts' medians in the legend)."""
    df = requests.assign(_ttft=requests[parts].sum(axis=1)).sort_values("_ttft").reset_index(drop=True)
    fig = go.Figure()
    for p in parts:
        fig.add_trace(go.Bar(x=df.index, y=df[p], name=f"{p[:-2]} (median {df[p].median():.3g} s)",
                             marker_color=PART_COLOURS.get(p), marker_line_width=0))
    fig.update_layout(title=title, barmode="stack", bargap=0, height=420, xaxis_title="requests, sorted by TTFT",
                      yaxis_title="TTFT (s)")
    return fig


def tpot_over_time(requests: pd.DataFrame, title: str, time_col: str = "first_token_s",
                   tpot_col: str = "tpot_ms") -> go.Figure:
    """Each request's TPOT (ms) at the time of its first token, with the running median of 25 requests."""
    df = requests[[time_col, tpot_col]].dropna().sort_values(time_col)
    fig = go.Figure([go.Scatter(x=df[time_col], y=df[tpot_col], mode="markers", name="per request",
                                marker=dict(size=4, color="#2f6fb0", opacity=0.5)),
                     go.Scatter(x=df[time_col], y=df[tpot_col].rolling(25, min_periods=1, center=True).median(),
                                mode="lines", name="running median (25 requests)", line=dict(color="#d08c2f"))])
    fig.update_layout(title=title, height=380, xaxis_title="time of the first token (s since start)",
                      yaxis_title="TPOT (ms)")
    fig.update_yaxes(rangemode="tozero")
    return fig


def queue_over_time(steps: pd.DataFrame | dict, title: str, time_col: str = "start_s") -> go.Figure:
    """Running and waiting requests at each engine step; ``steps`` one table, or {instance name: table}."""
    tables = steps if isinstance(steps, dict) else {"": steps}
    fig = go.Figure()
    for name, df in tables.items():
        label = f"{name}: " if name else ""
        for col, dash in (("running", None), ("waiting", "dot")):
            fig.add_trace(go.Scatter(x=df[time_col], y=df[col], mode="lines", name=f"{label}{col}",
                                     line=dict(shape="hv", dash=dash)))
    fig.update_layout(title=title, height=380, xaxis_title="time since start (s)", yaxis_title="requests")
    fig.update_yaxes(rangemode="tozero")
    return fig
