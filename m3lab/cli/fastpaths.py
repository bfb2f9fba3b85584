"""``m3lab fastpaths``: which code vLLM runs for each op of MiniMax M3, with every condition and its source line.

    m3lab fastpaths [--preset mxfp8-tp4-optimised] [--set VLLM_ROCM_USE_AITER=0 ...] [--phase prefill] [--json]
    m3lab fastpaths --model minimax-m3-mxfp8 --hardware mi355x --tp 4 --quant mxfp8 --tokens 32

vLLM's own selection code decides, on an emulated platform of the GPU (``m3lab.vllm.fastpaths``); each op
says ``executed`` or ``restated``. The step is the one the serving estimate resolves the deployment at
(:func:`m3lab.serving.dispatch.resolved_tokens`: decode at the concurrency's rows, prefill at the token budget;
decode context = the workload's input length) unless ``--tokens``/``--context`` say otherwise. The first run for
a GPU starts vLLM on the emulated platform (10-15 s on an idle 2-core CPU). Exit status 2 when vLLM refuses
the deployment at start-up (the reason is vLLM's) or the input is bad.

The text is one block per op (path, kernels, each condition on its own line with its value, how it was
decided, the vLLM line that decided it), in the terminal's width with no word split, under the ``vllm serve``
line ``m3lab vllm plan`` prints for the same deployment (one renderer: :func:`m3lab.vllm.serve_command.
command_lines`).
"""
from __future__ import annotations

import textwrap
from typing import Optional

import typer

from m3lab.cli import deploy_options as opt
from m3lab.cli.columns import terminal_width
from m3lab.cli.output import echo_json
from m3lab.serving.dispatch import resolved_tokens
from m3lab.vllm.fastpaths import resolve
from m3lab.vllm.serve_command import serve_instance

REFUSED_EXIT = 2
INDENT, HANG = "    ", "      "
MARK = {True: "✓", False: "✗"}
NBSP = "\u00a0"   # textwrap does not break at it


def fastpaths_cmd(preset: opt.Preset = None, model: opt.Model = None, hardware: opt.HardwareName = None,
                  tp: opt.Tp = None, ep: opt.Ep = None, quant: opt.Quant = None, kv_dtype: opt.KvDtype = None,
                  index_dtype: opt.IndexDtype = None, set_: opt.Settings = [],
                  tokens: Optional[int] = typer.Option(None, "--tokens", help="tokens in the step (decode: rows; "
                                                                               "default: the serving estimate's step)"),
                  context: Optional[int] = typer.Option(None, "--context", help="decode: tokens cached per request "
                                                                                "(default: the input length)"),
                  phase: Optional[str] = typer.Option(None, "--phase", help="decode or prefill (default: prefill "
                                                                            "for a prefill worker, else decode)"),
                  as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """For each op of a dense and a sparse layer: the path vLLM takes, its kernels, conditions and source."""
    from rich.console import Console

    d = opt.build(preset, set_, model=model, hardware=hardware, tp=tp, ep=ep, quant=quant, kv_dtype=kv_dtype,
                  index_dtype=index_dtype)
    phase = phase or ("prefill" if d.plan.role == "prefill" else "decode")
    if tokens is None:   # the step the serving estimate resolves this deployment at (the resolver checks the rest)
        tokens = resolved_tokens(d).get(phase, 0)
    context = d.workload.isl if context is None else context
    with Console(stderr=True).status(f"vLLM deciding on an emulated {d.hardware.name} (the first run per GPU "
                                     "starts vLLM: 10-15 s)"):
        res = resolve(d, tokens=tokens, phase=phase, context=context)
    server = serve_instance(d)
    if as_json:
        echo_json({**res.to_dict(), "vllm_command": server.text()})
    else:
        typer.echo("\n".join(fastpath_lines(res, server, terminal_width())))
    if not res.ok:
        raise typer.Exit(REFUSED_EXIT)


def _wrap(text: str, width: int, first: str = INDENT, rest: str = HANG) -> list[str]:
    """``text`` wrapped between words (a word longer than the line keeps its own line, whole); a name joined by
    :func:`_whole` stays on one line."""
    return [x.replace(NBSP, " ") for x in textwrap.wrap(text, width=width, initial_indent=first,
                                                         subsequent_indent=rest, break_long_words=False,
                                                         break_on_hyphens=False)] or [first.rstrip()]


def _whole(name: str, width: int) -> str:
    """``name`` with non-breaking spaces where it fits on a continuation line, so it is never wrapped inside
    (``vllm/....py:134 _select_cfg``); a longer name may break at its own spaces, never inside a word."""
    return name.replace(" ", NBSP) if len(HANG) + len(name) <= width else name


def op_block(x, width: int) -> list[str]:
    """One op's block: its heading (op, layers, decision id, path, status), then one line (wrapped between words)
    each for the shape, kernels, what vLLM returned, every condition with its value, how it was decided, the vLLM
    line that decided it, and the note."""
    lines = _wrap(f"{x.op}, {x.layer_kind} layers: {x.decision} {x.path} ({x.status})", width, "", INDENT)
    parts = [("shape", str(x.shape) if x.shape else ""), ("kernels", ", ".join(_whole(k, width) for k in x.kernels)),
             ("vLLM", x.vllm)]
    for label, value in parts:
        if value:
            lines += _wrap(f"{label}: {value}", width)
    for c in x.checks:
        lines += _wrap(f"{MARK[bool(c.holds)]} {c.name}: {c.value}", width)
    lines += _wrap(f"how: {x.how}", width) + _wrap(f"decided by {_whole(str(x.decided_by), width)}", width)
    if x.note:
        lines += _wrap(f"note: {x.note}", width)
    return lines


def fastpath_lines(res, server, width: int) -> list[str]:
    """What ``m3lab fastpaths`` prints in ``width`` characters: the deployment, its ``vllm serve`` line (as
    ``m3lab vllm plan`` prints it), one block per op, then what vLLM turned off or refused."""
    d = res.deployment
    head = (f"{d.name or 'deployment'}: {d.model.name} on {d.hardware.name} ({res.platform.kind} "
            f"{res.platform.arch}), TP{d.plan.tp} EP{d.plan.ep}, quant {d.quant.name}, KV {d.quant.kv_dtype}, "
            f"index {d.quant.index_dtype}; {res.phase} step of {res.tokens} tokens")
    lines = _wrap(head, width, "", INDENT)
    what = "server" if server.role == "both" else f"{server.role} instance 0"
    lines += _wrap(f"# {what}, as m3lab vllm plan prints it:", width, "", "#   ") + server.lines(width)
    for x in res.decisions:
        lines += [""] + op_block(x, width)
    lines += [""] + _wrap(f"{len(res.decisions) - len(res.restated)} ops decided by vLLM's code on an emulated "
                          f"{res.platform.arch}, {len(res.restated)} restated", width, "", INDENT)
    for x in res.turned_off:
        lines += _wrap(f"turned off {x.op}: {x.note}", width, "", INDENT)
    for x in res.refused:
        lines += _wrap(f"refused {x.op} ({x.decided_by}): {x.note}", width, "", INDENT)
    return lines


def register(app: typer.Typer) -> None:
    """Add the ``fastpaths`` command to the m3lab app."""
    app.command("fastpaths")(fastpaths_cmd)
