"""``m3lab repetition`` (checklist step 2): each op's per-call cost times its calls over a whole workload.

``m3lab repetition --model minimax-m3 --hardware mi355x --tp 4 --quant mxfp8 --isl 8192 --osl 1024
--concurrency 32 --json`` (or ``--preset NAME``, ``--set KEY=VALUE``: the shared deployment options of
:mod:`m3lab.cli.deploy_options`) simulates the serving run (:func:`m3lab.serving.estimate.estimate`), sums
each op's time, FLOPs and bytes over its calls (layers x engine steps; the requests share a step's calls) and
ranks the ops (:func:`m3lab.analysis.repetition.of_run`): ``ops: [{rank, op, kind, calls, calls_per_step,
us_per_call, us_per_step, ms_per_request, ms_per_1k_output_tokens, share, cumulative_share, bound,
gflop_per_request, mb_per_request}]``, ``by_kind``, ``totals`` and ``notes`` (the run's caveats, also printed
to stderr). Times are projected for the hardware profile.
"""
from __future__ import annotations

from typing import Optional

import typer

from m3lab.cli import columns, deploy_options as opt
from m3lab.cli.output import echo_json
from m3lab.cli.planes import calibration_option
from m3lab.errors import M3LabError
from m3lab.nb import format_value


def repetition(
    preset: opt.Preset = None, model: opt.Model = None, hardware: opt.HardwareName = None, tp: opt.Tp = None,
    ep: opt.Ep = None, quant: opt.Quant = None, kv_dtype: opt.KvDtype = None, index_dtype: opt.IndexDtype = None,
    isl: opt.Isl = None, osl: opt.Osl = None, concurrency: opt.Concurrency = None,
    num_prompts: opt.NumPrompts = None, set_: opt.Settings = [],
    calibration: Optional[str] = typer.Option("default", "--calibration",
                                              help="default (the hardware's shipped calibration), none (roofline "
                                                   "ceiling), or a CSV path."),
    top: int = typer.Option(15, "--top", help="Ops listed (ranked by their share of the run's time)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Each op's cost over a whole serving run: per call, per engine step, per request, per 1,000 output tokens."""
    from m3lab.analysis import repetition as rp  # local: pulls in pandas
    from m3lab.serving.estimate import estimate  # local: pulls in pandas

    if top < 1:
        raise M3LabError(f"--top {top} must be a positive number of ops", field="top")
    d = opt.build(preset, set_, model=model, hardware=hardware, tp=tp, ep=ep, quant=quant, kv_dtype=kv_dtype,
                  index_dtype=index_dtype, isl=isl, osl=osl, concurrency=concurrency, num_prompts=num_prompts)
    wl = d.workload   # lengths within the model's context: the record checks them (m3lab.spec.traffic)
    est = estimate(d, calibration=calibration_option(calibration))
    for note in est.notes:       # the run's caveats (too short for steady state, C requests not all at once)
        typer.secho(f"note: {note}", err=True, fg="yellow")
    rep = rp.of_run(est)
    summary = est.summary()
    result = {"workload": {"deployment": d.name, "model": d.model.name, "hardware": d.hardware.name,
                           "tp": d.plan.tp, "ep": d.plan.ep, "quant": d.quant.name, "kv_dtype": d.quant.kv_dtype,
                           "isl": wl.isl, "osl": wl.osl, "concurrency": wl.concurrency,
                           "num_requests": est.config["num_requests"]},
              "label": f"projected for {d.hardware.name}, per GPU — {summary['label']}",
              "totals": {"engine_steps": int(est.steps["repeat"].sum()), "op_time_s": float(rep.attrs["total_us"] / 1e6),
                         "output_tokens": int(rep.attrs["output_tokens"]),
                         "output_tokens_per_s_per_gpu": summary["output_tokens_per_s_per_gpu"]},
              "ops": rep.head(top).to_dict(orient="records"),
              "by_kind": rp.by_kind(rep).to_dict(orient="records"), "notes": list(est.notes)}
    if as_json:
        echo_json(result)
        return
    _print(result, top)


def _print(result: dict, top: int) -> None:
    width = columns.terminal_width()

    w, t = result["workload"], result["totals"]
    head = (f"{w['model']} {w['quant']} (KV {w['kv_dtype']}) TP{w['tp']} EP{w['ep']} on {w['hardware']}: "
            f"{w['num_requests']} requests of {w['isl']:,} in / {w['osl']:,} out at concurrency {w['concurrency']}, "
            f"{t['engine_steps']:,} engine steps")
    typer.echo("\n".join(columns.wrap(head, width)))
    typer.echo("\n".join(columns.wrap(result["label"], width)))
    typer.echo(f"\ntop {min(top, len(result['ops']))} ops by share of the run's time")
    rows = [[r["op"], str(r["rank"]), format_value(r["calls_per_step"]), format_value(r["us_per_call"]),
             format_value(r["ms_per_1k_output_tokens"]), f"{r['share']:.1%}", r["bound"]] for r in result["ops"]]
    heads = ["op", "#", "calls/step", "µs/call", "ms/1k out", "share", "bound"]
    typer.echo("\n".join(columns.text_table(heads, rows, right=[0, 1, 1, 1, 1, 1, 0], width=width)))
    typer.echo("\nby kind of op")
    rows = [[r["kind"], format_value(r["ms_per_1k_output_tokens"]), f"{r['share']:.1%}"] for r in result["by_kind"]]
    typer.echo("\n".join(columns.text_table(["kind", "ms/1k out", "share"], rows, right=[0, 1, 1], width=width)))


def register(app: typer.Typer) -> None:
    app.command("repetition")(repetition)
