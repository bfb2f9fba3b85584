"""``m3lab bench OP``: one benchmark runner per op, each appending long-format rows (m3lab/bench/table.py).

    m3lab bench gemm [--ms 1,8,32] [--formats bf16,mxfp8,mxfp4,fp8] [--out DIR]       GEMM vs cuBLAS (GPU)
    m3lab bench moe [--ts 1,8,...] [--routings balanced,zipf] [--providers ...] [--out DIR]   grouped MoE (GPU)
    m3lab bench sparse [--batches 1,32,128] [--contexts 8192,65536] [--q-rows 1,4] [--out DIR]   sparse attn + indexer (GPU)
    m3lab bench collectives [--world 2] [--tokens ...] [--blocks ...] [--out CSV]      NCCL all-reduce, KV transfer (GPUs)
    m3lab bench cache [--requests 1000] [--repeats 3] [--no-vllm] [--no-append]        prefix cache vs vLLM's (CPU)
    m3lab bench probe [--rounds 4] [--out DIR]                                          launch choices vs vLLM (GPU)
    m3lab bench shapes [--isl 8192 --concurrency 128 --limit 2.0]                      shape histograms' speed (CPU)
    m3lab bench estimate [--only fixed,agentic] [--vllm] [--json]                      serving estimates' speed (CPU)
    m3lab bench targets [--path CSV]                                                     peers' targets, recorded rows (CPU)

Every option is checked before any work starts (bad input: one line naming the option, exit 2). The GPU sessions
that also gate and tune are ``python -m m3lab.sessions.<gemm|moe|sparse|peers>``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from m3lab.errors import M3LabError
from m3lab.spec.hardware import load_hardware

bench_app = typer.Typer(help="Benchmark one op's kernels against their peers (rows appended to a long table).",
                        no_args_is_help=True)


def int_list(text: str, field: str) -> tuple[int, ...]:
    """``"1,8,32"`` -> (1, 8, 32); anything but positive integers is an M3LabError naming ``field``."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise M3LabError(f"{field}: {text!r} is not a comma-separated list of integers", field=field,
                         hint="e.g. 1,8,32") from None
    if any(v <= 0 for v in values):
        raise M3LabError(f"{field}: {text!r} holds a value <= 0", field=field, hint="every value must be positive")
    return values


def one_of(text: str, allowed, field: str) -> tuple[str, ...]:
    """``"a,b"`` -> ("a", "b"), each in ``allowed``; else an M3LabError naming ``field`` and the choices."""
    values = tuple(text.split(","))
    bad = [v for v in values if v not in allowed]
    if bad:
        raise M3LabError(f"{field}: {', '.join(bad)} not in {', '.join(allowed)}", field=field)
    return values


def need_gpus(n: int = 1, what: str = "this benchmark") -> None:
    """Raise M3LabError unless torch sees ``n`` GPUs (timings on the CPU interpreter mean nothing)."""
    import torch  # heavy: only once the options are checked
    if torch.cuda.device_count() < n:
        need = "a GPU" if n == 1 else f"{n} GPUs"
        raise M3LabError(f"device: {what} needs {need}, torch sees {torch.cuda.device_count()}", field="device",
                         hint="run it on a GPU host")


@bench_app.command("gemm")
def gemm_cmd(ms: str = typer.Option("1,8,16,32,64,128,256,512,1024,2048,4096,8192", help="token counts M"),
             formats: str = typer.Option("bf16,mxfp8,mxfp4,fp8", help="weight formats"),
             out: str = typer.Option("out", help="folder: rows appended to OUT/gemm.csv"),
             measure: bool = typer.Option(True, help="measure the copy and matmul ceilings first")) -> None:
    """Our GEMM launcher vs cuBLAS (and vLLM's MXFP8 linear) at the model's dense GEMM shapes."""
    from m3lab.bench.gemm import W_FORMATS  # local: pulls in pandas, torch, triton
    ms_, fmts = int_list(ms, "ms"), one_of(formats, W_FORMATS, "formats")
    need_gpus(1, "bench gemm")
    from m3lab.bench import gemm  # local: pulls in pandas, torch, triton
    gemm.run(out, ms_, fmts, measure=measure)


@bench_app.command("moe")
def moe_cmd(ts: str = typer.Option("1,8,32,128,512,2048,8192", help="token counts T"),
            routings: str = typer.Option("balanced,zipf", help="routings: balanced, zipf"),
            providers: Optional[str] = typer.Option(None, help="providers (default: every one)"),
            deadline_s: float = typer.Option(520.0, help="skip the points not started by then (seconds)"),
            out: str = typer.Option("out", help="folder: rows appended to OUT/moe.csv")) -> None:
    """Our grouped MoE vs vLLM's MoE kernels, torch._grouped_mm and a per-expert loop (one TP4 rank of M3)."""
    from m3lab.bench import moe  # local: pulls in pandas, torch, triton
    ts_, routes = int_list(ts, "ts"), one_of(routings, moe.ROUTINGS, "routings")
    provs = one_of(providers, tuple(moe.PROVIDERS), "providers") if providers else tuple(moe.PROVIDERS)
    need_gpus(1, "bench moe")
    moe.run(out, provs, ts_, routes, deadline_s=deadline_s)


@bench_app.command("sparse")
def sparse_cmd(batches: str = typer.Option("1,32,128", help="requests B"),
               contexts: str = typer.Option("8192,65536", help="context lengths (multiples of the KV block)"),
               q_rows: str = typer.Option("1,4", help="query rows per request (1 = decode)"),
               prefill: bool = typer.Option(True, help="also the prefill chunks"),
               deadline_s: float = typer.Option(400.0, help="skip the points not started by then (seconds)"),
               out: str = typer.Option("out", help="folder: rows appended to OUT/sparse_attn.csv")) -> None:
    """Sparse attention and the indexer: ours vs vLLM's Triton kernels, dense SDPA and gather-then-attend."""
    from m3lab.bench import sparse_attn as sa  # local: pulls in pandas, torch, triton
    b, c, q = int_list(batches, "batches"), int_list(contexts, "contexts"), int_list(q_rows, "q-rows")
    if any(v % sa.BLOCK for v in c):
        raise M3LabError(f"contexts: {contexts!r} holds a length that is not a multiple of {sa.BLOCK}",
                         field="contexts")
    need_gpus(1, "bench sparse")
    sa.run(out, b, c, q, deadline_s=deadline_s, prefill=prefill)


@bench_app.command("collectives")
def collectives_cmd(world: int = typer.Option(2, help="ranks, one per GPU"),
                    tokens: str = typer.Option(",".join(str(2 ** i) for i in range(14)), help="all-reduce rows T"),
                    blocks: str = typer.Option("1,4,16,64,256,1024", help="KV blocks per transfer"),
                    hardware: str = typer.Option("h200", help="profile whose link bandwidth is the ceiling"),
                    out: str = typer.Option("traces/bench/collectives.csv", help="CSV the rows are appended to")) -> None:
    """NCCL all-reduce of [T, hidden] bf16 and point-to-point KV block transfers between the host's GPUs."""
    t, bl = int_list(tokens, "tokens"), int_list(blocks, "blocks")
    if world < 2:
        raise M3LabError(f"world: {world} ranks; a collective needs at least 2", field="world")
    load_hardware(hardware)
    need_gpus(world, "bench collectives")
    from m3lab.bench import collectives  # local: pulls in pandas, torch
    typer.echo(f"appended to {collectives.run(out, world, t, bl, hardware=hardware)}")


@bench_app.command("cache")
def cache_cmd(requests: int = typer.Option(1000, help="trace prefix used (Mooncake requests)"),
              repeats: int = typer.Option(3, help="each figure is the best of this many runs"),
              vllm: bool = typer.Option(True, help="also time vLLM's own classes"),
              append: bool = typer.Option(True, help="append the rows to traces/bench/cache_sim.csv")) -> None:
    """The prefix-cache simulator's speed next to vLLM's own classes, on the same trace (CPU)."""
    for field, value in (("requests", requests), ("repeats", repeats)):
        if value <= 0:
            raise M3LabError(f"{field}: {value} must be positive", field=field)
    from m3lab.cache import bench as cb  # local: pulls in pandas
    rows = cb.run(requests, repeats, vllm)
    typer.echo(f"{'measurement':58s} {'engine':6s} {'blocks':>9s} {'seconds':>8s} {'rate':>12s}  unit  (x vLLM)")
    for r in rows:
        sp = f"  x{r['speedup_vs_vllm']:.1f}" if r["speedup_vs_vllm"] != "" else ""
        typer.echo(f"{r['measurement']:58s} {r['engine']:6s} {r['blocks']:9d} {r['seconds']:8.3f} "
                   f"{r['rate']:12,.0f}  {r['unit']}{sp}")
    typer.echo(f"{rows[0]['device']}, commit {rows[0]['commit']}, {rows[0]['date']}")
    if append:
        typer.echo(f"appended to {cb.append(rows)}")


@bench_app.command("probe")
def probe_cmd(out: str = typer.Option("out", help="folder: OUT/probe.csv, rewritten after each round"),
              rounds: int = typer.Option(4, help="interleaved rounds (each point timed once per round)"),
              until_s: float = typer.Option(400.0, help="stop starting new points after this many seconds"),
              mx: bool = typer.Option(True, help="also compare the two MX decodes on the MoE weight-tile path")) -> None:
    """Sparse-attention and indexer launch configurations against vLLM's kernels, and the MX decodes (GPU)."""
    if rounds <= 0 or until_s <= 0:
        field = "rounds" if rounds <= 0 else "until_s"
        raise M3LabError(f"{field}: must be positive", field=field)
    need_gpus(1, "bench probe")
    from m3lab.bench import kernel_probe  # local: pulls in pandas, torch, triton
    kernel_probe.main(out, rounds, until_s, mx)


@bench_app.command("shapes")
def shapes_cmd(model: str = typer.Option("minimax-m3", help="model name"), tp: int = typer.Option(4, help="TP"),
               isl: int = typer.Option(8192, help="input tokens"), osl: int = typer.Option(1024, help="output tokens"),
               concurrency: int = typer.Option(128, help="requests in flight"),
               repeats: int = typer.Option(3, help="repetitions (each schedules from scratch)"),
               limit: float = typer.Option(2.0, help="exit 1 if the first run takes longer (seconds)")) -> None:
    """Seconds to build a workload's shape histograms, schedule included (CPU); one JSON object."""
    for field, value in (("tp", tp), ("isl", isl), ("osl", osl), ("concurrency", concurrency), ("repeats", repeats),
                         ("limit", limit)):
        if value <= 0:
            raise M3LabError(f"{field}: {value} must be positive", field=field)
    from m3lab.bench.shapes_speed import measure  # local: pulls in the OpTable builder and numpy (~0.25 s)
    result = measure(model, tp, isl, osl, concurrency, repeats)
    result.update(limit_s=limit, ok=result["first_s"] < limit)
    typer.echo(json.dumps(result))
    if not result["ok"]:
        raise typer.Exit(1)


@bench_app.command("estimate")
def estimate_cmd(only: str = typer.Option("fixed,agentic", help="which estimates: fixed (8K/1K c=128), agentic (c=28)"),
                 vllm: bool = typer.Option(False, "--vllm", help="also run the 8K/1K c=128 schedule through vLLM's "
                                                                 "own Scheduler (slower; needs vLLM)"),
                 as_json: bool = typer.Option(False, "--json", help="the rows as JSON after the lines")) -> None:
    """Seconds each serving estimate takes on this machine (CPU), against its target; exit 1 if one misses it."""
    from m3lab.bench.estimate_speed import CASES, measure  # local: pulls in pandas and the cost model
    cases = one_of(only, CASES, "only")
    rows = measure(cases, vllm=vllm, echo=typer.echo)
    if as_json:
        typer.echo(json.dumps(rows))
    if any(r["met"] is False for r in rows):
        raise typer.Exit(1)


@bench_app.command("targets")
def targets_cmd(path: Optional[str] = typer.Option(None, help="peers table (default traces/bench/peers.csv)")) -> None:
    """The kernels' targets against their peers at their best, from the newest commit's rows of the peers run."""
    if path and not Path(path).is_file():
        raise M3LabError(f"path: {path} is not a file", field="path", hint="give a peers CSV")
    from m3lab.bench_analysis.peers import print_targets  # local: pulls in pandas, torch
    print_targets(path or "")


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
