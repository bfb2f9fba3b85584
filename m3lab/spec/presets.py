"""Named deployments as plain data (:data:`PRESETS`): the write-up's MI355X deployments, an H200 one, and the
checklist's default (:data:`DEFAULT_PRESET`: MiniMax M3, MXFP8, TP4, vLLM's default switches, 8K in / 1K out at
concurrency 32). :func:`m3lab.spec.serving.load_preset` builds them into a Deployment.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

DEFAULT_PRESET = "default"   # the checklist's deployment, what every entry point uses when given no preset


@dataclass(frozen=True)
class Preset:
    """A named deployment, as plain data; every record field it does not name keeps its default."""

    name: str
    description: str
    model: str
    hardware: str
    quant: str
    plan: Mapping[str, Any]
    serving: Mapping[str, Any] = field(default_factory=dict)
    kv_dtype: str = "bf16"
    index_dtype: str = "bf16"
    index_topk_freq: int = 1


_OPTIMISED = {"aiter": True, "shuffle_kv_cache": True}
PRESETS: Mapping[str, Preset] = {p.name: p for p in (
    Preset(DEFAULT_PRESET, "the checklist's deployment: MiniMax M3 MXFP8 at TP4 with vLLM's default switches "
           "and limits, 8192 in / 1024 out at concurrency 32", "minimax-m3", "mi355x", "mxfp8", {"tp": 4}),
    Preset("mxfp8-tp4-baseline", "write-up MXFP8 TP4 before its optimisations: vLLM defaults (AITER off, "
           "Triton sparse attention, no shared-expert fusion, every sparse layer computes its top-k)",
           "minimax-m3-mxfp8", "mi355x", "mxfp8", {"tp": 4, "fused_shared_expert": False}),
    Preset("mxfp8-tp4-optimised", "write-up MXFP8 TP4 after its optimisations: AITER on, shuffled KV layout "
           "(AITER paged sparse attention through the page-16 adapter), shared-expert fusion, index sharing "
           "every 4th sparse layer", "minimax-m3-mxfp8", "mi355x", "mxfp8",
           {"tp": 4, "fused_shared_expert": True}, _OPTIMISED, index_topk_freq=4),
    Preset("mxfp4-tp2", "write-up MXFP4 (amd/MiniMax-M3-MXFP4) at TP2: 2 KV heads per rank, so AITER paged "
           "sparse attention needs the fp8 MSA indexer to emit its page table", "minimax-m3", "mi355x", "mxfp4",
           {"tp": 2, "fused_shared_expert": True}, _OPTIMISED, index_dtype="fp8"),
    Preset("eagle3-mxfp8-tp4", "write-up EAGLE3 speculative decoding on the optimised MXFP8 TP4 deployment, "
           "3 draft tokens (multi-token verify through the indexer and paged sparse attention)",
           "minimax-m3-mxfp8", "mi355x", "mxfp8", {"tp": 4, "fused_shared_expert": True},
           {**_OPTIMISED, "spec_method": "eagle3", "spec_tokens": 3}, index_topk_freq=4),
    Preset("pd-mxfp8-prefill-tp4", "write-up P/D disaggregation, prefill worker: optimised MXFP8 at TP4",
           "minimax-m3-mxfp8", "mi355x", "mxfp8", {"tp": 4, "fused_shared_expert": True, "role": "prefill"},
           _OPTIMISED, index_topk_freq=4),
    Preset("pd-mxfp8-decode-tp4", "write-up P/D disaggregation, decode worker: optimised MXFP8 at TP4",
           "minimax-m3-mxfp8", "mi355x", "mxfp8", {"tp": 4, "fused_shared_expert": True, "role": "decode"},
           _OPTIMISED, index_topk_freq=4),
    Preset("h200-bf16-tp4", "MiniMax M3 BF16 at TP4 on an H200 (SM90): vLLM's NVIDIA model with the common "
           "Triton indexer and sparse attention (the H200 trace's plan)", "minimax-m3", "h200", "bf16",
           {"tp": 4, "fused_shared_expert": False}),
)}
