"""Figures of the kernel gates and benchmarks (notebooks 05 and 07).

Inputs are DataFrames from ``m3lab.bench.perf_gate.run_gates`` and ``m3lab.bench_analysis.gemm``; every title
says the unit and where the numbers come from: ``source`` (:class:`m3lab.bench_analysis.runs.Source`, or
its label) — measured live (device, commit) or recorded (device, commit, date).
"""
from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from m3lab.analysis.display import format_value


def _device(df: pd.DataFrame) -> str:
    return ", ".join(sorted(set(df["device"].astype(str)))) if "device" in df else "unknown device"


def provenance(source) -> str:
    """The title's provenance: a Source's label, or the text given."""
    return getattr(source, "label", None) or str(source)


STATUS_TEXT = {"pass": "pass", "fail": "FAIL", "incomplete": "incomplete", "info": "info"}


def gate_errors_figure(results: pd.DataFrame, source=None) -> go.Figure:
    """Correctness gates: measured error / tolerance per case (log scale; > 1 fails, NaN shown at the top).
    ``source`` defaults to the rows' own: recorded (their device, commit, date) when they carry a commit,
    else measured live here."""
    from m3lab.bench_analysis.runs import Source
    source = source or (Source.of(results, live=False) if "commit" in results else Source.here(_device(results)))
    df = results[results["kind"] == "correctness"].copy()
    df["ratio"] = (df["value"] / df["limit"].where(df["limit"] > 0)).fillna(0.0)
    df.loc[df["value"].isna() | ((df["limit"] == 0) & (df["value"] > 0)), "ratio"] = 1e3   # NaN / any code mismatch
    df["ratio"] = df["ratio"].clip(lower=1e-4)
    fig = px.strip(df, x="gate", y="ratio", color="passed", hover_data=["case", "value", "limit", "detail"],
                   log_y=True, color_discrete_map={True: "#2f6fb0", False: "#c0392b"},
                   title=f"Correctness gates: relative RMS error / tolerance (exact-code gates: 1e-4 = bit-identical) "
                         f"— {provenance(source)}")
    fig.add_hline(y=1.0, line_dash="dash", annotation_text="tolerance")
    fig.update_layout(yaxis_title="error / tolerance (log)", xaxis_title="gate")
    return fig


def speedup_figure(speedups: pd.DataFrame, source, provider: str = "triton") -> go.Figure:
    """Speed-up of our kernel over cuBLAS bf16 vs M, one line per (N, K), one panel per weight format."""
    df = speedups[speedups["provider"] == provider]
    fig = px.line(df, x="M", y="speedup", color="shape_nk", facet_col="dtype", markers=True, log_x=True,
                  category_orders={"dtype": ["bf16", "mxfp8", "mxfp4"]},
                  title=f"{provider} vs cuBLAS bf16 (time ratio, >1 = faster) — {provenance(source)}; CUDA-graph "
                        "replay, weights rotated past L2")
    fig.add_hline(y=1.0, line_dash="dash")
    fig.update_yaxes(title_text="speed-up vs cuBLAS bf16 (×)", col=1)
    return fig


def bandwidth_figure(table: pd.DataFrame, source, ceiling_tbps: float | None = None) -> go.Figure:
    """Achieved TB/s (fewest bytes / median time) vs M per provider and weight format, with the copy ceiling."""
    df = table.copy()
    df["series"] = df["provider"] + " " + df["dtype"]
    df["shape_nk"] = "N=" + df["N"].astype(str) + ",K=" + df["K"].astype(str)
    df = df.sort_values(["series", "N", "K", "M"])
    fig = px.line(df, x="M", y="tbps", color="series", facet_col="shape_nk", facet_col_wrap=3, markers=True,
                  log_x=True, title=f"Achieved bandwidth (TB/s, fewest bytes / median µs) — {provenance(source)}")
    if ceiling_tbps:
        fig.add_hline(y=ceiling_tbps, line_dash="dot", annotation_text=f"copy ceiling {ceiling_tbps:.2f} TB/s")
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    return fig


def tile_gain_figure(gain: pd.DataFrame, source) -> go.Figure:
    """Decode tiles vs the shape's prefill tile at small M: gain = prefill µs / decode µs − 1."""
    fig = px.bar(gain, x="M", y="gain", color="shape_nk", facet_col="dtype", barmode="group",
                 category_orders={"dtype": ["bf16", "mxfp8", "mxfp4"]},
                 title=f"Decode tiles vs prefill tiles: time saved (prefill µs / decode µs − 1) — {provenance(source)}")
    fig.update_xaxes(type="category")
    fig.update_yaxes(title_text="gain (fraction)", col=1)
    return fig


def targets_table(targets: pd.DataFrame, source, title: str) -> go.Figure:
    """Targets as a table figure: the figure measured over the points each title names, the threshold, the
    status (``incomplete`` names the missing points: never a pass)."""
    t = targets
    measured = [v if isinstance(v, str) else format_value(v) or "not measured" for v in t["measured"]]
    threshold = ((t["op"] + " " + t["threshold"].map(format_value)).where(t["op"] != "info", "-")
                 if "op" in t else t.get("threshold", pd.Series("", index=t.index)).map(format_value))
    status = [STATUS_TEXT.get(s, s) + (f": {m}" if m else "") for s, m in zip(t["status"], t.get(
        "missing", pd.Series("", index=t.index)).fillna(""))]
    cols = {"target": t["target"], "measured": measured, "threshold": threshold, "status": status}
    if "routing" in t:
        cols = {"routing": t["routing"], **cols}
    fig = go.Figure(go.Table(header={"values": list(cols)}, cells={"values": list(cols.values())},
                             columnwidth=[3 if k == "target" else 1.5 if k == "status" else 1 for k in cols]))
    fig.update_layout(title=f"{title} — {provenance(source)}", height=60 + 34 * (len(t) + 1))
    return fig


def targets_table_figure(targets: pd.DataFrame, source) -> go.Figure:
    """The GEMM targets (:func:`m3lab.bench_analysis.gemm.gemm_targets`, speed-up ratios) as a table figure."""
    return targets_table(targets, source, "GEMM targets (speed-up ratios vs cuBLAS bf16)")
