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


NAME_MIN = 32   # fewest characters the name column keeps before optional columns are dropped


def _width(df, col: str, formats: dict[str, str]) -> int:
    """Characters column ``col`` needs on one line: its header or its widest cell."""
    return max(len(col), *(len(_cell(v, formats.get(col))) for v in df[col]))


def _fit(df, columns: list[str], formats: dict[str, str], optional: list[str], width: int) -> list[str]:
    """``columns`` minus as many of ``optional`` (dropped from its end) as needed for the first column to
    keep NAME_MIN characters in ``width`` terminal columns."""
    columns, optional = list(columns), list(optional)

    while optional and len(df) and _others(df, columns, formats) + NAME_MIN > width:
        columns.remove(optional.pop())
    return columns


def _others(df, columns: list[str], formats: dict[str, str]) -> int:
    """Terminal columns every column but the first takes, borders and padding included."""
    return sum(3 + _width(df, c, formats) for c in columns[1:]) + 4


def _table(title: str, df, columns: list[str], formats: dict[str, str], width: int):
    """One line per row in ``width`` terminal columns: cells never wrap, the first (name) column takes what
    the others leave and ends in '…' when cut."""
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    name_width = max(8, width - _others(df, columns, formats)) if len(df) else None
    for i, col in enumerate(columns):
        table.add_column(col, no_wrap=True, overflow="ellipsis", justify="right" if col in formats else "left",
                         max_width=name_width if i == 0 else None,
                         min_width=None if i == 0 or not len(df) else _width(df, col, formats))
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
    optional: list[str] = []
    if "total_us" in summary.columns and "short_name" in summary.columns:
        cols = ["short_name", "count", "total_us", "share", "cpu_op", "graph_launch", "unattributed"]
        fmts = {"count": "d", "total_us": ",.1f", "share": ".1%", "cpu_op": "d", "graph_launch": "d",
                "unattributed": "d"}
        optional = ["cpu_op", "unattributed", "graph_launch"]      # dropped last to first on a narrow terminal
    elif fmt == "m3lab.dispatch":
        cols, fmts = ["op", "path", "calls", "layers", "kernels", "share", "rejected_paths"], \
            {"calls": "d", "layers": "d", "share": ".1%"}
    else:
        cols, fmts = list(summary.columns), {"calls": "d", "shapes": "d"}
    shown = summary.head(top)
    cols = _fit(shown, cols, fmts, optional, console.width)
    console.print(_table(f"{trace.name} ({fmt}, {len(table)} rows)", shown, cols, fmts, console.width))
    if "total_us" in totals:
        device = totals.get("device_name") or "device not recorded"
        by = ", ".join(f"{k} {v}" for k, v in totals["attribution"].items())
        console.print(f"total GPU time {totals['total_us']:,.1f} µs (measured, {device})\nrows by attribution: {by}")


@trace_app.command("verify")
def verify_cmd(traces: List[Path] = typer.Argument(..., help="one or more traces (dispatch and/or kernel)"),
               expect: str = typer.Option(..., "--expect", help="expectations YAML, or a shipped name "
                                                               "such as minimax_m3_tp4"),
               as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Check fast-path expectations; exit 1 when one fails (or nothing could be checked)."""
    from rich.console import Console

    from m3lab.traces import verify
    from m3lab.vllm.fastpath_expectations import load_expectations  # shipped, a YAML path, or preset:<name>

    result = verify(load_expectations(expect), *traces)
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
