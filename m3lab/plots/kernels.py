"""Figures of the kernel gates and benchmarks (notebooks 05 and 07).

Inputs are DataFrames from ``m3lab.gates.run_gates`` and ``m3lab.bench.analysis``; every title
says the unit and whether the numbers were measured (and on which device).
"""
from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go


def _device(df: pd.DataFrame) -> str:
    return ", ".join(sorted(set(df["device"].astype(str)))) if "device" in df else "unknown device"


def gate_errors_figure(results: pd.DataFrame) -> go.Figure:
    """Correctness gates: measured error / tolerance per case (log scale; > 1 fails, NaN shown at the top)."""
    df = results[results["kind"] == "correctness"].copy()
    df["ratio"] = (df["value"] / df["limit"].where(df["limit"] > 0)).fillna(0.0)
    df.loc[df["value"].isna() | ((df["limit"] == 0) & (df["value"] > 0)), "ratio"] = 1e3   # NaN / any code mismatch
    df["ratio"] = df["ratio"].clip(lower=1e-4)
    fig = px.strip(df, x="gate", y="ratio", color="passed", hover_data=["case", "value", "limit", "detail"],
                   log_y=True, color_discrete_map={True: "#2f6fb0", False: "#c0392b"},
                   title=f"Correctness gates: relative RMS error / tolerance (exact-code gates: 1e-4 = bit-identical) "
                         f"— measured on {_device(results)}")
    fig.add_hline(y=1.0, line_dash="dash", annotation_text="tolerance")
    fig.update_layout(yaxis_title="error / tolerance (log)", xaxis_title="gate")
    return fig


def speedup_figure(speedups: pd.DataFrame, provider: str = "triton") -> go.Figure:
    """Speed-up of our kernel over cuBLAS bf16 vs M, one line per (N, K), one panel per weight format."""
    df = speedups[speedups["provider"] == provider]
    fig = px.line(df, x="M", y="speedup", color="shape_nk", facet_col="dtype", markers=True, log_x=True,
                  category_orders={"dtype": ["bf16", "mxfp8", "mxfp4"]},
                  title=f"{provider} vs cuBLAS bf16 (time ratio, >1 = faster) — measured on {_device(df)}, "
                        "CUDA-graph replay, weights rotated past L2")
    fig.add_hline(y=1.0, line_dash="dash")
    fig.update_yaxes(title_text="speed-up vs cuBLAS bf16 (×)", col=1)
    return fig


def bandwidth_figure(table: pd.DataFrame, ceiling_tbps: float | None = None) -> go.Figure:
    """Achieved TB/s (fewest bytes / median time) vs M per provider and weight format, with the copy ceiling."""
    df = table.copy()
    df["series"] = df["provider"] + " " + df["dtype"]
    df["shape_nk"] = "N=" + df["N"].astype(str) + ",K=" + df["K"].astype(str)
    df = df.sort_values(["series", "N", "K", "M"])
    fig = px.line(df, x="M", y="tbps", color="series", facet_col="shape_nk", facet_col_wrap=3, markers=True,
                  log_x=True, title=f"Achieved bandwidth (TB/s, fewest bytes / median µs) — measured on {_device(df)}")
    if ceiling_tbps:
        fig.add_hline(y=ceiling_tbps, line_dash="dot", annotation_text=f"copy ceiling {ceiling_tbps:.2f} TB/s")
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    return fig


def tile_gain_figure(gain: pd.DataFrame) -> go.Figure:
    """Decode tiles vs the shape's prefill tile at small M: gain = prefill µs / decode µs − 1."""
    fig = px.bar(gain, x="M", y="gain", color="shape_nk", facet_col="dtype", barmode="group",
                 category_orders={"dtype": ["bf16", "mxfp8", "mxfp4"]},
                 title="Decode tiles vs prefill tiles: time saved (prefill µs / decode µs − 1) — measured, "
                       "NVIDIA_H200 table")
    fig.update_xaxes(type="category")
    fig.update_yaxes(title_text="gain (fraction)", col=1)
    return fig


def targets_table_figure(targets: pd.DataFrame) -> go.Figure:
    """The issue's targets as a table figure: measured vs threshold, pass/fail."""
    fig = go.Figure(go.Table(
        header={"values": ["target", "measured", "threshold", "passed"]},
        cells={"values": [targets["target"], targets["measured"].round(3), targets["op"] + " " +
                          targets["threshold"].astype(str), targets["passed"].map({True: "yes", False: "NO"})]}))
    fig.update_layout(title="GEMM targets (speed-up ratios, measured on the H200 table)")
    return fig
