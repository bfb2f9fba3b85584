"""``m3lab fastpaths``: which code vLLM runs for each op of MiniMax M3, with every condition and its source line.

    m3lab fastpaths --model minimax-m3-mxfp8 --hardware mi355x --tp 4 --quant mxfp8 --tokens 32
    m3lab fastpaths --preset mxfp8-tp4-optimised [--set VLLM_ROCM_USE_AITER=0 ...] [--json]

vLLM's own selection code decides, on an emulated platform of the GPU (``m3lab.vllm.fastpaths``); each row
says ``executed`` or ``restated``. The first run for a GPU starts vLLM on the emulated platform (10-15 s on an idle
2-core CPU). Exit status 2 when vLLM refuses the deployment at start-up (the reason is vLLM's) or the input
is bad.
"""
from __future__ import annotations

from typing import Optional

import typer

from m3lab.cli import deploy_options as opt
from m3lab.cli.output import echo_json

REFUSED_EXIT = 2


def fastpaths_cmd(preset: opt.Preset = None, model: opt.Model = None, hardware: opt.HardwareName = None,
                  tp: opt.Tp = None, ep: opt.Ep = None, quant: opt.Quant = None, kv_dtype: opt.KvDtype = None,
                  index_dtype: opt.IndexDtype = None, set_: opt.Settings = [],
                  tokens: int = typer.Option(32, "--tokens", help="tokens in the step (decode: rows)"),
                  context: int = typer.Option(8192, "--context", help="decode: tokens cached per request"),
                  phase: Optional[str] = typer.Option(None, "--phase", help="decode or prefill (default: prefill "
                                                                            "for a prefill worker, else decode)"),
                  as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """For each op of a dense and a sparse layer: the path vLLM takes, its kernels, conditions and source."""
    from rich.console import Console

    from m3lab.vllm.fastpaths import resolve

    d = opt.build(preset, set_, model=model, hardware=hardware, tp=tp, ep=ep, quant=quant, kv_dtype=kv_dtype,
                  index_dtype=index_dtype)
    phase = phase or ("prefill" if d.plan.role == "prefill" else "decode")
    with Console(stderr=True).status(f"vLLM deciding on an emulated {d.hardware.name} (the first run per GPU "
                                     "starts vLLM: 10-15 s)"):
        res = resolve(d, tokens=tokens, phase=phase, context=context)
    if as_json:
        echo_json(res.to_dict())
    else:
        _print(res)
    if not res.ok:
        raise typer.Exit(REFUSED_EXIT)


def _print(res) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    d = res.deployment
    console.print(f"[bold]{d.name or 'deployment'}[/bold]: {d.model.name} on {d.hardware.name} "
                  f"({res.platform.kind} {res.platform.arch}), tp={d.plan.tp} ep={d.plan.ep}, quant {d.quant.name}, "
                  f"kv {d.quant.kv_dtype}, index {d.quant.index_dtype}; {res.phase} step of {res.tokens} tokens",
                  highlight=False)
    console.print(f"[dim]{d.command()}[/dim]", highlight=False)
    table = Table(show_lines=True)
    for col in ("op", "layers", "id", "path", "how", "kernels", "conditions (value)", "decided by"):
        table.add_column(col, overflow="fold")
    colour = {"runs": "green", "off": "yellow", "refused": "red", "skipped": "dim"}
    for x in res.decisions:
        conds = "\n".join(f"{'✓' if c.holds else '✗'} {c.name}: {c.value}" for c in x.checks)
        path = f"[{colour[x.status]}]{x.path}[/{colour[x.status]}]" + (f"\n{x.shape}" if x.shape else "")
        table.add_row(x.op, x.layer_kind, x.decision, path, x.how, "\n".join(x.kernels), conds, str(x.decided_by))
    console.print(table)
    console.print(f"[dim]{len(res.decisions) - len(res.restated)} rows executed by vLLM's code on an emulated "
                  f"{res.platform.arch}, {len(res.restated)} restated[/dim]", highlight=False)
    for x in res.turned_off:
        console.print(f"[yellow]turned off[/yellow] {x.op}: {x.note}", highlight=False)
    for x in res.refused:
        console.print(f"[red]refused[/red] {x.op} ({x.decided_by}): {x.note}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the ``fastpaths`` command to the m3lab app."""
    app.command("fastpaths")(fastpaths_cmd)
