"""Notebook 04's figure: the code path vLLM runs for each op, deployment by deployment, as a readable grid.

Input: :func:`m3lab.analysis.paths.path_cells` (the rows where deployments differ, each cell in one discrete
category relative to a reference deployment). One square per cell, one legend entry per category, deployment
names along the top, the path, status, kernels and deciding vLLM line of a cell in its hover.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from m3lab.analysis.paths import CATEGORIES

COLOURS = dict(zip(CATEGORIES, ("#2e7d32", "#1f78b4", "#f9a825", "#c62828", "#d0d0d0")))
SYMBOLS = dict(zip(CATEGORIES, ("square", "diamond", "square-x", "x", "square-open")))
ROW_PX = 24


def path_matrix_figure(cells: pd.DataFrame, title: str, reference: str) -> go.Figure:
    """Squares at (deployment, op · layer kind), coloured by category; rows in the resolver's order."""
    rows = list(dict.fromkeys(cells["row"]))
    configs = list(dict.fromkeys(cells["config"]))
    col = {c: i for i, c in enumerate(configs)}            # numeric positions, named by the axes' tick labels
    line = {r: len(rows) - 1 - i for i, r in enumerate(rows)}   # first row at the top
    fig = go.Figure()
    for cat in CATEGORIES:
        c = cells[cells["category"] == cat]
        hover = [f"<b>{cfg}</b><br>{row}<br>path: {p} ({s})<br>kernels: {k}<br>decided by: {d}"
                 for cfg, row, p, s, k, d in zip(c["config"], c["row"], c["path"], c["status"], c["kernels"],
                                                 c["decided_by"])]
        fig.add_trace(go.Scatter(x=c["config"].map(col), y=c["row"].map(line), mode="markers", name=cat,
                                 hovertext=hover,
                                 hoverinfo="text", marker=dict(symbol=SYMBOLS[cat], size=16, color=COLOURS[cat],
                                                               line=dict(width=1, color="#555"))))
    fig.update_layout(
        title=dict(text=title, y=0.995, yanchor="top"), height=ROW_PX * len(rows) + 260,
        legend=dict(orientation="h", yanchor="top", y=-0.01, xanchor="left", x=0, title_text=""),
        margin=dict(t=190, l=10, r=130, b=50), plot_bgcolor="white",
        xaxis=dict(side="top", tickvals=list(col.values()), ticktext=configs, tickangle=-35, showgrid=True,
                   gridcolor="#eee", zeroline=False, range=[-0.5, len(configs) - 0.5],
                   title_text=f"deployment (reference for 'the reference's path': {reference})"),
        yaxis=dict(tickvals=list(line.values()), ticktext=rows, showgrid=True, gridcolor="#eee", zeroline=False,
                   range=[-0.7, len(rows) - 0.3], title_text="op · layer kind"))
    return fig
