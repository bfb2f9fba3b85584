"""Figures of notebook 00: the published MXFP8 concurrency-32 before/after result."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots


def headline_figure(table: pd.DataFrame, source: str) -> go.Figure:
    """One panel per metric (its own unit), before vs after; ``table`` from :func:`m3lab.published.headline_table`."""
    fig = make_subplots(rows=1, cols=len(table),
                        subplot_titles=[f"{r.metric} ({r.unit})<br>{r.improvement_x:.2f}× better"
                                        for r in table.itertuples()])
    for i, r in enumerate(table.itertuples(), start=1):
        fig.add_trace(go.Bar(x=["before", "after"], y=[r.before, r.after], marker_color=["#9aa5b1", "#2f6fb0"],
                             text=[f"{r.before:g}", f"{r.after:g}"], textposition="outside",
                             showlegend=False, hovertemplate="%{x}: %{y} " + r.unit + "<extra></extra>"),
                      row=1, col=i)
        fig.update_yaxes(title_text=r.unit, row=1, col=i, rangemode="tozero")
    fig.update_layout(title="MiniMax M3 MXFP8, TP4, 8K in / 1K out, concurrency 32 — "
                            "measured on MI355X (published, not by m3lab)",
                      height=420, margin=dict(t=110), annotations=list(fig.layout.annotations) + [
                          dict(text=f"source: {source}", showarrow=False, xref="paper", yref="paper",
                               x=0, y=-0.18, font=dict(size=10), xanchor="left")])
    return fig
