"""Figures of traces: kernel time shares, a kernel timeline, and verification results.

Inputs are the DataFrames of :mod:`m3lab.traces` (``summarize``, ``load_trace``, ``verify``); every
figure states its unit and that it is measured, on the device the trace names.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

_ATTRIBUTION_COLOURS = {"cpu_op": "#2f6fb0", "launch": "#6fa8dc", "graph_launch": "#e69138",
                        "unattributed": "#999999"}
_STATUS_COLOURS = {"pass": "#38a169", "fail": "#c53030", "missing": "#c53030", "skipped": "#b7950b"}


def _device(df: pd.DataFrame, device: str | None) -> str:
    return device or df.attrs.get("device_name") or "device not recorded in the trace"


def time_share_bar(summary: pd.DataFrame, *, top: int = 15, device: str | None = None,
                   title: str | None = None) -> go.Figure:
    """Horizontal bars: each kernel's share of the summed GPU kernel time (%), largest first;
    ``summary`` from :func:`m3lab.traces.summarize` on a kernel-events table. The bar colour says
    how most of its calls were launched (operator, plain launch, graph replay, unattributed)."""
    rows = summary.head(top).iloc[::-1]
    attribution = rows[list(_ATTRIBUTION_COLOURS)].idxmax(axis=1)
    fig = go.Figure(go.Bar(
        x=rows["share"] * 100, y=_unique(rows["short_name"]), orientation="h",
        marker_color=[_ATTRIBUTION_COLOURS[a] for a in attribution],
        customdata=list(zip(rows["count"], rows["total_us"], attribution, rows["name"].str[:200])),
        hovertemplate="%{y}<br>%{x:.1f}% of kernel time, %{customdata[0]} calls, "
                      "%{customdata[1]:,.1f} µs<br>mostly %{customdata[2]}<br>%{customdata[3]}<extra></extra>"))
    fig.update_layout(title=title or f"Kernel time share — measured on {_device(summary, device)}",
                      xaxis_title="share of summed GPU kernel time (%)", height=max(300, 28 * len(rows) + 120),
                      margin=dict(l=20, r=20, t=60, b=40))
    return fig


def _unique(names: pd.Series) -> list[str]:
    """Shortened kernel names made unique (``name``, ``name (2)``…): different template instantiations can share
    a short name, and equal category labels would stack their bars into one."""
    seen: dict[str, int] = {}
    out = []
    for n in names.astype(str):
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} ({seen[n]})")
    return out


def timeline(events: pd.DataFrame, *, max_events: int = 5000, device: str | None = None,
             title: str | None = None) -> go.Figure:
    """A Gantt view of kernel events per (device, stream): x is time in µs since the first event,
    colour the attribution; only the first ``max_events`` events (by start) are drawn."""
    ev = events.sort_values("start_us").head(max_events)
    t0 = float(ev["start_us"].min()) if len(ev) else 0.0
    lane = "dev " + ev["device"].astype(str) + " / stream " + ev["stream"].astype(str)
    fig = go.Figure()
    for attribution, colour in _ATTRIBUTION_COLOURS.items():
        sel = ev["attribution"] == attribution
        if not sel.any():
            continue
        part = ev[sel]
        fig.add_trace(go.Bar(
            base=part["start_us"] - t0, x=part["dur_us"], y=lane[sel], orientation="h", name=attribution,
            marker_color=colour, customdata=list(zip(part["name"].map(lambda n: n[:120]), part["dur_us"])),
            hovertemplate="%{customdata[0]}<br>%{customdata[1]:.2f} µs<extra></extra>"))
    fig.update_layout(title=title or f"Kernel timeline — measured on {_device(events, device)}",
                      xaxis_title="time since first event (µs)", barmode="overlay", bargap=0.3,
                      height=max(260, 60 * lane.nunique() + 140), legend_title="attribution")
    return fig


def verification_bar(results: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """One bar per checked expectation: its time share (%; 0 when the trace has no timings),
    coloured by status, with the failed condition in the hover; ``results`` from ``verify(...).results``."""
    rows = results.iloc[::-1]
    label = rows["id"] + " (" + rows["source"] + ")"
    timed = rows["share"].notna().any()
    fig = go.Figure(go.Bar(
        # without timings (a dispatch record, a trace of names only) every bar has unit length: status only
        x=rows["share"].fillna(0) * 100 if timed else [1] * len(rows), y=label, orientation="h",
        marker_color=[_STATUS_COLOURS.get(s, "#999999") for s in rows["status"]],
        text=rows["status"], textposition="outside" if timed else "inside",
        customdata=list(zip(rows["expected"], rows["ran"], rows["why"])),
        hovertemplate="%{y}<br>expected: %{customdata[0]}<br>ran: %{customdata[1]}"
                      "<br>why: %{customdata[2]}<extra></extra>"))
    fig.update_layout(title=title or ("Fast-path expectations — status and share of measured time" if timed else
                                      "Fast-path expectations — status (the record has no timings)"),
                      xaxis_title="share of recorded time (%)" if timed else "", height=max(260, 40 * len(rows) + 120))
    if not timed:
        fig.update_xaxes(visible=False, range=[0, 1])
    return fig
