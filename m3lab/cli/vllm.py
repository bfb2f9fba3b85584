"""``m3lab vllm``: the commands that connect m3lab to a real vLLM deployment.

    m3lab vllm plan --preset mxfp8-tp4-optimised [--profile-dir DIR] [--check] [--json]
    m3lab vllm plan --preset pd-mxfp8-prefill-tp4:2 --preset pd-mxfp8-decode-tp4:1
    m3lab vllm plan --model minimax-m3-mxfp8 --quant mxfp8 --tp 4 --set aiter=1
    m3lab vllm collect runs/<run> --bench vllm-bench --profile DIR --preset mxfp8-tp4-optimised
    m3lab vllm moe-tables DIR [--against DIR] [--json]
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from m3lab.cli import deploy_options as opt
from m3lab.cli.columns import Column, render, terminal_width, wrap
from m3lab.cli.output import echo_json
from m3lab.errors import M3LabError
from m3lab.serving.collect import collect as do_collect
from m3lab.spec.serving import KV_CONNECTOR, PRESETS
from m3lab.vllm.serve_command import Launch, check_with_vllm, parse_preset_spec, plan_commands

vllm_app = typer.Typer(help="Plan a vLLM deployment's commands, collect its measurements, compare MoE tables.",
                       no_args_is_help=True)


def _deployments(presets: list[str], set_: list[str], **flags) -> list:
    """(Deployment, replicas) for each ``--preset NAME[:REPLICAS]`` (the default deployment when none), with the
    shared deployment flags and ``--set`` applied to each."""
    specs = [parse_preset_spec(text) for text in presets] or [(None, 1)]
    return [(opt.build(name, set_, **flags), n) for name, n in specs]


@vllm_app.command("plan")
def plan(preset: List[str] = typer.Option([], "--preset", metavar="NAME[:REPLICAS]",
                                          help="a named deployment (m3lab.spec.serving.PRESETS); repeat with "
                                               "REPLICAS for P/D, e.g. pd-mxfp8-prefill-tp4:2 pd-mxfp8-decode-tp4:1"),
         model: opt.Model = None, hardware: opt.HardwareName = None, tp: opt.Tp = None, ep: opt.Ep = None,
         quant: opt.Quant = None, kv_dtype: opt.KvDtype = None, index_dtype: opt.IndexDtype = None,
         isl: opt.Isl = None, osl: opt.Osl = None, concurrency: opt.Concurrency = None,
         num_prompts: opt.NumPrompts = None, set_: opt.Settings = [],
         model_path: Optional[str] = typer.Option(None, "--model-path", metavar="PATH",
                                                  help="checkpoint to serve (default: the model's Hugging Face id)"),
         port: int = typer.Option(8000, "--port", help="server port (P/D: the proxy is on 8000)"),
         profile_dir: Optional[str] = typer.Option(None, "--profile-dir", metavar="DIR",
                                                   help="torch profiler output folder on the GPU box; adds "
                                                        "--profiler-config and bench --profile"),
         result_dir: str = typer.Option("vllm-bench", "--result-dir", metavar="DIR",
                                        help="where bench writes its JSON"),
         kv_connector: str = typer.Option(KV_CONNECTOR, "--kv-connector", help="P/D KV connector"),
         check: bool = typer.Option(False, "--check", help="parse every command with the installed vLLM's parser "
                                                           "and check the variables against vllm.envs"),
         list_presets: bool = typer.Option(False, "--presets", help="list the named deployments and exit"),
         as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """The exact vllm serve and vllm bench serve commands (and environment) of a deployment."""
    if list_presets:
        if as_json:
            echo_json({"presets": {n: p.description for n, p in sorted(PRESETS.items())}})
        else:
            for n, p in sorted(PRESETS.items()):
                typer.echo(f"{n:24s} {p.description}")
        return

    parts = _deployments(preset, set_, model=model, hardware=hardware, tp=tp, ep=ep, quant=quant, kv_dtype=kv_dtype,
                         index_dtype=index_dtype, isl=isl, osl=osl, concurrency=concurrency, num_prompts=num_prompts)
    wl = parts[0][0].workload
    launch = Launch(model_path=model_path, port=port, profile_dir=profile_dir, kv_connector=kv_connector,
                    input_len=wl.isl, output_len=wl.osl, concurrency=wl.concurrency, num_prompts=wl.num_prompts,
                    result_dir=result_dir)
    p = plan_commands(parts, launch)
    problems = check_with_vllm(p) if check else None
    if as_json:
        echo_json({**p.to_dict(), "check": problems})
    else:
        typer.echo(p.text(terminal_width()))   # the commands continued with "\\" in the terminal's width
        if problems is not None:
            typer.echo("# checked with vLLM's parser and vllm.envs: " + ("ok" if not problems else "PROBLEMS"))
    if problems:
        for line in problems:
            typer.secho(f"error: {line}", err=True, fg="red")
        raise typer.Exit(1)


@vllm_app.command("collect")
def collect(run_dir: Path = typer.Argument(..., help="run folder to add the measurements to (created if absent)"),
            bench: List[Path] = typer.Option([], "--bench", metavar="FILE_OR_DIR", help="a vllm bench serve --save-result JSON, or its "
                                                                   "--result-dir; repeatable"),
            profile: List[Path] = typer.Option([], "--profile", metavar="DIR_OR_FILE", help="a profiler folder or trace file; repeatable"),
            preset: Optional[str] = typer.Option(None, "--preset", help="the deployment that ran: enables the "
                                                                         "fast-path verification"),
            set_: opt.Settings = [],
            gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs of the deployment (default: the file's "
                                                                     "gpus metadata, else the preset's)"),
            as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Copy bench results and profiler traces into a run folder as artifacts; verify the expected fast paths."""
    dep = None
    if preset:
        dep = opt.build(preset, set_)
    elif set_:
        raise M3LabError("--set adjusts a preset", field="--set", hint="give --preset NAME")
    summary = do_collect(run_dir, [str(b) for b in bench], [str(p) for p in profile], deployment=dep, gpus=gpus)
    if as_json:
        echo_json(summary)
        return
    if "headline" in summary:
        typer.echo(headline_line(summary["headline"]))
    typer.echo(f"run folder: {summary['run_dir']}")
    for path in summary["artifacts"]:
        typer.echo(f"  artifact {path}")
    if "fastpaths" in summary:
        v = summary["fastpaths"]
        counts = ", ".join(f"{k[2:]} {n}" for k, n in v.items() if k.startswith("n_"))
        typer.echo(f"fast paths of {v['expectations']}: {'ok' if v['ok'] else 'NOT ok'} ({counts})")


def headline_line(h: dict) -> str:
    """What ``vllm collect`` stored, in one line: the figures of the first benchmark, labelled measured, with the
    model, GPU count and device (the preset's hardware; a bench file does not name its device)."""
    device = h["device"].upper() if h["device"] else "device not stated (--preset names it)"
    return (f"measured (vllm bench serve): {h['output_tokens_per_s_per_gpu']:.1f} output tok/s/GPU, median TTFT "
            f"{h['ttft_s']:.3f} s, mean TPOT {h['tpot_ms']:.2f} ms; {h['model_id']} on {h['gpus']} GPU(s), {device}")


@vllm_app.command("moe-tables")
def moe_tables(ours: Optional[Path] = typer.Argument(None, help="a folder of vLLM-format fused-MoE tables "
                                                                 "(default: m3lab's own, kernels/moe/configs)"),
               against: Optional[Path] = typer.Option(None, "--against", help="folder to compare with (default: "
                                                                              "the installed vLLM's shipped tables)"),
               every_table: bool = typer.Option(False, "--all", help="also list tables only the other side has"),
               as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Compare fused-MoE tuning tables with vLLM's shipped ones, by shape (E, N, dtype) and device."""
    from m3lab.vllm.moe_tables import compare_tables, our_tables_dir, shipped_dir  # local: pulls in torch

    ours = ours or our_tables_dir()
    against = against or shipped_dir()
    table = compare_tables(ours, against, every_table=every_table)
    if as_json:
        echo_json({"ours": str(ours), "against": str(against), "rows": table.to_dict("records")})
        return
    _print_moe_tables(table)


def _print_moe_tables(table) -> None:
    """One row per table (shape, device, the M values each side covers, same tiles), the first differing tile
    under its row, then the finding in one sentence."""
    import shutil

    from m3lab.vllm.moe_tables import finding  # local: pulls in torch

    def span(ms):
        return f"{len(ms)} M, {ms[0]}-{ms[-1]}" if ms else "none"
    rows = [{"table": f"E={r['E']},N={r['N']}" + (f",{r['dtype']}" if r["dtype"] else "") + f" {r['device']}",
             "ours": span(r["m_ours"]), "theirs": span(r["m_theirs"]), "same": f"{r['same_tile']}/{r['compared']}",
             "other": ", ".join(r["theirs_other_devices"]), "differs": r["differs"]} for r in table.to_dict("records")]
    columns = [Column("table"), Column("ours", "ours (M)"), Column("theirs", "theirs (M)"),
               Column("same", "same tile", fmt=""), Column("other", "theirs on other devices", detail=True),
               Column("differs", "first difference", detail=True)]
    width = shutil.get_terminal_size((100, 24)).columns
    for line in render(rows, columns, width, title="fused-MoE tables: ours against theirs, by shape and device"):
        typer.echo(line)
    typer.echo("\n".join(wrap(finding(table), width)))


def register(app: typer.Typer) -> None:
    app.add_typer(vllm_app, name="vllm")
