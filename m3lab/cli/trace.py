"""``m3lab trace``: summarize a trace, verify fast-path expectations against traces.

    m3lab trace summarize TRACE [--top 20] [--json]
    m3lab trace verify TRACE [TRACE ...] --expect FILE_OR_NAME [--json]   # exit 1 if one fails

TRACE is any format :func:`m3lab.traces.load_trace` sniffs (m3lab dispatch trace, Kineto JSON,
rocprofv3 CSV/JSON, AITER log; gzip or plain).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import List

import typer

from m3lab.cli.columns import Column, cell, render, wrap
from m3lab.cli.output import echo_json, progress, progress_wanted

trace_app = typer.Typer(help="Read kernel/dispatch traces: per-kernel time shares, fast-path checks.",
                        no_args_is_help=True)


KINETO_COLUMNS = (Column("short_name", "kernel"), Column("count", fmt="d"), Column("total_us", fmt=",.1f"),
                  Column("share", fmt=".1%"), Column("cpu_op", fmt="d"), Column("graph_launch", fmt="d"),
                  Column("unattributed", fmt="d"))
KINETO_OPTIONAL = ("graph_launch", "unattributed", "cpu_op")    # dropped in this order on a narrow terminal
NAME_MIN = 40   # kernel-name characters kept beside the numbers before optional count columns are dropped
DISPATCH_COLUMNS = (Column("op"), Column("path"), Column("calls", fmt="d"), Column("layers", fmt="d"),
                    Column("share", fmt=".1%"), Column("kernels", detail=True),
                    Column("rejected_paths", "rejected", detail=True))


def summary_lines(summary, totals: dict, title: str, width: int) -> list[str]:
    """The summary table of a trace in ``width`` characters (no name cut or folded mid-word)."""
    fmt = totals["format"]
    rows = summary.to_dict("records")
    if "total_us" in summary.columns and "short_name" in summary.columns:
        columns = list(KINETO_COLUMNS)
        for key in KINETO_OPTIONAL:   # keep the kernel name readable: drop counts nobody needs at 80 columns
            rest = sum(max(len(c.title), *(len(cell(r.get(c.key), c.fmt)) for r in rows)) + 2
                       for c in columns[1:]) if rows else 0
            if width - rest >= NAME_MIN:
                break
            columns = [c for c in columns if c.key != key]
    elif fmt == "m3lab.dispatch":
        columns = list(DISPATCH_COLUMNS)
        if summary["share"].isna().all():
            columns = [c for c in columns if c.key != "share"]
    else:
        columns = [Column(c, fmt="d" if c in ("calls", "shapes") else None) for c in summary.columns]
    return render(rows, columns, width, title=title)


@trace_app.command("summarize")
def summarize_cmd(trace: Path = typer.Argument(..., help="trace file (dispatch JSONL, Kineto JSON, "
                                                         "rocprofv3 CSV/JSON, AITER log; .gz ok)"),
                  top: int = typer.Option(20, "--top", min=1, help="rows to show"),
                  as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Per-kernel time shares (kernel traces) or per-(op, path) counts (dispatch traces)."""
    from m3lab.traces import load_trace, summarize, summary_totals  # local: pulls in pandas

    with progress("reading trace", unit="MB", scale=1e6, enabled=progress_wanted(as_json)) as update:
        table = load_trace(trace, progress=update)
    summary = summarize(table)
    totals = summary_totals(table)
    if as_json:
        echo_json({"totals": totals, "rows": summary.head(top).to_dict("records")})
        return
    width = shutil.get_terminal_size((100, 24)).columns
    shown = f"top {top} of {len(summary)}" if len(summary) > top else f"{len(summary)}"
    title = f"{trace.name}: {totals['format']}, {len(table):,} rows; {shown} summary rows"
    for line in summary_lines(summary.head(top), totals, title, width) if len(summary) else wrap(title, width):
        typer.echo(line)
    for line in footer(summary.head(top), totals):
        typer.echo("\n".join(wrap(line, width)))


def footer(summary, totals: dict) -> list[str]:
    """What the table's totals and labels mean, in sentences."""
    out = []
    if totals["rows"] == 0:
        out.append("no events in this trace: a Kineto trace needs GPU kernel, memcpy or memset events (a profile "
                   "of CPU activity only has none)" if totals["format"] == "kineto" else "no events in this trace")
    if "total_us" in totals:
        device = totals.get("device_name") or "device not recorded"
        by = ", ".join(f"{k} {v}" for k, v in totals["attribution"].items())
        out += [f"total GPU time {totals['total_us']:,.1f} µs (measured, {device})", f"rows by attribution: {by}"]
        if "short_name" in summary.columns and summary["short_name"].str.contains(r" #\d+$").any():
            out.append("kernel #N: one of several template instances with that name (--json gives full names)")
    header = totals.get("header") or {}
    if header:
        out.append(f"recorded on {header.get('device', 'an unnamed device')} at commit "
                   f"{header.get('commit', 'unknown')}; {header.get('note', '')}".rstrip("; "))
    return out


@trace_app.command("verify")
def verify_cmd(traces: List[Path] = typer.Argument(..., help="one or more traces (dispatch and/or kernel)"),
               expect: str = typer.Option(..., "--expect", help="expectations YAML, or a shipped name "
                                                               "such as minimax_m3_tp4"),
               as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Check fast-path expectations; exit 1 when one fails (or nothing could be checked)."""
    from rich.console import Console

    from m3lab.traces import verify  # local: pulls in pandas
    from m3lab.vllm.fastpath_expectations import load_expectations  # local: pulls in pandas; shipped, a YAML path, or preset:<name>

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
