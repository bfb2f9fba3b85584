"""Figures of the grouped-MoE benchmark table (m3lab.bench.moe.moe_table) and the MoE's share of a decode step."""
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go


def _device(df: pd.DataFrame) -> str:
    return ", ".join(sorted(df["device"].astype(str).unique())) if "device" in df else "?"


def latency_figure(df: pd.DataFrame, providers: list[str] | None = None) -> go.Figure:
    """µs per MoE call vs tokens T, one line per provider, one panel per routing."""
    d = df if providers is None else df[df["provider"].isin(providers)]
    fig = px.line(d.sort_values("T"), x="T", y="us_p50", color="provider", facet_col="routing", markers=True,
                  log_x=True, log_y=True, labels={"us_p50": "µs per call (p50)", "T": "tokens T"},
                  title=f"Grouped MoE, M3 TP4 (H 6144, I 768, 128+1 experts, top-5): µs per call, measured on {_device(df)}")
    return fig


def bandwidth_figure(df: pd.DataFrame, providers: list[str] | None = None) -> go.Figure:
    """TB/s over the touched expert-weight bytes vs T, with the measured copy ceiling."""
    d = df if providers is None else df[df["provider"].isin(providers)]
    fig = px.line(d.sort_values("T"), x="T", y="tbps", color="provider", facet_col="routing", markers=True, log_x=True,
                  labels={"tbps": "TB/s on touched expert weights", "T": "tokens T"},
                  title=f"Grouped MoE: TB/s over the expert bytes touched, measured on {_device(df)} (dashed: copy ceiling)")
    copy = float(df.loc[df["ceiling"] == "copy_tbps", "ceiling_value"].median())
    if copy == copy:
        fig.add_hline(y=copy, line_dash="dash", annotation_text=f"copy {copy:.2f} TB/s (measured)")
    return fig


def ratio_figure(df: pd.DataFrame, numerator: str, denominator: str, title: str) -> go.Figure:
    """us(denominator) / us(numerator) by T and routing (> 1: numerator faster)."""
    a = df[df["provider"] == numerator].set_index(["routing", "T"])["us_p50"]
    b = df[df["provider"] == denominator].set_index(["routing", "T"])["us_p50"]
    r = (b / a).dropna().rename("speed-up").reset_index()
    fig = px.bar(r, x="T", y="speed-up", color="routing", barmode="group", text_auto=".2f",
                 title=f"{title}: speed-up = µs({denominator}) / µs({numerator}), measured on {_device(df)}")
    fig.update_xaxes(type="category")
    fig.add_hline(y=1.0, line_dash="dot")
    return fig


def targets_figure(targets: pd.DataFrame) -> go.Figure:
    t = targets.copy()
    t["measured"] = t["measured"].map(lambda v: "not measured" if v != v else f"{v:.2f}")
    return go.Figure(go.Table(header={"values": list(t.columns)}, cells={"values": [t[c] for c in t.columns]}),
                     layout={"title": "Issue targets vs the recorded H200 table (measured)"})


def share_figure(share: pd.DataFrame) -> go.Figure:
    """Step time by op kind: projected OpTable vs the same step with our measured MoE."""
    long = share.melt(id_vars="kind", var_name="basis", value_name="us")
    long["ms"] = long["us"] / 1e3
    a = share.attrs
    moe = share.set_index("kind")
    frac = {c: moe.loc["grouped_gemm", c] / moe[c].sum() for c in ("projected_us", "with_measured_moe_us")}
    return px.bar(long, x="basis", y="ms", color="kind",
                  title=(f"One TP4 decode step (batch {a.get('batch')}), ms by op kind: OpTable projected for "
                         f"{a.get('hardware')} vs MoE measured (H200, T={a.get('measured_T')}); MoE share "
                         f"{frac['projected_us']:.0%} projected, {frac['with_measured_moe_us']:.0%} with measured MoE"))
