"""``m3lab estimate`` (serving ceiling and calibrated estimate) and ``m3lab kernel-time`` (one kernel).

    m3lab estimate [--preset NAME] [--model M --hardware H --tp N --quant Q --kv-dtype fp8] \\
        [--isl 8192 --osl 1024 --concurrency 32] [--set KEY=VALUE ...] [--calibration TABLE] [--json]
    m3lab estimate --preset eagle3-mxfp8-tp4 --accept-len 2.7 --set accept_dataset=MT-Bench
    m3lab estimate --pd 2:1 [--kv-link-gbps 50]          (P/D disaggregated)
    m3lab estimate --workload agentx --concurrency 28     (AgentX-like sessions, prefix caching)
    m3lab kernel-time --hardware mi355x --op gemm --m 32 --n 2560 --k 6144 --quant mxfp8 [--json]
    m3lab kernel-time --hardware mi355x --op grouped_gemm --tokens 32 --hidden 6144 --inter 768 \\
        --experts 129 --topk 5 --quant mxfp8 [--routing balanced] [--json]
"""
from __future__ import annotations

from typing import Optional

import typer

from m3lab.cli import deploy_options as opt
from m3lab.cli.cache import print_estimate
from m3lab.cli.columns import terminal_width, text_table, wrap
from m3lab.cli.output import accuracy_lines, echo_json, progress, progress_wanted
from m3lab.cli.pd import print_pd_estimate
from m3lab.errors import M3LabError
from m3lab.pipeline.validate import is_null


def _deployment(preset, set_, workload, pd, kv_link_gbps, spec_tokens, **flags):
    """The estimate's Deployment; refuses fixed-length options with the agentic workload."""
    if workload not in (None, "fixed"):
        given = [name for name, v in (("--isl", flags["isl"]), ("--osl", flags["osl"]), ("--pd", pd),
                                      ("--num-prompts", flags["num_prompts"]), ("--kv-link-gbps", kv_link_gbps))
                 if v is not None]
        if given:
            raise M3LabError(f"{', '.join(given)} do not apply to --workload {workload} (sessions set their own "
                             "lengths and it runs colocated)", field=given[0].lstrip("-"),
                             hint="drop them, or use --workload fixed")
    return opt.build(preset, set_, workload=workload, pd=pd, kv_link_gbps=kv_link_gbps, spec_tokens=spec_tokens,
                     **flags)


def estimate_cmd(  # long: typer declares every option in the signature
        preset: opt.Preset = None, model: opt.Model = None, hardware: opt.HardwareName = None, tp: opt.Tp = None,
        ep: opt.Ep = None, quant: opt.Quant = None, kv_dtype: opt.KvDtype = None,
        index_dtype: opt.IndexDtype = None, isl: opt.Isl = None, osl: opt.Osl = None,
        concurrency: opt.Concurrency = None, num_prompts: opt.NumPrompts = None, set_: opt.Settings = [],
        calibration: Optional[str] = typer.Option(None, "--calibration", metavar="NAME|CSV",
                                                  help="shipped calibration name or measured CSV; default: the "
                                                       "hardware's shipped one (MI355X: AITER tables), 'none' for "
                                                       "the ceiling only"),
        spec_tokens: Optional[int] = typer.Option(None, "--spec-tokens", metavar="K",
                                                  help="speculative draft tokens per step (EAGLE3 unless --set "
                                                       "spec_method=...)"),
        accept_len: Optional[float] = typer.Option(None, "--accept-len", metavar="A",
                                                   help="mean tokens accepted per step, bonus token included "
                                                        "(name its traffic with --set accept_dataset=MT-Bench)"),
        gpu_memory_utilization: Optional[float] = typer.Option(None, "--gpu-memory-utilization", metavar="F",
                                                               help="vLLM's setting (default 0.92)"),
        pd: Optional[str] = typer.Option(None, "--pd", metavar="P:D", help="P/D disaggregated: P prefill and D "
                                                                           "decode instances"),
        kv_link_gbps: Optional[float] = typer.Option(None, "--kv-link-gbps", metavar="GB/S",
                                                     help="with --pd: KV link GB/s per GPU (default 50, assumed)"),
        workload: Optional[str] = typer.Option(None, "--workload", metavar="KIND",
                                               help="fixed (--isl/--osl) or agentx (AgentX-like sessions, prefix "
                                                    "caching: m3lab.cache)"),
        breakdown: bool = typer.Option(False, "--breakdown",
                                       help="add the decode step's per-op kernels, bytes, FLOPs, µs and shares "
                                            "(JSON: decode_step_ops) at the run's mean batch and context"),
        engine: str = typer.Option("m3lab", "--engine", metavar="m3lab|vllm",
                                   help="who schedules the steps: m3lab's generator, or vLLM's own Scheduler (the "
                                        "reference: slower; says how much and whether both agree)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Serving estimate as vllm bench measures it: TTFT (with queueing), TPOT, ITL, tokens/s/GPU (calibrated where
    a calibration exists, else the ceiling)."""
    from m3lab.serving.estimate import estimate  # local: pulls in pandas

    if engine not in ("m3lab", "vllm"):
        raise M3LabError(f"--engine {engine!r} is unknown", field="engine", hint="use m3lab or vllm")
    cal = "default" if calibration is None else (None if is_null(calibration) else calibration)
    d = _deployment(preset, set_, workload, pd, kv_link_gbps, spec_tokens, model=model, hardware=hardware, tp=tp,
                    ep=ep, quant=quant, kv_dtype=kv_dtype, index_dtype=index_dtype, isl=isl, osl=osl,
                    concurrency=concurrency, num_prompts=num_prompts, accept_len=accept_len,
                    gpu_memory_utilization=gpu_memory_utilization)
    if engine != "m3lab" and (d.workload.kind != "fixed" or d.pd.enabled):
        raise M3LabError("--engine vllm runs the fixed-length colocated estimate's schedule", field="engine",
                         hint="drop --engine for --pd and --workload agentx (their engines run on a clock: m3lab's)")
    if breakdown and (d.workload.kind != "fixed" or d.pd.enabled):
        raise M3LabError("--breakdown applies to the colocated fixed-length estimate", field="breakdown",
                         hint="drop --pd / --workload, or --breakdown")
    _announce_vllm_start(d, as_json)
    if d.workload.kind != "fixed":
        from m3lab.serving.cached import estimate_workload  # local: pulls in pandas
        print_estimate(add_accuracy(estimate_workload(d, calibration=cal, progress=True), as_json), as_json)
        return
    if d.pd.enabled:
        from m3lab.serving.disagg import pd_estimate  # local: pulls in pandas, torch
        print_pd_estimate(add_accuracy(pd_estimate(d, calibration=cal, progress=True), as_json), as_json)
        return
    est = estimate(d, calibration=cal, engine=engine, progress=True)
    s = est.summary()
    table = _breakdown(d, est, cal, s) if breakdown else None
    sens = _sensitivity(est, s)
    add_accuracy(s, as_json)
    if as_json:
        echo_json(s)
        return
    _print_summary(s)
    if sens is not None:
        from m3lab.cost.sensitivity import format_sensitivity  # local: pulls in pandas
        typer.echo(format_sensitivity(sens))
    if table is not None:
        from m3lab.serving.breakdown import format_breakdown  # local: pulls in pandas
        p = s["decode_step_point"]
        typer.echo(format_breakdown(table, f"decode step at batch {p['batch']}, context {p['context']} "
                                           f"({s['kind']}): where the time goes"))


def _announce_vllm_start(d, as_json: bool) -> None:
    """One line on stderr before vLLM is started to decide the deployment's kernels (10-15 s, once per answer)."""
    from m3lab.serving.dispatch import cache_location, resolved_before  # local: pulls in the resolver's modules

    if progress_wanted(as_json) and not resolved_before(d):
        typer.echo(f"vLLM decides this deployment's kernels: starting it on the CPU (10-15 s; the answer is then "
                   f"cached under {cache_location()})", err=True)


def _sensitivity(est, summary: dict):
    """The calibrated estimate's sensitivity table, added to ``summary`` (none for a ceiling-only estimate)."""
    from m3lab.cost.sensitivity import sensitivity  # local: pulls in pandas

    if est.kind != "calibrated":
        return None
    table = sensitivity(est)
    summary["sensitivity"] = table.replace({float("nan"): None}).to_dict(orient="records")
    return table


def _breakdown(d, est, cal, summary: dict):
    """The decode-step breakdown at the run's mean batch and context, added to ``summary`` (JSON-ready)."""
    from m3lab.serving.breakdown import decode_step_breakdown, run_decode_point  # local: pulls in pandas

    batch, context = run_decode_point(est)
    table = decode_step_breakdown(d, batch=batch, context=context, calibration=cal)
    summary["decode_step_point"] = {"batch": batch, "context": context}
    summary["decode_step_ops"] = table.replace({float("nan"): None}).to_dict(orient="records")
    return table


def _print_summary(s: dict) -> None:
    """The estimate in the terminal's width: a left-aligned title, the figures, notes and labels wrapped between
    words, and the accuracy band of m3lab's estimates (:mod:`m3lab.serving.accuracy`) in one line."""
    width = terminal_width()
    n = s["num_requests"]
    title = (f"{s['deployment']}: {s['model']} {s['quant']} (KV {s['kv_dtype']}) TP{s['tp']} EP{s['ep']} on "
             f"{s['hardware']}: {s['isl']} in / {s['osl']} out, concurrency {s['concurrency']}, {n} "
             f"request{'' if n == 1 else 's'}")
    calibrated = s["kind"] != "ceiling"
    headers = ["figure", s["kind"], "ceiling"] if calibrated else ["figure", "ceiling"]
    rows = [[key, format(s[key], fmt), *([format(s["ceiling"][key], fmt)] if calibrated else [])]
            for key, fmt in (("output_tokens_per_s_per_gpu", ".1f"), ("total_tokens_per_s_per_gpu", ".1f"),
                             ("ttft_s", ".3f"), ("ttft_p90_s", ".3f"), ("ttft_p99_s", ".3f"),
                             ("queueing_s", ".3f"), ("prefill_s", ".3f"), ("tpot_ms", ".2f"), ("itl_ms", ".2f"))]
    lines = text_table(headers, rows, [False] + [True] * (len(headers) - 1), width, title=title)
    for note in s.get("notes", ()):
        lines += wrap(f"note: {note}", width, "", "  ")
    if s.get("host_time_sensitivity"):
        lines += wrap("host time (upper bounds, m3lab.cost.host_time) scaled: " + "; ".join(
            f"x{r['host_scale']:g}: TTFT {r['ttft_s']:.3f}\u00a0s, TPOT {r['tpot_ms']:.2f}\u00a0ms"
            for r in s["host_time_sensitivity"]), width, "", "  ")
    chk = s.get("engine_check")
    if chk:
        lines += wrap(f"vLLM's own Scheduler ran the schedule in {chk['vllm_s']:.1f} s against m3lab's "
                      f"{chk['m3lab_s']:.2f} s ({chk['vllm_over_m3lab']:.0f}x slower, after {chk['vllm_import_s']:.1f} s "
                      f"to import and build vLLM; wall time on this machine); same schedule: {chk['same_schedule']}",
                      width, "", "  ")
    lines += wrap(f"weights {s['weight_gb_per_gpu']:.1f} GB/GPU; KV capacity {s['kv_capacity_tokens']:,} tokens/GPU "
                  f"at gpu_memory_utilization {s['gpu_memory_utilization']}; largest concurrency that fits "
                  f"{s['max_concurrency']}", width, "", "  ")
    lines += wrap(s["label"], width, "", "  ")
    if "accuracy" in s:
        lines += accuracy_lines(s["accuracy"], width)
    typer.echo("\n".join(line.replace("\u00a0", " ") for line in lines))


def add_accuracy(summary: dict, as_json: bool = False) -> dict:
    """``summary`` with ``accuracy``: the band of m3lab's estimates against every run the repository ships."""
    from m3lab.serving.accuracy import shipped_band  # local: pulls in pandas

    with progress("accuracy band (once per m3lab version): estimating", unit="shipped runs",
                  enabled=progress_wanted(as_json)) as update:
        summary["accuracy"] = shipped_band(update)
    return summary


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
    from m3lab.cost.kernel_time import kernel_time  # local: pulls in pandas

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
