"""``m3lab pd-plan`` (the KV hand-off geometry of one request) and the printer of ``m3lab estimate --pd P:D``.

    m3lab pd-plan --model minimax-m3 --prefill-tp 4 --decode-tp 8 --isl 8192 [--kv-dtype fp8]
        [--index-dtype bf16] [--prefill-layout triton --decode-layout aiter] [--scales per_token_head]
        [--tables scattered|contiguous] [--kv-link-gbps 50] [--json]
    m3lab estimate --model minimax-m3 --hardware mi355x --tp 4 --quant mxfp8 --isl 8192 --osl 1024 \\
        --concurrency 512 --pd 2:1 [--kv-link-gbps 50] [--json]
"""
from __future__ import annotations

import typer

from m3lab.cli.columns import terminal_width
from m3lab.cli.output import accuracy_lines, echo_json
from m3lab.errors import M3LabError
from m3lab.spec.model import load_model
from m3lab.spec.roles import KV_LINK_GBPS
from m3lab.spec.traffic import check_context


def pd_plan_cmd(
        model: str = typer.Option(..., "--model", help="model name (minimax-m3, minimax-m3-mini) or config.json"),
        prefill_tp: int = typer.Option(..., "--prefill-tp", help="TP of a prefill instance"),
        decode_tp: int = typer.Option(..., "--decode-tp", help="TP of a decode instance"),
        isl: int = typer.Option(..., "--isl", help="input tokens of the request"),
        kv_dtype: str = typer.Option("bf16", "--kv-dtype", help="main KV cache dtype: bf16 or fp8"),
        index_dtype: str = typer.Option("bf16", "--index-dtype", help="index-key cache dtype: bf16 or fp8"),
        prefill_layout: str = typer.Option("triton", "--prefill-layout", help="KV layout: triton or aiter"),
        decode_layout: str = typer.Option("triton", "--decode-layout", help="KV layout: triton or aiter"),
        scales: str = typer.Option("none", "--scales", help="fp8 KV scales: scalar or per_token_head"),
        tables: str = typer.Option("scattered", "--tables",
                                   help="block tables: scattered (steady state) or contiguous (fresh)"),
        kv_link_gbps: float = typer.Option(KV_LINK_GBPS, "--kv-link-gbps", metavar="GB/S",
                                           help="KV link GB/s per GPU (each rank its own link)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Transfer descriptors per layer, bytes per request and transfer time of a prefill -> decode KV hand-off."""
    from m3lab.pd.geometry import pd_plan  # local: pulls in pandas, torch

    if kv_link_gbps <= 0:
        raise M3LabError(f"--kv-link-gbps {kv_link_gbps} must be positive (GB/s per GPU)", field="kv_link_gbps")
    check_context(load_model(model), isl)
    summary, table = pd_plan(model, prefill_tp, decode_tp, isl, kv_dtype=kv_dtype, index_dtype=index_dtype,
                             prefill_layout=prefill_layout, decode_layout=decode_layout, scales=scales,
                             tables=tables, bandwidth=kv_link_gbps * 1e9)
    summary = {**summary, "kv_link_gbps": kv_link_gbps}
    summary.pop("bandwidth_bytes_per_s", None)
    if as_json:
        echo_json({**summary, "layers": table.to_dict(orient="records")})
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{summary['model']}: prefill TP{prefill_tp} ({prefill_layout}) -> decode TP{decode_tp} "
                    f"({decode_layout}), {isl} tokens, KV {summary['kv_dtype']}, index {summary['index_dtype']}, "
                    f"{tables} block tables")
    for col in ("layers", "attention", "region", "descriptors / layer", "bytes / layer"):
        t.add_column(col, justify="right")
    for (attn, region, n, b), grp in table.groupby(["attn", "region", "descriptors", "bytes"], sort=False):
        layers = grp["layer"].tolist()
        span = f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])
        t.add_row(f"{span} ({len(layers)})", attn, region, f"{n:,}", f"{b:,}")
    console = Console()
    console.print(t)
    console.print(f"bytes_per_request {summary['bytes_per_request']:,} ({summary['bytes_per_token']:,.0f} B/token); "
                  f"descriptors_per_request {summary['descriptors_per_request']:,} "
                  f"(mean {summary['mean_descriptor_bytes']:,.0f} B)")
    console.print(f"busiest prefill rank sends {summary['max_bytes_sent_per_prefill_rank']:,} B, busiest decode rank "
                  f"receives {summary['max_bytes_received_per_decode_rank']:,} B: transfer "
                  f"{summary['transfer_s'] * 1e3:.2f} ms at {kv_link_gbps:g} GB/s per GPU ({summary['label']})")
    if summary["warning"]:
        typer.secho(f"warning: {summary['warning']}", err=True, fg="yellow")


def print_pd_estimate(s: dict, as_json: bool) -> None:
    """Print the summary of :func:`m3lab.serving.disagg.pd_estimate` (``m3lab estimate --pd``)."""
    if as_json:
        echo_json(s)
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{s['model']} {s['quant']} P:D = {s['pd']} (prefill TP{s['prefill_tp']}, decode "
                    f"TP{s['decode_tp']}, {s['gpus']} GPUs) on {s['hardware']}: {s['isl']} in / {s['osl']} out, "
                    f"concurrency {s['concurrency']}")
    t.add_column("figure", justify="left")
    t.add_column(s["kind"], justify="right")
    if s["kind"] != "ceiling":
        t.add_column("ceiling", justify="right")
    for key, fmt in (("total_tokens_per_s_per_gpu", ".1f"), ("output_tokens_per_s_per_gpu", ".1f"),
                     ("ttft_s", ".3f"), ("queueing_s", ".3f"), ("prefill_s", ".3f"), ("handoff_s", ".4f"),
                     ("first_decode_s", ".3f"), ("tpot_ms", ".2f"), ("prefill_utilisation", ".2f"),
                     ("mean_decode_batch", ".1f")):
        row = [key, format(s[key], fmt)] + ([format(s["ceiling"][key], fmt)] if s["kind"] != "ceiling" else [])
        t.add_row(*row)
    console = Console()
    console.print(t)
    for note in s.get("notes", ()):
        console.print(f"note: {note}", style="yellow")
    console.print(f"KV hand-off {s['kv_handoff_bytes_per_request'] / 1e9:.2f} GB/request in "
                  f"{s['kv_handoff_descriptors_per_request']:,} descriptors: {s['kv_handoff_ms']:.2f} ms at "
                  f"{s['kv_link_gbps']:g} GB/s per GPU; decode instances hold at most "
                  f"{s['max_num_seqs_per_decode_instance']} requests each")
    console.print(s["label"])   # cost_label names its kind: "estimate: calibrated on ..." or "ceiling: ..."
    if "accuracy" in s:
        typer.echo("\n".join(accuracy_lines(s["accuracy"], terminal_width())))


def register(app: typer.Typer) -> None:
    app.command("pd-plan")(pd_plan_cmd)
