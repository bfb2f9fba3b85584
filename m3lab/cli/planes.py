"""``m3lab planes`` (checklist step 3): the bytes one engine step moves, per op, split into planes.

``m3lab planes --model minimax-m3 --hardware mi300x --tp 8 --quant mxfp8 --phase decode --batch 216
--context 8704 --json`` prints ``ops: [{op, kind, plane, part, calls, bytes, bytes_read, bytes_written, flops}]``
and ``totals`` (per plane, per GPU and over all GPUs), from the OpTable of the kernels vLLM runs for the
deployment (:func:`m3lab.serving.step_cost.cost_step`, grouped by
:func:`m3lab.analysis.byte_planes.op_planes`); the step's time by plane is projected for the hardware profile.
The deployment options are the shared ones (:mod:`m3lab.cli.deploy_options`: ``--preset``, ``--set``,
``--model``, ``--hardware``, ``--tp``, ...); ``--batch`` and ``--context`` default to the deployment's workload
(its concurrency; its mean decode context, isl + osl / 2).
"""
from __future__ import annotations

from typing import Optional

import typer

from m3lab.cli import columns, deploy_options as opt
from m3lab.cli.output import echo_json
from m3lab.errors import M3LabError
from m3lab.nb import format_bytes, format_number
from m3lab.workload.step import EngineStep

PHASES = ("decode", "prefill")
MAX_BATCH = 1 << 20            # requests in one step: the step holds one entry per request
MAX_STEP_TOKENS = 2**31 - 1    # tokens in one step: vLLM's token indices are int32


def calibration_option(value: str | None):
    """``--calibration none`` (or null) means the roofline ceiling: None to the cost model."""
    return None if value is None or str(value).lower() in ("none", "null") else value


def engine_step(model, phase: str, batch: int, context: int, chunk: int | None):
    """The EngineStep of ``--phase/--batch/--context/--chunk``, each checked before any work."""
    if phase not in PHASES:
        raise M3LabError(f"--phase {phase!r} is not one of {', '.join(PHASES)}", field="phase")
    if not 1 <= batch <= MAX_BATCH:
        raise M3LabError(f"--batch {batch} must be between 1 and {MAX_BATCH:,} requests", field="batch")
    limit = model.max_position or None
    if context < 1 or (limit and context > limit):
        raise M3LabError(f"--context {context} must be between 1 and {model.name}'s context length "
                         f"({limit:,} tokens)" if limit else f"--context {context} must be a positive token count",
                         field="context")
    if phase == "decode":
        if chunk is not None:
            raise M3LabError("--chunk is for --phase prefill (a decode step computes one token per request)",
                             field="chunk", hint="drop --chunk, or add --phase prefill")
        return EngineStep.decode(batch, context)
    chunk = context if chunk is None else chunk
    if not 1 <= chunk <= context:
        raise M3LabError(f"--chunk {chunk} must be between 1 and --context {context}", field="chunk")
    if batch * chunk > MAX_STEP_TOKENS:
        raise M3LabError(f"--batch x --chunk = {batch * chunk:,} tokens in one step is over vLLM's int32 limit "
                         f"({MAX_STEP_TOKENS:,})", field="batch")
    return EngineStep.prefill(chunk, batch=batch, past=context - chunk)


def planes(
    preset: opt.Preset = None, model: opt.Model = None, hardware: opt.HardwareName = None, tp: opt.Tp = None,
    ep: opt.Ep = None, quant: opt.Quant = None, kv_dtype: opt.KvDtype = None, index_dtype: opt.IndexDtype = None,
    set_: opt.Settings = [],
    phase: str = typer.Option("decode", "--phase", help="decode (one token per request) or prefill."),
    batch: Optional[int] = typer.Option(None, "--batch", help="Requests in the step (default: the deployment's "
                                                              "concurrency)."),
    context: Optional[int] = typer.Option(None, "--context",
                                          help="Tokens of context per request after the step (default: the "
                                               "deployment's isl + osl / 2, the mean decode context of a request)."),
    chunk: Optional[int] = typer.Option(None, "--chunk",
                                        help="Prefill only: tokens each request computes in this step "
                                             "(default: the whole --context)."),
    calibration: Optional[str] = typer.Option("default", "--calibration",
                                              help="Time by plane: default (the hardware's shipped calibration), "
                                                   "none (roofline ceiling), or a CSV path."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Bytes per op of one engine step, split into compute tensors, persistent state and communication."""
    d = opt.build(preset, set_, model=model, hardware=hardware, tp=tp, ep=ep, quant=quant, kv_dtype=kv_dtype,
                  index_dtype=index_dtype)
    wl = d.workload
    batch = wl.concurrency if batch is None else batch
    context = wl.isl + wl.osl // 2 if context is None else context
    step = engine_step(d.model, phase, batch, context, chunk)
    result = step_planes(d, step, phase, calibration_option(calibration))
    if as_json:
        echo_json(result)
        return
    _print(result)


def step_planes(deployment, step, phase: str, calibration) -> dict:
    """The JSON of ``m3lab planes``: deployment, step, ``ops`` (:func:`~m3lab.analysis.byte_planes.op_planes`),
    ``totals`` by plane (:func:`~m3lab.analysis.byte_planes.planes_totals`) and the step's projected time by
    plane (:func:`~m3lab.analysis.byte_planes.time_by_plane`)."""
    from m3lab.analysis import byte_planes as bp  # local: pulls in pandas
    from m3lab.serving.step_cost import cost_step  # local: pulls in pandas

    d, gpus = deployment, deployment.plan.world
    costed = cost_step(d, step, calibration=calibration)   # the OpTable of vLLM's kernels, costed
    ops = bp.op_planes(costed)
    totals = bp.planes_totals(ops, gpus=gpus).assign(bytes_per_request=lambda t: t["bytes"] / step.num_reqs)
    return {
        "deployment": {"name": d.name, "model": d.model.name, "hardware": d.hardware.name, "tp": d.plan.tp, "ep": d.plan.ep,
                       "gpus": gpus, "quant": d.quant.name, "kv_dtype": d.quant.kv_dtype,
                       "index_dtype": d.quant.index_dtype},
        "step": {"phase": phase, "batch": int(step.num_reqs), "context": int(step.context_lens.max()),
                 "tokens": int(step.num_tokens)},
        "label": "analytic (OpTable): bytes and FLOPs of one GPU; communication = on-the-wire bytes per GPU",
        "ops": ops.to_dict(orient="records"),
        "totals": {r.pop("plane"): r for r in totals.to_dict(orient="records")},
        "time_by_plane_us": bp.time_by_plane(costed).set_index("plane")["us"].to_dict(),
        "time_label": str(costed["cost_label"].iloc[0]),
    }


def _print(result: dict) -> None:
    width = columns.terminal_width()

    d, s = result["deployment"], result["step"]
    head = (f"{d['model']} {d['quant']} (KV {d['kv_dtype']}) TP{d['tp']} EP{d['ep']} on {d['hardware']}: one "
            f"{s['phase']} step, {s['batch']:,} requests at context {s['context']:,} ({s['tokens']:,} tokens)")
    typer.echo("\n".join(columns.wrap(head, width)))
    typer.echo("\n".join(columns.wrap(result["label"], width)))

    def size(v):
        return "-" if v is None or v != v else (format_bytes(v) or "0 B")
    for plane in ("compute", "persistent", "communication"):
        rows = [r for r in result["ops"] if r["plane"] == plane]
        if not rows:
            continue
        typer.echo(f"\n{plane}")
        if plane == "communication":
            table = [[r["op"], str(r["calls"]), size(r["bytes"])] for r in rows]
            lines = columns.text_table(["op", "calls", "on the wire"], table, right=[0, 1, 1], width=width)
        else:
            table = [[r["op"], r["part"], str(r["calls"]), size(r["bytes_read"]), size(r["bytes_written"])]
                     + ([format_number(r["flops"] / 1e9)] if plane == "compute" else []) for r in rows]
            heads = ["op", "part", "calls", "read", "written"] + (["GFLOP"] if plane == "compute" else [])
            lines = columns.text_table(heads, table, right=[0, 0, 1, 1, 1, 1], width=width)
        typer.echo("\n".join(lines))
    typer.echo(f"\ntotals per GPU ({d['gpus']} GPUs alike)")
    tot = [[p, size(t["bytes"]), size(t["bytes_read"]), size(t["bytes_written"]), size(t["bytes_all_gpus"])]
           for p, t in result["totals"].items()]
    typer.echo("\n".join(columns.text_table(["plane", "bytes", "read", "written", "all GPUs"], tot,
                                            right=[0, 1, 1, 1, 1], width=width)))
    typer.echo("\nstep time by plane, projected (µs)")
    by_plane = [[p, f"{us:,.1f}"] for p, us in result["time_by_plane_us"].items()]
    typer.echo("\n".join(columns.text_table(["plane", "µs"], by_plane, right=[0, 1], width=width)))
    typer.echo("\n".join(columns.wrap(result["time_label"], width)))


def register(app: typer.Typer) -> None:
    app.command("planes")(planes)
