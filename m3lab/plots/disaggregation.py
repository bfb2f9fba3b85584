"""Figures of notebook 11 (disaggregation and speculation); each takes a DataFrame from m3lab.pd / m3lab.serving."""
from __future__ import annotations

import pandas as pd


def descriptors_per_layer_plot(df: pd.DataFrame, title: str):
    """Descriptors per layer (log scale) for each layout pair, main K/V and index keys apart
    (``df`` from :func:`m3lab.pd.geometry.layout_pairs`)."""
    import plotly.express as px

    d = df.assign(series=df["pair"] + " · " + df["region"])
    fig = px.line(d, x="layer", y="descriptors", color="series", markers=True, log_y=True,
                  hover_data=["bytes", "mean_descriptor_bytes"], title=title)
    fig.update_yaxes(title="descriptors per layer per request (all rank pairs)")
    fig.update_layout(height=430)
    return fig


def bytes_vs_isl_plot(df: pd.DataFrame, title: str):
    """Hand-off GB per request against input tokens (``df`` from :func:`m3lab.pd.geometry.bytes_vs_isl`)."""
    import plotly.express as px

    d = df.assign(gb=df["bytes_per_request"] / 1e9, series=df["tp"] + " · KV " + df["kv_dtype"])
    fig = px.line(d, x="isl", y="gb", color="series", markers=True, log_x=True, hover_data=["transfer_ms"],
                  title=title)
    fig.update_xaxes(title="input tokens per request")
    fig.update_yaxes(title="KV hand-off per request (GB, all decode ranks)")
    fig.update_layout(height=430)
    return fig


def ratio_plot(df: pd.DataFrame, title: str):
    """Tokens/s/GPU (bars) and median TTFT (line) per P:D ratio (``df`` from
    :func:`m3lab.serving.disagg.pd_ratio_sweep`), one bar group per mode."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=["tokens/s per GPU (all P + D GPUs)", "median TTFT (s)"])
    for mode, sub in df.groupby("mode", sort=False):
        fig.add_trace(go.Bar(x=sub["ratio"], y=sub["output_tokens_per_s_per_gpu"], name=f"output, {mode}"), 1, 1)
        fig.add_trace(go.Bar(x=sub["ratio"], y=sub["total_tokens_per_s_per_gpu"], name=f"total, {mode}",
                             opacity=0.45), 1, 1)
        fig.add_trace(go.Scatter(x=sub["ratio"], y=sub["ttft_s"], mode="lines+markers", name=f"TTFT, {mode}"), 1, 2)
    fig.update_xaxes(title="prefill : decode instances")
    fig.update_layout(title=title, height=430, barmode="group")
    return fig


def spec_plot(df: pd.DataFrame, title: str):
    """Output tokens/s/GPU and mean TPOT against the draft length (``df`` from
    :func:`m3lab.serving.speculation.spec_sweep`)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=["output tokens/s per GPU", "mean TPOT (ms)"])
    for mode, sub in df.groupby("mode", sort=False):
        fig.add_trace(go.Scatter(x=sub["k"], y=sub["output_tokens_per_s_per_gpu"], mode="lines+markers",
                                 name=f"{mode}", customdata=sub["accept_len"],
                                 hovertemplate="k=%{x}, accept len %{customdata:.2f}: %{y:.1f}"), 1, 1)
        fig.add_trace(go.Scatter(x=sub["k"], y=sub["tpot_ms"], mode="lines+markers", name=f"TPOT, {mode}"), 1, 2)
    fig.update_xaxes(title="draft tokens per step k (0: no speculation)")
    fig.update_layout(title=title, height=430)
    return fig
