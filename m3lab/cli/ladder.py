"""``m3lab ladder``: the write-up's fixes switched on one at a time between two deployments, each step estimated.

    m3lab ladder --from mxfp8-tp4-baseline --to mxfp8-tp4-optimised --concurrency 32 [--json]
    m3lab ladder --to eagle3-mxfp8-tp4 --accept-len 2.7 --accept-dataset MT-Bench
    m3lab ladder --fixes                                      (the fixes as data)

The deployment options (``--tp``, ``--isl``, ``--concurrency``, ``--set KEY=VALUE`` ...) apply to both ends; the
acceptance of speculative decoding (``--accept-len``) to the target, and to the step that switches speculation on.
"""
from __future__ import annotations

from typing import Optional

import typer

from m3lab.cli import deploy_options as opt
from m3lab.cli.output import echo_json
from m3lab.pipeline.validate import is_null

FROM_DEFAULT, TO_DEFAULT = "mxfp8-tp4-baseline", "mxfp8-tp4-optimised"


def ladder_cmd(
        from_: str = typer.Option(FROM_DEFAULT, "--from", metavar="PRESET", help="deployment the ladder starts from"),
        to: str = typer.Option(TO_DEFAULT, "--to", metavar="PRESET", help="deployment it climbs to"),
        model: opt.Model = None, hardware: opt.HardwareName = None, tp: opt.Tp = None, ep: opt.Ep = None,
        quant: opt.Quant = None, kv_dtype: opt.KvDtype = None, index_dtype: opt.IndexDtype = None,
        isl: opt.Isl = None, osl: opt.Osl = None, concurrency: opt.Concurrency = None,
        num_prompts: opt.NumPrompts = None, set_: opt.Settings = [],
        calibration: Optional[str] = typer.Option(None, "--calibration", metavar="NAME|CSV",
                                                  help="as for estimate (default: the hardware's shipped one)"),
        accept_len: Optional[float] = typer.Option(None, "--accept-len", metavar="A",
                                                   help="a --to that speculates: mean tokens accepted per step, "
                                                        "bonus token included (its traffic: --accept-dataset)"),
        accept_dataset: Optional[str] = typer.Option(None, "--accept-dataset", metavar="NAME",
                                                     help="the traffic --accept-len was measured on (MT-Bench, ...)"),
        list_fixes: bool = typer.Option(False, "--fixes", help="print the fixes as data and exit"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Switch the write-up's fixes on one at a time and estimate each step (projected), beside the write-up's own
    figure for a fix where its configuration is this one."""
    from m3lab.ladder import fixes as fx  # local: pulls in pandas

    if list_fixes:
        _print_fixes(fx, as_json)
        return
    from m3lab.ladder.evaluate import check  # local: pulls in pandas, torch
    from m3lab.ladder.ladder import plan, run  # local: pulls in pandas, torch

    flags = dict(model=model, hardware=hardware, tp=tp, ep=ep, quant=quant, kv_dtype=kv_dtype,
                 index_dtype=index_dtype, isl=isl, osl=osl, concurrency=concurrency, num_prompts=num_prompts)
    start = opt.build(from_, set_, **flags)
    target = opt.build(to, set_, accept_len=accept_len, accept_dataset=accept_dataset, **flags)
    for d in (start, target):
        check(d)
    plan(start, target)
    cal = "default" if calibration is None else (None if is_null(calibration) else calibration)
    lad = run(start, target, calibration=cal, progress=lambda line: typer.secho(line, err=True, fg="cyan"))
    if as_json:
        echo_json(lad.to_dict())
    else:
        _print(lad)


def _writeup(step: dict) -> str:
    """The write-up's figure for this step's fix when its configuration is this one, else a dash."""
    value = step["writeup_gain_pct"]
    if not step["named"]:
        return "none: a switch, not a write-up fix"
    if value is None:
        return "—" if step["writeup_text"] else ""
    shown = f"{value[0]:+g}–{value[1]:+g}%" if isinstance(value, list) else f"{value:+g}%"
    return f"{shown} {step['writeup_metric']}"


def _print(lad) -> None:
    from rich.console import Console
    from rich.table import Table

    d, data = lad.target, lad.to_dict()
    table = Table(title=f"Optimisation ladder {lad.start.name} -> {d.name}: {d.workload.isl} in / {d.workload.osl} "
                        f"out, concurrency {d.workload.concurrency} (projected for {d.hardware.name})")
    for col, just in (("step", "left"), ("output tok/s/GPU", "right"), ("TTFT s", "right"), ("TPOT ms", "right"),
                      ("gain %", "right"), ("write-up (published)", "left")):
        table.add_column(col, justify=just, overflow="fold")
    for s in data["steps"]:
        if s["output_tokens_per_s_per_gpu"] is None:
            table.add_row(s["fix"], "not estimated", "", "", "", _writeup(s))
            continue
        gain = "" if s["gain_pct"] is None else f"{s['gain_pct']:+.1f}"
        table.add_row(s["fix"], f"{s['output_tokens_per_s_per_gpu']:.1f}", f"{s['ttft_s']:.3f}",
                      f"{s['tpot_ms']:.2f}", gain, _writeup(s))
    console = Console()
    console.print(table)
    for s in data["steps"]:
        if s["note"]:
            console.print(f"{s['fix']}: {s['note']}", highlight=False)
        if s["writeup_text"] and s["writeup_gain_pct"] is None:
            console.print(f"— {s['fix']}: the write-up's figure is for another configuration ({s['writeup_text']}: "
                          f"{s['writeup_configuration']})", highlight=False)
    console.print(f"{data['kind']}: {data['label']}", highlight=False)
    if data["before"]:
        console.print(f"start: {data['before']}", highlight=False)


def _print_fixes(fx, as_json: bool) -> None:
    if as_json:
        echo_json({"fixes": [f.to_dict() for f in fx.FIXES]})
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="The write-up's fixes (m3lab.ladder.fixes)", show_lines=True)
    frame = fx.table()
    for col in frame.columns:
        table.add_column(col, overflow="fold")
    for row in frame.itertuples(index=False):
        table.add_row(*(str(v) for v in row))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("ladder")(ladder_cmd)
