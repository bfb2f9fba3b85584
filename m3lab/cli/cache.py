"""``m3lab cache-sim``: a request trace through a prefix cache with vLLM's semantics (or vLLM's own classes).

    m3lab cache-sim --trace mooncake.jsonl [--format mooncake|agentx|agentic] [--block-size 128]
        [--capacity-tokens N|inf] [--policy lru|lfu|radix] [--engine m3lab|vllm] [--concurrency 1]
        [--skip-invalid] [--json]

``--format agentic`` with ``--trace generate:N[:SEED]`` generates N AgentX-like sessions instead of reading
a file (:mod:`m3lab.cache.agentic`). Prints ``requests``, ``hit_rate_tokens`` (hit tokens / prompt tokens,
as vLLM counts them), ``hit_rate_blocks``, ``evicted_blocks`` and ``peak_kv_usage`` (null with an unlimited
cache), among others.
"""
from __future__ import annotations

import typer

from m3lab.cache.agentic import AgenticConfig, generate
from m3lab.cache.policies import POLICIES
from m3lab.cache.trace import FORMATS, read_trace
from m3lab.cli.columns import terminal_width
from m3lab.cli.output import accuracy_lines, echo_json, progress, progress_wanted
from m3lab.errors import M3LabError
from m3lab.serving.cache_capacity import check_sim_capacity


def _capacity(text: str, block_size: int) -> float | None:
    if text.lower() in ("inf", "infinite", "unlimited", "none"):
        return None
    try:
        v = int(float(text))
    except (ValueError, OverflowError):
        raise M3LabError(f"--capacity-tokens {text!r} is not a number", field="capacity_tokens",
                         hint="give tokens (e.g. 4000000 or 4e6) or inf") from None
    check_sim_capacity(v, block_size)
    return v


def _trace(trace: str, fmt: str, block_size: int, skip_invalid: bool, show_progress: bool = True):
    if fmt == "agentic" and trace.startswith("generate:"):
        parts = trace.split(":")
        try:
            sessions = int(parts[1])
            seed = int(parts[2]) if len(parts) > 2 else 0
        except (ValueError, IndexError):
            raise M3LabError(f"--trace {trace!r}: expected generate:SESSIONS[:SEED]", field="trace") from None
        AgenticConfig(sessions=sessions, seed=seed, block_size=block_size)   # bounds, before the long part
        with progress("generating sessions", unit="sessions", enabled=show_progress) as update:
            return generate(sessions=sessions, seed=seed, block_size=block_size, progress=update)
    return read_trace(trace, fmt, block_size, skip_invalid=skip_invalid)


def cache_sim_cmd(
        trace: str = typer.Option(..., "--trace", help="trace file (JSONL), or generate:N[:SEED] with --format agentic"),
        fmt: str = typer.Option("mooncake", "--format", help="mooncake, agentx or agentic"),
        block_size: int = typer.Option(128, "--block-size", help="KV block size in tokens (M3: 128)"),
        capacity_tokens: str = typer.Option("inf", "--capacity-tokens", help="KV capacity in tokens, or inf"),
        policy: str = typer.Option("lru", "--policy", help="eviction policy: lru (vLLM's), lfu, radix"),
        engine: str = typer.Option("m3lab", "--engine", help="m3lab (fast) or vllm (vLLM's own classes, slower)"),
        concurrency: int = typer.Option(1, "--concurrency", help="requests holding blocks at once"),
        skip_invalid: bool = typer.Option(False, "--skip-invalid", help="skip malformed lines (and count them)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Replay a request trace through a KV prefix cache; print hit rates, evictions and peak KV usage."""
    from m3lab.cache.replay import ENGINES, blocks_for_tokens, replay  # local: pulls in pandas

    if fmt not in FORMATS:
        raise M3LabError(f"unknown --format {fmt!r}", field="format", hint=f"choose one of {', '.join(FORMATS)}")
    if engine not in ENGINES:
        raise M3LabError(f"unknown --engine {engine!r}", field="engine", hint=f"choose one of {', '.join(ENGINES)}")
    if policy not in POLICIES:
        raise M3LabError(f"unknown --policy {policy!r}", field="policy", hint=f"choose one of {', '.join(POLICIES)}")
    if block_size < 1:
        raise M3LabError(f"--block-size {block_size} must be positive", field="block_size")
    num_blocks = blocks_for_tokens(_capacity(capacity_tokens, block_size), block_size)
    if engine == "vllm" and num_blocks is None:
        raise M3LabError("--engine vllm needs a finite --capacity-tokens", field="capacity_tokens",
                         hint="vLLM's block pool has a size; pass e.g. --capacity-tokens 4e6")
    tr = _trace(trace, fmt, block_size, skip_invalid, progress_wanted(as_json))
    res = replay(tr, engine, num_blocks=num_blocks, policy=policy, concurrency=concurrency, progress=not as_json)
    s = res.summary()
    if as_json:
        echo_json(s)
        return
    for key in ("requests", "hit_rate_tokens", "hit_rate_blocks", "evicted_blocks", "peak_kv_usage", "rejected"):
        v = s[key]
        text = f"{v:.4f}" if isinstance(v, float) else ("null (unlimited cache)" if v is None else str(v))
        typer.echo(f"{key:16s} {text}")
    if tr.skipped:
        typer.echo(f"skipped {tr.skipped} malformed line(s) of {tr.source}")
    cap = "unlimited" if s["capacity_tokens"] is None else f"{s['capacity_tokens']:,} tokens"
    typer.echo(f"{s['engine']} engine, {s['policy']} eviction, {s['block_size']}-token blocks, {cap}, "
               f"{s['seconds']:.2f} s")


def print_estimate(summary: dict, as_json: bool) -> None:
    """Print what ``m3lab estimate --workload agentx`` computed (:func:`m3lab.serving.cached.estimate_workload`):
    one JSON object, or the headline figures."""
    if as_json:
        echo_json(summary)
        return
    s = summary
    lines = [f"{s['model']} {s['quant']} TP{s['tp']} on {s['hardware']}: {s['sessions']} {s['workload']} sessions, "
             f"{s['requests']} requests, concurrency {s['concurrency']} ({s['kind']})"]
    for key in ("output_tokens_per_s_per_gpu", "ttft_p50_s", "ttft_p99_s", "tpot_p50_ms", "tpot_p99_ms",
                "prefix_cache_hit_rate", "kv_cache_usage", "kv_cache_usage_peak", "preemptions", "evicted_blocks"):
        v = s[key]
        lines.append(f"  {key:30s} {v:.4g}" if isinstance(v, float) else f"  {key:30s} {v}")
    if s.get("spec_tokens"):
        lines.append(f"  accept_len {s['accept_len']:g} ({s['accept_len_source']}); " + "; ".join(
            f"at {r['accept_len']:g}: TPOT p50 {r['tpot_p50_ms']:.1f} ms" for r in s.get("accept_len_sensitivity", ())))
    lines.extend(f"note: {n}" for n in s.get("notes", ()))
    lines.append(s["label"])
    if "accuracy" in s:
        lines += accuracy_lines(s["accuracy"], terminal_width())
    typer.echo("\n".join(lines))


def register(app: typer.Typer) -> None:
    app.command("cache-sim")(cache_sim_cmd)

