"""``m3lab gate`` (checklist step 5).

    m3lab gate [--device cpu|cuda] [--only 'gemm.*'] [--no-perf] [--threshold 0.10] [--baseline CSV] [--json]

``gate`` exits 0 when every correctness and performance gate passes, 1 otherwise (2 on bad input).
"""
from __future__ import annotations

import os
import warnings
from typing import List, Optional

import typer

from m3lab.cli.columns import Column, render
from m3lab.cli.output import echo_json, progress, progress_wanted
from m3lab.errors import M3LabError

def gate(device: str = typer.Option("cpu", help="cpu (Triton interpreter, small shapes) or cuda (model shapes)"),
         only: Optional[List[str]] = typer.Option(None, metavar="PATTERN",
                                                  help="fnmatch pattern of gate names, e.g. 'gemm.*' (repeatable)"),
         perf: bool = typer.Option(True, help="also run the performance gates (cuda, when a baseline exists)"),
         threshold: float = typer.Option(0.10, help="allowed slowdown vs the baseline (0.10 = 10%)"),
         baseline: Optional[str] = typer.Option(None, metavar="CSV",
                                                help="baseline CSV (default traces/gates/baseline_<device>.csv)"),
         save: Optional[str] = typer.Option(None, metavar="CSV", help="write the result table to this CSV"),
         as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Check every kernel against its reference (and its speed against the baseline); one exit code."""
    from pathlib import Path

    from m3lab.gates.runner import check_device  # local: pulls in pandas, torch
    if save and not Path(save).resolve().parent.is_dir():
        raise M3LabError(f"--save {save}: folder {Path(save).parent} does not exist", field="save",
                         hint="create it first, or save elsewhere")
    check_device(device)
    if device == "cpu":   # the interpreter must be on before the gate registry imports the kernels (as run_gates)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from m3lab.bench.perf_gate import run_gates  # local: pulls in pandas, torch
    from m3lab.gates.runner import summary  # local: pulls in pandas, torch
    if only:
        _check_patterns(only)
    with warnings.catch_warnings(), progress("gates", enabled=progress_wanted(as_json)) as update:
        for message in INTERPRETER_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=RuntimeWarning, module=INTERPRETER_MODULE)
        df = run_gates(device, names=only, perf=perf, baseline=baseline, threshold=threshold, progress=update)
    if save:
        df.to_csv(save, index=False)
    result = summary(df)
    if as_json:
        echo_json({"device": device, **result})
    else:
        _print_gates(df, device)
        typer.echo(f"{'PASSED' if result['passed'] else 'FAILED'}: {result['cases'] - result['failed']}/"
                   f"{result['cases']} passed")
    raise typer.Exit(0 if result["passed"] else 1)


# numpy warnings the Triton interpreter raises while it evaluates masked-off lanes (log2(0), 0/0 of padding):
# those lanes are never stored, and every output is checked against its reference by the gate itself
INTERPRETER_MODULE = r"triton\.runtime\.interpreter"
INTERPRETER_WARNINGS = (r"divide by zero encountered", r"invalid value encountered", r"overflow encountered")


def _check_patterns(only: list[str]) -> None:
    import fnmatch

    from m3lab.gates.registry import all_gates  # local: pulls in pandas, torch
    names = list(all_gates())
    if not any(fnmatch.fnmatch(n, pat) for pat in only for n in names):
        raise M3LabError(f"no gate matches --only {' '.join(only)}", field="only",
                         hint=f"gates: {', '.join(sorted(names))}")


def _print_gates(df, device: str) -> None:
    """One block per gate: its cases with metric, value, limit and pass/FAIL (the failure's detail below)."""
    import shutil

    rows = [{**r, "value": f"{r['value']:.3g}", "limit": f"{r['limit']:.3g}",
             "result": "pass" if r["passed"] else "FAIL", "why": "" if r["passed"] else r["detail"]}
            for r in df.to_dict("records")]
    columns = [Column("case"), Column("metric"), Column("value", fmt=""), Column("limit", fmt=""),
               Column("result"), Column("why", detail=True)]
    devices = ", ".join(sorted(set(df["device"]))) if len(df) else device
    width = shutil.get_terminal_size((100, 24)).columns
    for line in render(rows, columns, width, title=f"gates on {devices}", group="gate"):
        typer.secho(line, fg="red" if line.rstrip().endswith("FAIL") else None)


def register(app: typer.Typer) -> None:
    app.command("gate")(gate)
