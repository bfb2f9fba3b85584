"""A sweep's comparison: ``comparison.parquet`` (one row per point) and ``sweep.html`` (the headline columns first,
a chart of each headline number, every point's status and failure reason, a link to each point's report).

Columns of the comparison: ``point``, the axes, ``status``, ``error`` and ``run_dir``, then, from every JSON
artifact of the point's run, ``<step>.<artifact>.<key>`` for each number, for each nested number one level down
(``<step>.<artifact>.ceiling.ttft_s``) and for the strings that say what a number is (``kind``, ``label``, ``unit``),
so every figure keeps its label: projected, measured or published.
"""
from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path
from typing import Any

from m3lab.atomic import atomic_path, write_text
from m3lab.pipeline.run_folder import REPORT, SUMMARY, safe_name

SWEEP = "sweep.json"
COMPARISON = "comparison.parquet"
SWEEP_REPORT = "sweep.html"
LABEL_KEYS = ("kind", "label", "unit", "device", "source")   # strings kept: what a number is and where it is from
# the numbers a performance team reads first, in this order (any artifact key with one of these names)
HEADLINE_KEYS = ("output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms", "total_tokens_per_s_per_gpu",
                 "hit_rate_tokens", "passed", "failed")


def point_name(overrides: list[str]) -> str:
    """The run folder name of a grid point: its overrides joined, list values without brackets or spaces
    (``tp=8,concurrencies=1+8+32``; nested lists ``ratios=1x1+2x1``)."""
    import yaml

    parts = []
    for item in overrides:
        key, _, raw = item.partition("=")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        parts.append(f"{key}={_flat(value)}")
    return safe_name(",".join(parts) or "defaults")


def _flat(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "+".join(("x".join(map(str, v)) if isinstance(v, (list, tuple)) else _flat(v)) for v in value)
    return str(value).replace(" ", "")


def point_status(folder: Path, entry: dict) -> tuple[str, str | None]:
    """A point's (status, error) as its run folder's summary.json says now (a point resumed by hand, or one a
    Ctrl-C left ``pending`` in sweep.json although it finished), else as sweep.json says."""
    run_dir = folder / entry["run_dir"] if entry.get("run_dir") else None
    if run_dir is None or not (run_dir / SUMMARY).is_file():
        return entry["status"], entry.get("error")
    try:
        summary = json.loads((run_dir / SUMMARY).read_text(encoding="utf-8"))
        failed = next((s for s in summary["steps"] if s.get("status") == "failed"), None)
        return summary["status"], (f"{failed['name']}: {failed['error']}" if failed else entry.get("error"))
    except (OSError, ValueError, KeyError, TypeError):
        return entry["status"], entry.get("error")


def _artifact_columns(prefix: str, data: dict, row: dict, depth: int = 0) -> None:
    for key, value in data.items():
        name = f"{prefix}.{key}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[name] = value
        elif isinstance(value, bool):
            row[name] = int(value)
        elif isinstance(value, str) and key in LABEL_KEYS:
            row[name] = value
        elif isinstance(value, dict) and depth == 0:
            _artifact_columns(name, value, row, depth + 1)


def comparison_table(folder: str | os.PathLike, record: dict | None = None):
    """One row per point of the sweep in ``folder`` (columns: module docstring); headline columns first."""
    import pandas as pd

    folder = Path(folder)
    record = record or json.loads((folder / SWEEP).read_text(encoding="utf-8"))
    rows = []
    for entry in record["points"]:
        status, error = point_status(folder, entry)
        run_dir = folder / entry["run_dir"] if entry.get("run_dir") else None
        row = {"point": entry.get("name") or point_name(entry["overrides"][len(record.get("overrides", [])):]),
               **{k: v for k, v in (o.split("=", 1) for o in entry["overrides"])},
               "status": status, "error": error, "run_dir": entry.get("run_dir")}
        for path in sorted((run_dir / "artifacts").glob("*/*.json")) if run_dir is not None else []:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                _artifact_columns(f"{path.parent.name}.{path.stem}", data, row)
        rows.append(row)
    table = pd.DataFrame(rows)
    return table[ordered_columns(list(table.columns), list(record["axes"]))]


def ordered_columns(columns: list[str], axes: list[str]) -> list[str]:
    """point, the axes, status and error; then the headline numbers (HEADLINE_KEYS order, each followed by its
    artifact's label); then everything else."""
    first = [c for c in ("point", *axes, "status", "error") if c in columns]
    headline = []
    for key in HEADLINE_KEYS:
        for c in columns:
            if c.rsplit(".", 1)[-1] == key and c.count(".") == 2 and c not in headline:
                headline.append(c)
                artifact = c.rsplit(".", 1)[0]
                headline += [f"{artifact}.{k}" for k in LABEL_KEYS if f"{artifact}.{k}" in columns
                             and f"{artifact}.{k}" not in headline]
    return first + headline + [c for c in columns if c not in first and c not in headline]


def headline_columns(table) -> list[str]:
    """The numeric headline columns of a comparison (what the chart shows)."""
    return [c for c in table.columns if c.count(".") == 2 and c.rsplit(".", 1)[-1] in HEADLINE_KEYS
            and table[c].dtype.kind in "if"]


def write_comparison(folder: Path, record: dict) -> Any:
    """Write comparison.parquet and sweep.html of the sweep in ``folder``; returns the table."""
    table = comparison_table(folder, record)
    with atomic_path(folder / COMPARISON) as tmp:
        table.to_parquet(tmp, index=False)
    write_text(folder / SWEEP_REPORT, sweep_html(folder, record, table))
    return table


def _cell(v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return "<td></td>" if isinstance(v, float) and math.isnan(v) else f'<td class="num">{v:,.4g}</td>'
    return "<td></td>" if v is None else f"<td>{html.escape(str(v))}</td>"


def _chart(table) -> str:
    """A plotly bar chart per headline number (one bar per point), each titled with its artifact's label."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    cols = headline_columns(table)[:4]
    if not cols:
        return "<p>No headline number (throughput, latency, hit rate, gate counts) in the points' artifacts.</p>"
    titles = []
    for c in cols:
        label_col = c.rsplit(".", 1)[0] + ".label"
        labels = sorted(set(table[label_col].dropna())) if label_col in table else []
        label = labels[0] if len(labels) == 1 else ("labels differ per point" if labels else "label not recorded")
        titles.append(f"{c.rsplit('.', 1)[-1]}<br><sup>{html.escape(label[:110])}</sup>")
    fig = make_subplots(rows=len(cols), cols=1, subplot_titles=titles, vertical_spacing=0.5 / len(cols))
    for i, c in enumerate(cols, start=1):
        ok = table["status"] == "ok"
        fig.add_trace(go.Bar(x=table.loc[ok, "point"], y=table.loc[ok, c], name=c, showlegend=False,
                             hovertemplate="%{x}: %{y:,.4g}<extra>" + html.escape(c) + "</extra>"), row=i, col=1)
    fig.update_layout(height=260 * len(cols) + 80, margin=dict(l=60, r=20, t=60, b=40),
                      title="Headline numbers per point (failed points have no bar)")
    return fig.to_html(full_html=False, include_plotlyjs=True)


def sweep_html(folder: Path, record: dict, table) -> str:
    """The sweep's page: what was swept, the chart, then the table (headline columns first)."""
    shown = [c for c in table.columns if c != "run_dir"]
    head = "".join(f'<th title="{html.escape(c)}">{html.escape(c.rsplit(".", 1)[-1] if c.count(".") >= 2 else c)}'
                   f'<br><small>{html.escape(c.rsplit(".", 1)[0]) if c.count(".") >= 2 else ""}</small></th>'
                   for c in shown) + "<th>report</th>"
    body = []
    for row in table.to_dict("records"):
        link = f'<a href="{html.escape(row["run_dir"])}/{REPORT}">report</a>' if row.get("run_dir") else ""
        cls = "" if row.get("status") == "ok" else ' class="bad"'
        body.append(f"<tr{cls}>" + "".join(_cell(row[c]) for c in shown) + f"<td>{link}</td></tr>")
    axes = ", ".join(f"{k} = {v}" for k, v in record["axes"].items())
    failed = [r for r in table.to_dict("records") if r.get("status") != "ok"]
    failures = "".join(f"<li><b>{html.escape(str(r['point']))}</b>: {html.escape(str(r['status']))} — "
                       f"{html.escape(str(r.get('error') or 'no reason recorded'))}</li>" for r in failed)
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>sweep {html.escape(folder.name)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5rem;color:#1d2330}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #dde;padding:2px 6px;text-align:left;vertical-align:top}}td.num{{text-align:right}}
tr.bad td{{background:#fff0f0}}</style></head><body>
<h1>Sweep of pipeline {html.escape(record['pipeline'])}</h1><p>grid: {html.escape(axes)}; common parameters:
{html.escape(' '.join(record.get('overrides', [])) or 'none')}; {len(table) - len(failed)} of {len(table)} points ok.</p>
{f'<p>Points that did not finish:</p><ul>{failures}</ul>' if failed else ''}
{_chart(table)}
<p>One row per point: the headline numbers first, each followed by its label (projected, measured or published, as
the notebook labels it), then every other number the points' JSON artifacts hold. A column's full name is under its
header and in its tooltip.</p>
<div style="overflow-x:auto"><table><tr>{head}</tr>{''.join(body)}</table></div></body></html>"""
