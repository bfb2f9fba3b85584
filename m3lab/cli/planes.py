"""``m3lab planes`` (checklist step 3): the bytes one engine step moves, per op, split into planes.

``m3lab planes --model minimax-m3 --hardware mi300x --tp 8 --quant mxfp8 --phase decode --batch 216
--context 8704 --json`` prints ``ops: [{op, kind, plane, part, calls, bytes, bytes_read, bytes_written, flops}]``
and ``totals`` (per plane, per GPU and over all GPUs), from the OpTable
(:func:`m3lab.analysis.byte_planes.op_planes`); the step's time by plane is projected for the hardware profile.

:func:`deployment_options` adds the deployment's options (model, hardware, tp, ep, quant, kv dtype) to a
command and hands it one :class:`~m3lab.spec.serving.Deployment`; ``m3lab repetition`` uses it too.
"""
from __future__ import annotations

import functools
import inspect
from typing import Optional

import typer

from m3lab.cli.shapes import MODEL_HELP
from m3lab.errors import M3LabError

PHASES = ("decode", "prefill")
MAX_BATCH = 1 << 20            # requests in one step: the step holds one entry per request
MAX_STEP_TOKENS = 2**31 - 1    # tokens in one step: vLLM's token indices are int32

_OPTIONS = {   # name -> (default, flag, help)
    "model": ("minimax-m3", "--model", MODEL_HELP),
    "hardware": ("mi355x", "--hardware", "Hardware profile (mi355x, mi300x, h200, ...) or a YAML profile."),
    "tp": (4, "--tp", "Tensor-parallel degree."),
    "ep": (1, "--ep", "Expert-parallel degree (1: TP-MoE)."),
    "quant": ("mxfp8", "--quant", "Weight quantisation: bf16, fp8, mxfp8, mxfp4."),
    "kv_dtype": (None, "--kv-dtype", "Main KV cache dtype: bf16 or fp8 (default: the quantisation's, bf16)."),
}
_TYPES = {"model": str, "hardware": str, "tp": int, "ep": int, "quant": str, "kv_dtype": Optional[str]}


def deployment_options(command):
    """Decorate a command taking ``deployment``: its CLI gets the options of :data:`_OPTIONS` instead, and
    the command is called with the Deployment they name (validated: a bad value is one line, exit 2)."""
    sig = inspect.signature(command)
    kept = [p for p in sig.parameters.values() if p.name != "deployment"]
    added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=_TYPES[name],
                               default=typer.Option(default, flag, help=text))
             for name, (default, flag, text) in _OPTIONS.items()]

    @functools.wraps(command)
    def wrapper(**kw):
        return command(deployment=build_deployment(**{k: kw.pop(k) for k in _OPTIONS}), **kw)

    wrapper.__signature__ = sig.replace(parameters=added + kept)
    wrapper.__annotations__ = {p.name: p.annotation for p in added + kept}
    return wrapper


def build_deployment(model: str, hardware: str, tp: int, ep: int, quant: str, kv_dtype: str | None):
    """A validated Deployment from the option values (vLLM's defaults for every serving switch)."""
    import dataclasses

    from m3lab.spec.serving import deployment

    dep = deployment(model, hardware, quant, tp=tp, ep=ep)
    return dataclasses.replace(dep, quant=dep.quant.with_cache(kv_dtype)) if kv_dtype else dep


def calibration_option(value: str | None):
    """``--calibration none`` (or null) means the roofline ceiling: None to the cost model."""
    return None if value is None or str(value).lower() in ("none", "null") else value


def engine_step(model, phase: str, batch: int, context: int, chunk: int | None):
    """The EngineStep of ``--phase/--batch/--context/--chunk``, each checked before any work."""
    from m3lab.workload.step import EngineStep

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


@deployment_options
def planes(
    deployment,
    phase: str = typer.Option("decode", "--phase", help="decode (one token per request) or prefill."),
    batch: int = typer.Option(32, "--batch", help="Requests in the step."),
    context: int = typer.Option(8704, "--context",
                                help="Tokens of context per request after the step (default: 8192 + 1024/2, "
                                     "the mean decode context of an 8K/1K request)."),
    chunk: Optional[int] = typer.Option(None, "--chunk",
                                        help="Prefill only: tokens each request computes in this step "
                                             "(default: the whole --context)."),
    calibration: Optional[str] = typer.Option("default", "--calibration",
                                              help="Time by plane: default (the hardware's shipped calibration), "
                                                   "none (roofline ceiling), or a CSV path."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Bytes per op of one engine step, split into compute tensors, persistent state and communication."""
    from m3lab.cli.output import echo_json

    step = engine_step(deployment.model, phase, batch, context, chunk)
    result = step_planes(deployment, step, phase, calibration_option(calibration))
    if as_json:
        echo_json(result)
        return
    _print(result)


def step_planes(deployment, step, phase: str, calibration) -> dict:
    """The JSON of ``m3lab planes``: deployment, step, ``ops`` (:func:`~m3lab.analysis.byte_planes.op_planes`),
    ``totals`` by plane (:func:`~m3lab.analysis.byte_planes.planes_totals`) and the step's projected time by
    plane (:func:`~m3lab.analysis.byte_planes.time_by_plane`)."""
    from m3lab.analysis import byte_planes as bp
    from m3lab.cost.model import cost_optable
    from m3lab.optable import build_optable

    d, gpus = deployment, deployment.plan.world
    table = build_optable(d.model, d.plan, d.quant, step)
    ops = bp.op_planes(table)
    totals = bp.planes_totals(ops, gpus=gpus).assign(bytes_per_request=lambda t: t["bytes"] / step.num_reqs)
    costed = cost_optable(table, d.hardware, calibration)
    return {
        "deployment": {"model": d.model.name, "hardware": d.hardware.name, "tp": d.plan.tp, "ep": d.plan.ep,
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
    from m3lab.cli import columns
    from m3lab.nb import format_bytes, format_number

    d, s = result["deployment"], result["step"]
    typer.echo(columns.wrap(f"{d['model']} {d['quant']} (KV {d['kv_dtype']}) TP{d['tp']} EP{d['ep']} on "
                            f"{d['hardware']}: one {s['phase']} step, {s['batch']:,} requests at context "
                            f"{s['context']:,} ({s['tokens']:,} tokens)"))
    typer.echo(columns.wrap(result["label"]))

    def size(v):
        return "-" if v is None or v != v else (format_bytes(v) or "0 B")
    for plane in ("compute", "persistent", "communication"):
        rows = [r for r in result["ops"] if r["plane"] == plane]
        if not rows:
            continue
        typer.echo(f"\n{plane}")
        if plane == "communication":
            table = [[r["op"], str(r["calls"]), size(r["bytes"])] for r in rows]
            lines = columns.render(["op", "calls", "on the wire"], table, right=[0, 1, 1])
        else:
            table = [[r["op"], r["part"], str(r["calls"]), size(r["bytes_read"]), size(r["bytes_written"])]
                     + ([format_number(r["flops"] / 1e9)] if plane == "compute" else []) for r in rows]
            heads = ["op", "part", "calls", "read", "written"] + (["GFLOP"] if plane == "compute" else [])
            lines = columns.render(heads, table, right=[0, 0, 1, 1, 1, 1])
        typer.echo("\n".join(lines))
    typer.echo(f"\ntotals per GPU ({d['gpus']} GPUs alike)")
    tot = [[p, size(t["bytes"]), size(t["bytes_read"]), size(t["bytes_written"]), size(t["bytes_all_gpus"])]
           for p, t in result["totals"].items()]
    typer.echo("\n".join(columns.render(["plane", "bytes", "read", "written", "all GPUs"], tot,
                                        right=[0, 1, 1, 1, 1])))
    typer.echo("\nstep time by plane, projected (µs)")
    typer.echo("\n".join(columns.render(["plane", "µs"], [[p, f"{us:,.1f}"] for p, us in
                                                         result["time_by_plane_us"].items()], right=[0, 1])))
    typer.echo(columns.wrap(result["time_label"]))


def register(app: typer.Typer) -> None:
    app.command("planes")(planes)
