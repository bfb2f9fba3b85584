"""Figures of notebook 12 (following the bottleneck): the ladder as a waterfall, the decode step's per-op shares
before and after, and a toggle per fix that re-estimates live in JupyterLab.

Inputs come from :mod:`m3lab.ladder` (``Ladder.table()``, ``Rung.decode_ops``); every title says the figures are
projected and for which hardware profile and calibration.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from m3lab.artifacts import INTERACTIVE_STEP, current_step
from m3lab.ladder.before import BEFORE as REPRESENTED
from m3lab.ladder.ladder import toggled


def _published(row) -> str:
    value = row.get("writeup_gain_pct")
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    shown = f"{value[0]:+g}–{value[1]:+g}%" if isinstance(value, list) else f"{value:+g}%"
    return f"<br>write-up: {shown} {row['writeup_metric']} (published)"


def _switch(row) -> str:
    return "" if row.get("named", True) else "<br>(a switch, not a write-up fix)"


def waterfall(table: pd.DataFrame, title: str) -> go.Figure:
    """Output tokens/s/GPU rung by rung (``Ladder.table()``): the start, each fix's change, the end. A fix's bar
    carries its gain in % and, where the write-up's configuration is this one, the published figure; a rung that is
    no fix the write-up names (``aiter``) says so."""
    rows = table[table["output_tokens_per_s_per_gpu"].notna()].to_dict("records")
    thr = [r["output_tokens_per_s_per_gpu"] for r in rows]
    x = [r["fix"] for r in rows] + ["end"]
    y = [thr[0]] + [b - a for a, b in zip(thr, thr[1:])] + [thr[-1]]
    text = [f"{thr[0]:.1f}"] + [f"{r['gain_pct']:+.1f}%{_published(r)}{_switch(r)}" for r in rows[1:]] + \
        [f"{thr[-1]:.1f}"]
    fig = go.Figure(go.Waterfall(x=x, y=y, measure=["absolute"] + ["relative"] * (len(rows) - 1) + ["total"],
                                 text=text, textposition="outside", connector={"line": {"color": "#999"}},
                                 hovertemplate="%{x}: %{y:+.1f} tok/s/GPU<extra></extra>"))
    fig.update_layout(title=title, yaxis_title="output tokens/s/GPU", showlegend=False,
                      yaxis_range=[0, 1.18 * max(thr)], height=480)
    return fig


def shares_before_after(before: pd.DataFrame, after: pd.DataFrame, title: str,
                        names: tuple[str, str] = ("before", "after"), top: int = 10) -> go.Figure:
    """Horizontal bars: each op's share of the decode step's time (``decode_ops`` tables) before and after, the
    ``top`` ops of either side (the rest as "other"); the step's µs in the legend."""
    keep = list(dict.fromkeys(list(before.nlargest(top, "us")["op"]) + list(after.nlargest(top, "us")["op"])))
    fig = go.Figure()
    for name, df in zip(names, (before, after)):
        per = df.groupby("op")["us"].sum()
        shares = per.reindex(keep).fillna(0.0) / per.sum() * 100
        other = 100 - shares.sum()
        fig.add_trace(go.Bar(y=keep + ["other"], x=list(shares) + [other], orientation="h",
                             name=f"{name} ({per.sum():,.0f} µs per step)",
                             hovertemplate="%{y}: %{x:.1f}% of the step<extra></extra>"))
    fig.update_layout(title=title, barmode="group", xaxis_title="% of the decode step's time",
                      yaxis={"autorange": "reversed"}, height=max(380, 34 * len(keep) + 140))
    return fig


def fix_toggles(start, fixes, *, calibration="default", live: bool | None = None):
    """In an interactive session (``live`` None: not inside a pipeline run), a checkbox per fix that re-estimates
    ``start`` with the ticked fixes on (code fixes ticked off run in m3lab's representation of their state
    before) and redraws the per-op shares against ``start`` with every fix off; otherwise a one-line note."""
    if live is None:
        live = current_step() == INTERACTIVE_STEP
    if not live:
        return "pipeline run: the static ladder above; open the notebook in JupyterLab for a toggle per fix"
    import ipywidgets as widgets  # optional: only the interactive view needs it
    from IPython.display import display

    boxes = {f.name: widgets.Checkbox(value=False, description=f.name, indent=False,
                                      disabled=not (f.is_switch or f.name in REPRESENTED),
                                      tooltip=f.before or ", ".join(f"{k}={v}" for k, v in f.settings.items()))
             for f in fixes}
    out = widgets.Output()
    cache = {frozenset(): toggled(start, fixes, frozenset(), calibration=calibration)}

    def redraw(_=None):
        on = frozenset(n for n, b in boxes.items() if b.value)
        if on not in cache:
            cache[on] = toggled(start, fixes, on, calibration=calibration)
        base, now = cache[frozenset()], cache[on]
        out.clear_output(wait=True)
        with out:
            f = now.figures
            print(f"{f['output_tokens_per_s_per_gpu']:.1f} output tok/s/GPU "
                  f"({(now.throughput / base.throughput - 1) * 100:+.1f}% vs every fix off), TTFT {f['ttft_s']:.3f} s, "
                  f"TPOT {f['tpot_ms']:.2f} ms — projected, {f['label']}")
            display(shares_before_after(base.decode_ops, now.decode_ops, "Decode step by op: every fix off vs the "
                                        f"ticked fixes (% of step time) — projected for {start.hardware.name}",
                                        names=("every fix off", "ticked fixes on")))

    for b in boxes.values():
        b.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox(list(boxes.values())), out])
