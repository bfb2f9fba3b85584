"""The deployment options every command shares (``estimate``, ``shapes``, ``model``, ``fastpaths``, ``vllm plan``,
``planes``, ``repetition``).

``--preset NAME`` starts from a named deployment (default: the checklist's, ``m3lab.spec.presets.DEFAULT_PRESET``);
the flags below override its fields; ``--set KEY=VALUE`` (repeatable) sets any other field of the record in any
spelling :mod:`m3lab.spec.settings` accepts: m3lab's field names, vLLM's environment variables
(``--set VLLM_ROCM_USE_AITER=1``) and ``vllm serve`` / ``vllm bench serve`` flags (``--set --max-num-seqs=128``).
A command declares the options as parameters typed with the aliases here and calls :func:`build`.
"""
from __future__ import annotations

from typing import Annotated, Any, List, Optional

import typer

from m3lab.errors import M3LabError
from m3lab.spec.serving import make_deployment
from m3lab.spec.settings import canonical

SET_HELP = ("KEY=VALUE, repeatable: any deployment field (tp, kv_dtype, aiter, max_num_seqs, index_topk_freq, "
            "accept_len, ...), a vLLM variable (VLLM_ROCM_USE_AITER=0) or a vllm serve flag (--max-num-seqs=128)")

Preset = Annotated[Optional[str], typer.Option(
    "--preset", metavar="NAME", help="named deployment to start from (m3lab vllm plan --presets lists them; "
                                     "default: MiniMax M3 MXFP8 TP4 with vLLM's defaults)")]
Model = Annotated[Optional[str], typer.Option(
    "--model", metavar="NAME", help="model name (minimax-m3, ...) or a Hugging Face config.json path")]
HardwareName = Annotated[Optional[str], typer.Option(
    "--hardware", metavar="NAME", help="hardware profile (mi355x, mi300x, h200, b200, ...) or a YAML path")]
Tp = Annotated[Optional[int], typer.Option("--tp", metavar="N", help="tensor-parallel GPUs per replica")]
Ep = Annotated[Optional[int], typer.Option("--ep", metavar="N", help="expert-parallel degree (1: TP-MoE)")]
Quant = Annotated[Optional[str], typer.Option("--quant", metavar="NAME", help="weights: bf16, fp8, mxfp8 or mxfp4")]
KvDtype = Annotated[Optional[str], typer.Option("--kv-dtype", metavar="DTYPE", help="KV cache dtype: bf16 or fp8")]
IndexDtype = Annotated[Optional[str], typer.Option(
    "--index-dtype", metavar="DTYPE", help="index-key cache dtype: bf16 (vLLM's default) or fp8")]
Isl = Annotated[Optional[int], typer.Option("--isl", "--input-len", metavar="TOKENS",
                                            help="input tokens per request")]
Osl = Annotated[Optional[int], typer.Option("--osl", "--output-len", metavar="TOKENS",
                                            help="output tokens per request")]
Concurrency = Annotated[Optional[int], typer.Option("--concurrency", metavar="N",
                                                    help="requests in flight (vllm bench --max-concurrency)")]
NumPrompts = Annotated[Optional[int], typer.Option(
    "--num-prompts", "--num-requests", metavar="N", help="requests in all (vllm bench's default: 1000)")]
Settings = Annotated[List[str], typer.Option("--set", metavar="KEY=VALUE", help=SET_HELP)]


def parse_set(items: list[str]) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` -> {KEY: VALUE}; a malformed item raises M3LabError."""
    out: dict[str, str] = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise M3LabError(f"--set {item!r} is not KEY=VALUE", field="--set",
                             hint="e.g. --set VLLM_ROCM_USE_AITER=1 or --set max_num_seqs=128")
        out[key.strip()] = value.strip()
    return out


def build(preset: str | None, set_items: list[str] | None = None, **flags: Any):
    """The Deployment of ``--preset`` with the flags given (None: not given) and ``--set`` applied; a field given
    both as a flag and in ``--set`` is an error."""
    given = {k: v for k, v in flags.items() if v is not None}
    extra = parse_set(set_items or [])
    named = {canonical(k)[0]: k for k in given}
    for key in extra:
        if canonical(key)[0] in named:
            raise M3LabError(f"{key} is given twice (--{named[canonical(key)[0]].replace('_', '-')} and --set)",
                             field=key, hint="give it once")
    return make_deployment(preset, {**given, **extra})
