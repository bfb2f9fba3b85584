"""Figures of the grouped-MoE benchmark table (m3lab.bench_analysis.moe.moe_table) and the MoE's share of a decode step.

``source``: where the table's numbers come from (:class:`m3lab.bench_analysis.runs.Source` or its label),
named in every title.
"""
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from m3lab.plots.kernels import provenance, targets_table
from m3lab.spec.model import load_model
from m3lab.spec.plan import ParallelPlan


def m3_moe_label(tp: int = 4) -> str:
    """``"M3 TP4 (H 6144, I 768, 128+1 experts, top-5)"``: the benchmarked MoE shape, from the spec and the plan
    (shared expert fused)."""
    m, plan = load_model("minimax-m3"), ParallelPlan(tp=tp, fused_shared_expert=True)
    shared = f"+{m.n_shared}" if plan.fuses_shared(m) else ""
    topk = m.topk + (m.n_shared if shared else 0)
    return (f"M3 TP{tp} (H {m.hidden}, I {plan.expert_inter_local(m)}, {plan.experts_local(m)}{shared} experts, "
            f"top-{topk})")


def latency_figure(df: pd.DataFrame, source, providers: list[str] | None = None) -> go.Figure:
    """µs per MoE call vs tokens T, one line per provider, one panel per routing."""
    d = df if providers is None else df[df["provider"].isin(providers)]
    fig = px.line(d.sort_values("T"), x="T", y="us_p50", color="provider", facet_col="routing", markers=True,
                  log_x=True, log_y=True, labels={"us_p50": "µs per call (p50)", "T": "tokens T"},
                  title=f"Grouped MoE, {m3_moe_label()}: µs per call — {provenance(source)}")
    return fig


def bandwidth_figure(df: pd.DataFrame, source, providers: list[str] | None = None) -> go.Figure:
    """TB/s over the touched expert-weight bytes vs T, with the measured copy ceiling."""
    d = df if providers is None else df[df["provider"].isin(providers)]
    fig = px.line(d.sort_values("T"), x="T", y="tbps", color="provider", facet_col="routing", markers=True, log_x=True,
                  labels={"tbps": "TB/s on touched expert weights", "T": "tokens T"},
                  title=f"Grouped MoE: TB/s over the expert bytes touched (dashed: copy ceiling) — {provenance(source)}")
    copy = float(df.loc[df["ceiling"] == "copy_tbps", "ceiling_value"].median())
    if copy == copy:
        fig.add_hline(y=copy, line_dash="dash", annotation_text=f"copy {copy:.2f} TB/s (measured)")
    return fig


def ratio_figure(df: pd.DataFrame, numerator: str, denominator: str, title: str, source) -> go.Figure:
    """us(denominator) / us(numerator) by T and routing (> 1: numerator faster)."""
    a = df[df["provider"] == numerator].set_index(["routing", "T"])["us_p50"]
    b = df[df["provider"] == denominator].set_index(["routing", "T"])["us_p50"]
    r = (b / a).dropna().rename("speed-up").reset_index()
    fig = px.bar(r, x="T", y="speed-up", color="routing", barmode="group", text_auto=".2f",
                 title=f"{title}: speed-up = µs({denominator}) / µs({numerator}) — {provenance(source)}")
    fig.update_xaxes(type="category")
    fig.add_hline(y=1.0, line_dash="dot")
    if not len(r):   # a live run without one of the two providers
        fig.add_annotation(text=f"not measured in this run: {numerator} and {denominator} at the same T",
                           showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def targets_figure(targets: pd.DataFrame, source) -> go.Figure:
    """The grouped-MoE targets (:func:`m3lab.bench_analysis.moe.moe_targets`) as a table figure."""
    return targets_table(targets, source, "Grouped-MoE targets")


def share_figure(share: pd.DataFrame, source) -> go.Figure:
    """Step time by op kind: projected OpTable vs the same step with our measured MoE."""
    long = share.melt(id_vars="kind", var_name="basis", value_name="us")
    long["ms"] = long["us"] / 1e3
    a = share.attrs
    moe = share.set_index("kind")
    frac = {c: moe.loc["grouped_gemm", c] / moe[c].sum() for c in ("projected_us", "with_measured_moe_us")}
    return px.bar(long, x="basis", y="ms", color="kind",
                  title=(f"One TP4 decode step (batch {a.get('batch')}), ms by op kind: OpTable projected for "
                         f"{a.get('hardware')} vs MoE measured at T={a.get('measured_T')} ({provenance(source)}); MoE "
                         f"share {frac['projected_us']:.0%} projected, {frac['with_measured_moe_us']:.0%} with "
                         "measured MoE"))
