"""``m3lab trace``: summarize a trace, verify fast-path expectations against traces.

    m3lab trace summarize TRACE [--top 20] [--json]
    m3lab trace verify TRACE [TRACE ...] --expect FILE_OR_NAME [--json]   # exit 1 if one fails

TRACE is any format :func:`m3lab.traces.load_trace` sniffs (m3lab dispatch trace, Kineto JSON,
rocprofv3 CSV/JSON, AITER log; gzip or plain).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, List

import typer

from m3lab.cli.output import echo_json

trace_app = typer.Typer(help="Read kernel/dispatch traces: per-kernel time shares, fast-path checks.",
                        no_args_is_help=True)


def _cell(value: Any, fmt: str | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if fmt and isinstance(value, (int, float)):
        return format(value, fmt)
    return str(value)


def _table(title: str, df, columns: list[str], formats: dict[str, str]):
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in columns:
        table.add_column(col, overflow="fold", justify="right" if col in formats else "left")
    for row in df[columns].itertuples(index=False):
        table.add_row(*(_cell(value, formats.get(col)) for col, value in zip(columns, row)))
    return table


@trace_app.command("summarize")
def summarize_cmd(trace: Path = typer.Argument(..., help="trace file (dispatch JSONL, Kineto JSON, "
                                                         "rocprofv3 CSV/JSON, AITER log; .gz ok)"),
                  top: int = typer.Option(20, "--top", min=1, help="rows to show"),
                  as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Per-kernel time shares (kernel traces) or per-(op, path) counts (dispatch traces)."""
    from rich.console import Console

    from m3lab.traces import load_trace, summarize, summary_totals

    table = load_trace(trace)
    summary = summarize(table)
    totals = summary_totals(table)
    if as_json:
        echo_json({"totals": totals, "rows": summary.head(top).to_dict("records")})
        return
    console = Console()
    fmt = totals["format"]
    if "total_us" in summary.columns and "short_name" in summary.columns:
        cols = ["short_name", "count", "total_us", "share", "cpu_op", "graph_launch", "unattributed"]
        fmts = {"count": "d", "total_us": ",.1f", "share": ".1%", "cpu_op": "d", "graph_launch": "d",
                "unattributed": "d"}
    elif fmt == "m3lab.dispatch":
        cols, fmts = ["op", "path", "calls", "layers", "kernels", "share", "rejected_paths"], \
            {"calls": "d", "layers": "d", "share": ".1%"}
    else:
        cols, fmts = list(summary.columns), {"calls": "d", "shapes": "d"}
    console.print(_table(f"{trace.name} ({fmt}, {len(table)} rows)", summary.head(top), cols, fmts))
    if "total_us" in totals:
        device = totals.get("device_name") or "device not recorded"
        console.print(f"total GPU time {totals['total_us']:,.1f} µs (measured, {device}); "
                      f"rows by attribution: {totals['attribution']}")


@trace_app.command("verify")
def verify_cmd(traces: List[Path] = typer.Argument(..., help="one or more traces (dispatch and/or kernel)"),
               expect: str = typer.Option(..., "--expect", help="expectations YAML, or a shipped name "
                                                               "such as minimax_m3_tp4"),
               as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Check fast-path expectations; exit 1 when one fails (or nothing could be checked)."""
    from rich.console import Console

    from m3lab.traces import Expectations, verify

    result = verify(Expectations.load(expect), *traces)
    if as_json:
        echo_json(result.to_dict())
    else:
        console = Console()
        console.print(f"expectations [bold]{result.expectations}[/bold] on {', '.join(result.traces)}")
        for r in result.results.itertuples(index=False):
            colour = {"pass": "green", "skipped": "yellow"}.get(r.status, "red")
            share = "" if r.share != r.share else f", {r.share:.1%} of the time"
            console.print(f"[{colour}]{r.status:>7}[/{colour}] {r.id} [dim]({r.source}; {r.calls} calls{share})[/dim]",
                          highlight=False)
            console.print(f"         expected: {r.expected}\n         ran:      {r.ran}", highlight=False)
            if r.why:
                console.print(f"         why:      {r.why}", highlight=False)
        failed = ", ".join(sorted(set(result.failed["id"]))) or "nothing could be checked"
        console.print("[green]ok[/green]" if result.ok else f"[red]FAILED[/red]: {failed}")
    if not result.ok:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    """Add the ``trace`` command group to the m3lab app."""
    app.add_typer(trace_app, name="trace")
