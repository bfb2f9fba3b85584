"""Figures of notebook 01 (local shapes): take the DataFrames of :mod:`m3lab.analysis.shapes`, return plotly figures.

Every figure is projected (analytic schedule, routing model), not measured; titles say so and give units.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

PROJECTED = "projected (analytic)"


def _label(meta: dict) -> str:
    p = meta.get("plan", {})
    return (f"{meta.get('model')} TP{p.get('tp')} EP{p.get('ep')} {meta.get('quant')}, "
            f"{meta.get('isl')} in / {meta.get('osl')} out, concurrency {meta.get('concurrency')}")


def gemm_m_figure(gemm_m: pd.DataFrame, meta: dict) -> go.Figure:
    """Kernel calls (steps x layers) per M for each dense GEMM (N x K); log axes. From ``ShapeReport.gemm_m``."""
    fig = go.Figure()
    # GEMMs that see exactly the same (M, calls) series are drawn once, named together (they would overplot)
    series: dict[tuple, list] = {}
    for (op, n, k), g in gemm_m.groupby(["op", "n", "k"], sort=False):
        key = (tuple(g.m), tuple(g.calls))
        series.setdefault(key, []).append((f"{op} N={n} K={k} ({g.dtype.iloc[0]}, {g.layers.iloc[0]} layers)", g))
    for members in series.values():
        names = [name for name, _ in members]
        g = members[0][1]
        label = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more with the same M"
        fig.add_trace(go.Scatter(x=g.m, y=g.calls, customdata=g.steps, mode="markers+lines", line_shape="hv",
                                 name=label, hovertemplate="M=%{x} rows: %{y} calls (%{customdata} steps)<extra>"
                                 + "<br>".join(names) + "</extra>"))
    fig.update_xaxes(type="log", title_text="M = rows of the GEMM (tokens in the step; requests for the LM head)")
    fig.update_yaxes(type="log", title_text="kernel calls = steps x layers (count)")
    fig.update_layout(title=f"M seen by each dense GEMM — {PROJECTED}<br><sup>{_label(meta)}</sup>",
                      height=480, legend=dict(font=dict(size=10)))
    return fig


def tokens_per_expert_figure(tpe: pd.DataFrame, meta: dict) -> go.Figure:
    """Histogram of tokens one routed expert receives in one step (routing-model draw)."""
    fig = go.Figure(go.Bar(x=tpe.tokens, y=tpe.expert_steps, marker_color="#2f6fb0",
                           hovertemplate="%{x} tokens: %{y} (expert, step) pairs<extra></extra>"))
    fig.update_xaxes(title_text="tokens per expert per step (rows of one expert's GEMM)")
    fig.update_yaxes(type="log", title_text="(expert, step) pairs (count)")
    fig.update_layout(title=f"Tokens per routed expert — {PROJECTED}, routing {meta.get('routing')}"
                            f"<br><sup>{_label(meta)}</sup>", height=420)
    return fig


def attention_ctx_figure(att: pd.DataFrame, meta: dict, bin_tokens: int = 128) -> go.Figure:
    """Histogram of keys visible to each query token (its context length), decode vs prefill, per ``bin_tokens``."""
    fig = go.Figure()
    for phase, g in att.groupby("phase", sort=False):
        bins = (g.ctx.to_numpy() - 1) // bin_tokens
        counts = np.bincount(bins, weights=g.queries.to_numpy())
        nz = np.flatnonzero(counts)
        fig.add_trace(go.Bar(x=nz * bin_tokens + bin_tokens / 2, y=counts[nz], width=bin_tokens, name=phase,
                             opacity=0.75, hovertemplate="ctx≈%{x} tokens: %{y} queries<extra>" + phase + "</extra>"))
    fig.update_layout(barmode="overlay", height=420,
                      title=f"Attention context length per query token — {PROJECTED}<br><sup>{_label(meta)}</sup>")
    fig.update_xaxes(title_text=f"context length (tokens, bins of {bin_tokens})")
    # linear from zero: bar heights compare directly (on a log axis bars start at an arbitrary floor)
    fig.update_yaxes(type="linear", rangemode="tozero", title_text="query tokens (count)")
    return fig


def selected_blocks_figure(sel: pd.DataFrame, meta: dict, topk_blocks: int | None = None) -> go.Figure:
    """Blocks each query token attends on sparse layers (min(context blocks, top-k))."""
    fig = go.Figure(go.Bar(x=sel.blocks, y=sel.queries, marker_color="#b05a2f",
                           hovertemplate="%{x} blocks: %{y} query tokens<extra></extra>"))
    cap = f" (top-k = {topk_blocks})" if topk_blocks else ""
    fig.update_xaxes(title_text=f"selected KV blocks per query token and KV head{cap}", dtick=1)
    fig.update_yaxes(type="log", title_text="query tokens (count)")
    fig.update_layout(title=f"Sparse attention: blocks selected — {PROJECTED}<br><sup>{_label(meta)}</sup>",
                      height=400)
    return fig


def sharding_figure(table: pd.DataFrame, model: str) -> go.Figure:
    """Heads per rank vs TP (left) and how many ranks hold a copy of each KV head / the index key (right)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["heads per rank (count)", "copies per head (ranks)"])
    x = [f"TP{t}" for t in table.tp]
    for col, color in (("heads_q", "#2f6fb0"), ("heads_kv", "#b05a2f"), ("index_heads", "#5a9e4b")):
        if col in table:
            fig.add_trace(go.Bar(x=x, y=table[col], name=col, marker_color=color, text=table[col],
                                 textposition="outside"), row=1, col=1)
    for col, color in (("kv_replication", "#8e44ad"), ("index_key_replication", "#7f7f7f")):
        if col in table:
            fig.add_trace(go.Bar(x=x, y=table[col], name=col, marker_color=color, text=table[col],
                                 textposition="outside"), row=1, col=2)
    # linear axes from zero: the counts are small integers, and a log axis crowds its minor tick labels
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title=f"{model}: head sharding and replication by TP degree — {PROJECTED} (from the config)",
                      barmode="group", height=420)
    return fig
