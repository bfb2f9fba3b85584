"""``m3lab estimate`` (serving ceiling and calibrated estimate) and ``m3lab kernel-time`` (one kernel).

    m3lab estimate --model minimax-m3 --hardware mi355x --tp 4 --quant mxfp8 --isl 8192 --osl 1024 \\
        --concurrency 32 [--ep N] [--kv-dtype fp8] [--calibration TABLE] [--spec-tokens K --accept-len A] [--json]
    m3lab kernel-time --hardware mi355x --op gemm --m 32 --n 2560 --k 6144 --quant mxfp8 [--json]
    m3lab kernel-time --hardware mi355x --op grouped_gemm --tokens 32 --hidden 6144 --inter 768 \\
        --experts 129 --topk 5 --quant mxfp8 [--routing balanced] [--json]
"""
from __future__ import annotations

from typing import Optional

import typer

from m3lab.cli.output import echo_json
from m3lab.errors import M3LabError
from m3lab.pipeline.validate import is_null
from m3lab.workload.scheduler import REQUESTS_PER_SLOT


def estimate_cmd(
        model: str = typer.Option(..., "--model", help="model name (minimax-m3, ...) or config.json path"),
        hardware: str = typer.Option(..., "--hardware", help="hardware profile (mi355x, h200, ...) or YAML path"),
        tp: int = typer.Option(4, "--tp", help="tensor-parallel GPUs per replica (default 4, as for shapes)"),
        ep: int = typer.Option(1, "--ep", help="expert-parallel degree (1: TP-MoE)"),
        quant: str = typer.Option("bf16", "--quant", help="bf16, fp8, mxfp8 or mxfp4"),
        kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", help="KV cache dtype: bf16 or fp8 (default bf16)"),
        isl: int = typer.Option(..., "--isl", help="input tokens per request"),
        osl: int = typer.Option(..., "--osl", help="output tokens per request"),
        concurrency: int = typer.Option(..., "--concurrency", help="requests in flight (closed loop)"),
        calibration: Optional[str] = typer.Option(None, "--calibration",
                                                  help="shipped calibration name or measured CSV; default: the "
                                                       "hardware's shipped one (MI355X: AITER tables), 'none' for "
                                                       "the ceiling only"),
        spec_tokens: int = typer.Option(0, "--spec-tokens", help="speculative draft tokens per step (0: off)"),
        accept_len: Optional[float] = typer.Option(None, "--accept-len",
                                                   help="mean tokens accepted per step, bonus token included "
                                                        "(needed with --spec-tokens; e.g. 2.7 for EAGLE3, K=3)"),
        num_requests: Optional[int] = typer.Option(None, "--num-requests",
                                                   help=f"requests simulated (default {REQUESTS_PER_SLOT} x concurrency)"),
        gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", help="vLLM's setting"),
        pd: Optional[str] = typer.Option(None, "--pd", help="P:D disaggregated: P prefill and D decode instances "
                                                          "of --tp GPUs joined by the KV hand-off"),
        kv_link_gbps: float = typer.Option(50.0, "--kv-link-gbps", help="with --pd: KV link GB/s per GPU"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Serving estimate: TTFT, TPOT, tokens/s/GPU (calibrated where a calibration exists, else the ceiling)."""
    import warnings

    cal = "default" if calibration is None else (None if is_null(calibration) else calibration)
    if pd is not None:
        from m3lab.cli.pd import print_pd_estimate
        from m3lab.serving.disagg import parse_ratio, pd_estimate
        p, d = parse_ratio(pd)
        print_pd_estimate(pd_estimate(model, hardware, prefill=p, decode=d, tp=tp, ep=ep, quant=quant, isl=isl, osl=osl,
                                      concurrency=concurrency, num_requests=num_requests, calibration=cal,
                                      kv_link_bw=kv_link_gbps * 1e9, spec_tokens=spec_tokens, accept_len=accept_len,
                                      gpu_memory_utilization=gpu_memory_utilization), as_json)
        return
    from m3lab.serving.estimate import ShortRunWarning, estimate

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ShortRunWarning)
        est = estimate(model, hardware, tp=tp, ep=ep, quant=quant, kv_dtype=kv_dtype, isl=isl, osl=osl,
                       concurrency=concurrency, num_requests=num_requests, calibration=cal, spec_tokens=spec_tokens,
                       accept_len=accept_len, gpu_memory_utilization=gpu_memory_utilization)
    for w in caught:
        if issubclass(w.category, ShortRunWarning):
            typer.secho(f"warning: {w.message}", err=True, fg="yellow")
    s = est.summary()
    if as_json:
        echo_json(s)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{s['model']} {s['quant']} (KV {s['kv_dtype']}) TP{s['tp']} EP{s['ep']} on {s['hardware']}: "
                        f"{isl} in / {osl} out, concurrency {concurrency}, {s['num_requests']} requests")
    calibrated = s["kind"] != "ceiling"
    table.add_column("figure", justify="left")
    for col in ([s["kind"], "ceiling"] if calibrated else ["ceiling"]):
        table.add_column(col, justify="right")
    for key, fmt in (("output_tokens_per_s_per_gpu", ".1f"), ("total_tokens_per_s_per_gpu", ".1f"),
                     ("ttft_s", ".3f"), ("tpot_ms", ".2f")):
        table.add_row(key, format(s[key], fmt), *([format(s["ceiling"][key], fmt)] if calibrated else []))
    console = Console()
    console.print(table)
    console.print(f"weights {s['weight_gb_per_gpu']:.1f} GB/GPU; KV capacity {s['kv_capacity_tokens']:,} tokens/GPU "
                  f"at gpu_memory_utilization {s['gpu_memory_utilization']}; largest concurrency that fits "
                  f"{s['max_concurrency']}")
    console.print(s["label"] if s["label"].startswith(f"{s['kind']}:") else f"{s['kind']}: {s['label']}")


def kernel_time_cmd(
        hardware: str = typer.Option(..., "--hardware", help="hardware profile (mi355x, h200, ...)"),
        op: str = typer.Option(..., "--op", help="gemm or grouped_gemm"),
        quant: str = typer.Option("bf16", "--quant", help="weight dtype: bf16, fp8, mxfp8, mxfp4"),
        m: Optional[int] = typer.Option(None, "--m", help="gemm: tokens (rows)"),
        n: Optional[int] = typer.Option(None, "--n", help="gemm: output columns"),
        k: Optional[int] = typer.Option(None, "--k", help="gemm: reduction size"),
        tokens: Optional[int] = typer.Option(None, "--tokens", help="grouped_gemm: tokens"),
        hidden: Optional[int] = typer.Option(None, "--hidden", help="grouped_gemm: model width"),
        inter: Optional[int] = typer.Option(None, "--inter", help="grouped_gemm: expert width per GPU"),
        experts: Optional[int] = typer.Option(None, "--experts", help="grouped_gemm: expert rows (incl. fused shared)"),
        topk: Optional[int] = typer.Option(None, "--topk", help="grouped_gemm: experts per token"),
        routing: str = typer.Option("balanced", "--routing", help="balanced or zipf:S"),
        calibration: Optional[str] = typer.Option(None, "--calibration", help="as for estimate; 'none' = ceiling"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Predicted microseconds of one GEMM or MoE grouped GEMM, and the bound that limits it."""
    from m3lab.cost.kernel_time import kernel_time

    cal = "default" if calibration is None else (None if is_null(calibration) else calibration)
    gemm_opts = dict(m=m, n=n, k=k)
    grouped_opts = dict(tokens=tokens, hidden=hidden, inter=inter, experts=experts, topk=topk)
    other = grouped_opts if op == "gemm" else gemm_opts if op == "grouped_gemm" else {}
    ignored = [f"--{name}" for name, value in other.items() if value is not None]
    if ignored:
        raise M3LabError(f"{', '.join(ignored)} do not apply to --op {op}", field=ignored[0].lstrip("-"),
                         hint="gemm takes --m --n --k; grouped_gemm takes --tokens --hidden --inter --experts --topk")
    shape = gemm_opts if op == "gemm" else dict(grouped_opts, routing=routing)
    res = kernel_time(hardware, op, quant=quant, calibration=cal, **shape)
    if as_json:
        echo_json(res.to_dict())
        return
    typer.echo(f"{res['us']:.2f} us ({res['kind']}; limited by {res['bound']}); ceiling {res['ceiling_us']:.2f} us")
    for p in res["parts"]:
        typer.echo(f"  {p['op']}: {p['us']:.2f} us, {p['bound']}-bound, efficiency {p['efficiency']:.2f}")
    typer.echo(res["label"])


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate_cmd)
    app.command("kernel-time")(kernel_time_cmd)
