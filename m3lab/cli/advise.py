"""``m3lab advise``: the write-up's fixes a deployment has not applied, ranked by estimated gain (projected).

    m3lab advise --preset mxfp8-tp4-baseline --concurrency 32 [--json]
    m3lab advise --preset mxfp8-tp4-baseline --set VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1

Each fix comes with the op it relieves most, that op's share of the decode step, and the checklist step that would
confirm it ran; fixes vLLM refuses or turns off for this deployment are listed apart, with vLLM's reason.
"""
from __future__ import annotations

from typing import Optional

import typer

from m3lab.cli import deploy_options as opt
from m3lab.cli.output import echo_json
from m3lab.pipeline.validate import is_null


def advise_cmd(
        preset: opt.Preset = None, model: opt.Model = None, hardware: opt.HardwareName = None, tp: opt.Tp = None,
        ep: opt.Ep = None, quant: opt.Quant = None, kv_dtype: opt.KvDtype = None,
        index_dtype: opt.IndexDtype = None, isl: opt.Isl = None, osl: opt.Osl = None,
        concurrency: opt.Concurrency = None, num_prompts: opt.NumPrompts = None, set_: opt.Settings = [],
        calibration: Optional[str] = typer.Option(None, "--calibration", metavar="NAME|CSV",
                                                  help="as for estimate (default: the hardware's shipped one)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Rank the fixes this deployment has not applied by estimated gain, best first."""
    from m3lab.ladder.advise import advise  # local: pulls in pandas, torch
    from m3lab.ladder.evaluate import check  # local: pulls in pandas, torch

    d = opt.build(preset, set_, model=model, hardware=hardware, tp=tp, ep=ep, quant=quant, kv_dtype=kv_dtype,
                  index_dtype=index_dtype, isl=isl, osl=osl, concurrency=concurrency, num_prompts=num_prompts)
    check(d)
    cal = "default" if calibration is None else (None if is_null(calibration) else calibration)
    advice = advise(d, calibration=cal, progress=lambda line: typer.secho(line, err=True, fg="cyan"))
    if as_json:
        echo_json(advice.to_dict())
    else:
        _print(advice)


def _print(advice) -> None:
    from rich.console import Console
    from rich.table import Table

    d, f = advice.deployment, advice.base.figures
    console = Console()
    console.print(f"[bold]{d.name}[/bold]: {f['output_tokens_per_s_per_gpu']:.1f} output tok/s/GPU, TTFT "
                  f"{f['ttft_s']:.3f} s, TPOT {f['tpot_ms']:.2f} ms (projected)", highlight=False)
    table = Table(title="Next fixes, best first", show_lines=True)
    for col in ("fix", "gain %", "op relieved (share of decode step)", "vLLM switch", "confirm with"):
        table.add_column(col, overflow="fold")
    for e in advice.fixes:
        table.add_row(e["fix"], f"{e['gain_pct']:+.1f}", f"{e['op']} ({e['op_share_pct']:.1f}%)",
                      ", ".join(f"{k}={v}" for k, v in e["settings"].items()), e["confirm"])
    console.print(table)
    for b in advice.blocked:
        console.print(f"[yellow]not offered[/yellow] {b['fix']}: {b['reason']}", highlight=False)
    if not advice.fixes:
        console.print("every switch fix of the write-up is applied (or blocked above)")
    console.print(f["label"], highlight=False)


def register(app: typer.Typer) -> None:
    app.command("advise")(advise_cmd)
