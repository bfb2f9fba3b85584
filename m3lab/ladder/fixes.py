"""The write-up's fixes as data, in its order: what each changes in a Deployment, the ops it relieves, how the
checklist finds and confirms it, and where vLLM 0.33.0 has it.

One entry is no fix the write-up names: ``aiter`` (``VLLM_ROCM_USE_AITER=1``) is a switch of the optimised deployment
that moves many ops at once (the MoE experts, the routing top-k, the LM head, the all-reduce + norm at prefill). It
has its own rung where the write-up's fixes need it (shared-expert fusion and the sparse page adapter assume AITER:
``requires``), so that each named fix's gain is that fix's alone; ``named`` is False for it and no write-up figure
is ever shown beside it.

A fix with ``settings`` is a vLLM switch: the change is ``deployment.with_settings(fix.settings)`` in the vocabulary
of :mod:`m3lab.spec.settings` (vLLM's environment variables, ``vllm serve`` flags, m3lab field names). A fix without
is already vLLM 0.33.0's code (the decode GEMM launcher, the grouped-MoE program order, and for speculative
decoding the request-level index batching and multi-token verification): there is nothing to switch, so m3lab
represents the state *before* it (``before``, :mod:`m3lab.ladder.before`) — m3lab's representation, not vLLM's.
``requires``: settings the fix assumes (the write-up's deployment had them); the ladder places them on an earlier
rung and the advisor says when a deployment lacks them.

``ops`` are the ops of the per-op breakdown the fix relieves (vLLM's ops as ``m3lab fastpaths`` and
``m3lab.serving.breakdown`` name them: ``qkv_proj``, ``experts``, ``indexer``, ``attention``, ...); ``side_ops`` the
other ops its switches also move (``VLLM_ROCM_USE_AITER=1`` swaps the MoE, all-reduce and LM-head kernels too).
``found_by`` / ``confirm_step`` are checklist steps (1 local shapes, 2 repetition, 3 byte planes, 4 fast-path
verification, 5 correctness gates, 6 iterative profiling). The write-up's published gain of each fix is
:data:`m3lab.published.FIX_GAINS`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.ladder.before import BEFORE
from m3lab.published import gains_text

CHECKLIST = {1: "local shape analysis", 2: "repetition estimate", 3: "byte-plane separation",
             4: "fast-path verification", 5: "correctness gates", 6: "iterative profiling"}
NOT_NAMED = "none: not a fix the write-up names (a switch of its optimised deployment)"
EVERY_OP = "*"   # a fix that changes the step itself (speculative decoding widens every op)

_MXFP8_DENSE = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "shared_gate_up", "shared_down")
_SHARED = ("shared_gate_up", "activation", "shared_down")
_INDEX_BRANCH = ("indexer", "qk_norm_rope_insert", "page_table")
_AITER = {"VLLM_ROCM_USE_AITER": "1"}


def _before(fix: str) -> str:
    b = BEFORE[fix]
    a = b.assumption
    return f"{b.label}; assumption {a.name} = {a.value:g} (range {a.low:g}..{a.high:g}: {a.source})"


@dataclass(frozen=True)
class Fix:
    """One fix of the write-up (see the module docstring)."""

    name: str
    title: str
    settings: Mapping[str, Any]
    ops: tuple[str, ...]
    found_by: int
    found: str                  # what that checklist step shows that points at the fix
    confirm_step: int
    confirm: str                # what that checklist step shows when the fix ran
    vllm: str                   # where vLLM 0.33.0 has it (file: function, switch)
    side_ops: tuple[str, ...] = ()
    before: str = ""            # code fixes: how m3lab represents the state before it (m3lab's representation)
    spec_only: bool = False
    named: bool = True          # one of the write-up's fixes (False: a switch of its optimised deployment)
    requires: Mapping[str, Any] = field(default_factory=dict)   # settings the fix assumes

    @property
    def is_switch(self) -> bool:
        """True when vLLM 0.33.0 has a switch for it (``settings``); False for a fix that is vLLM's code."""
        return bool(self.settings)

    def touches(self) -> set[str]:
        """Every op the fix may change: ``ops`` and ``side_ops``."""
        return set(self.ops) | set(self.side_ops)

    def to_dict(self) -> dict[str, Any]:
        return {"fix": self.name, "title": self.title, "settings": dict(self.settings), "ops": list(self.ops),
                "side_ops": list(self.side_ops), "found_by": self.found_by, "found": self.found,
                "confirm_step": self.confirm_step, "confirm": self.confirm, "vllm": self.vllm,
                "before": self.before or None, "spec_only": self.spec_only, "named": self.named,
                "requires": dict(self.requires), "writeup": gains_text(self.name) or None}


FIXES: tuple[Fix, ...] = (
    Fix("decode_gemm_launcher", "shape-aware decode GEMM launcher", {}, _MXFP8_DENSE, 1,
        "at decode every dense GEMM has M = the batch (at most 64 rows) against a whole weight matrix: a large-M tile "
        "leaves most compute units idle and steps through K in small trips",
        4, "the trace shows _mxfp8_linear_kernel launched with the decode tile (BLOCK_M 16, BLOCK_N 16, BLOCK_K "
        "512/1024) for M <= 64", "vllm/model_executor/kernels/linear/mxfp8/rocm_native.py: _select_cfg (M <= 64)",
        before=_before("decode_gemm_launcher")),
    Fix("moe_program_order", "grouped-MoE program order", {}, ("experts",), 2,
        "the two grouped GEMMs are most of every decode step (57 layers, every step); with a few tokens per expert, "
        "neighbouring programs load the same activation rows and weight tiles",
        5, "the correctness gate of the reordered grouped GEMM passes beside its performance gate",
        "vllm/model_executor/layers/fused_moe/experts/mxfp8_native_moe.py: _mxfp8_grouped_gemm_kernel "
        "(GROUP_SIZE_M=4 program swizzle)",
        before=_before("moe_program_order")),
    Fix("aiter", "AITER kernels on (a switch of the optimised deployment, not a fix the write-up names)",
        _AITER, ("experts", "routing", "lm_head", "allreduce_norm"), 4,
        "the fast-path resolution shows the routed experts on vLLM's Triton MXFP8 grouped GEMM, the routing top-k on "
        "vLLM's Triton kernel and the LM head on hipBLASLt while AITER's kernels for them are off",
        4, "the trace shows AITER's fused MoE (FlyDSL MXFP8), its biased grouped top-k and its tuned GEMM for the "
           "LM head", "vllm/_aiter_ops.py: rocm_aiter_ops.is_enabled / is_fused_moe_enabled (VLLM_ROCM_USE_AITER=1)",
        named=False),
    Fix("shared_expert_fusion", "shared-expert fusion (129 experts, top-5)",
        {"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}, _SHARED + ("experts", "routing"), 1,
        "the shared expert runs as a separate dense MLP with M = tokens beside a grouped GEMM that already streams "
        "experts for every token: as expert 129 it is one more row of the same table (top-4 + 1)",
        4, "AITER's fused_moe key has 129 experts and top-k 5, and no separate shared _mxfp8_linear_kernel pair runs",
        "vllm/models/minimax_m3/amd/model.py: _aiter_moe_fused_shared_experts_enabled "
        "(VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1; off under expert parallelism)", requires=_AITER),
    Fix("index_sharing", "index sharing (index_topk_freq 4)", {"index_topk_freq": 4}, _INDEX_BRANCH, 2,
        "the indexer reads every request's whole index-key cache on all 57 sparse layers at every step, and "
        "neighbouring layers choose nearly the same blocks",
        4, "indexer kernels run on the 15 computing layers only; reuse layers read the shared top-k",
        "vllm/models/minimax_m3/amd/model.py: _should_skip_index_topk (--hf-overrides "
        "'{\"text_config\": {\"use_index_cache\": true, \"index_topk_freq\": 4}}')"),
    Fix("sparse_page_adapter", "sparse page adapter / AITER paged sparse attention",
        {"VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"},
        ("attention", "page_table", "qk_norm_rope_insert", "indexer"), 4,
        "AITER's paged attention takes 16-token pages and M3's cache has 128-token blocks, so the sparse layers "
        "ran vLLM's Triton attention instead",
        4, "the trace shows paged_attention_decode*gluon and no _gqa_sparse_decode_kernel; the decode top-k emits "
           "the page-16 table", "vllm/models/minimax_m3/common/sparse_attention.py (VLLM_ROCM_USE_AITER=1 and "
                                "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1); vllm/models/minimax_m3/amd/ops/sparse_pa.py",
        requires=_AITER),
    Fix("eagle3_speculative_decoding", "EAGLE3 speculative decoding (3 draft tokens)",
        {"spec_method": "eagle3", "spec_tokens": 3}, (EVERY_OP, "draft_model"), 6,
        "with the leaf kernels flat, every decode step still streams the experts' weights for one token per "
        "request; verifying several draft tokens reads them once for more tokens",
        4, "decode steps verify 1 + K rows per request through the indexer and attention",
        "--speculative-config '{\"method\": \"eagle3\", \"num_speculative_tokens\": 3}'", spec_only=True),
    Fix("request_level_index_batching", "request-level index batching of draft positions", {}, ("indexer",), 1,
        "a verify step sends 1 + K query rows per request to the indexer; scored row by row, every row re-reads "
        "the request's index keys", 4, "one _decode_index_score_kernel program per request scores all heads and "
                                       "draft rows (BLOCK_SIZE_Q = next_pow2(1 + K))",
        "vllm/models/minimax_m3/amd/ops/index_topk.py: _decode_index_score_kernel",
        before=_before("request_level_index_batching"), spec_only=True),
    Fix("multi_token_verification", "sparse paged attention for multi-token verification", {},
        ("attention", "page_table"), 4,
        "verify steps (1 + K rows per request) left AITER's paged attention for vLLM's Triton sparse kernels",
        4, "the verify steps' trace shows paged_attention_decode*gluon and no _gqa_sparse_decode_kernel",
        "vllm/models/minimax_m3/amd/ops/sparse_pa.py: every (query token, KV head) one pa_decode_gluon sequence",
        before=_before("multi_token_verification"), spec_only=True),
)
BY_NAME: Mapping[str, Fix] = {f.name: f for f in FIXES}


def get_fix(name: str) -> Fix:
    """The fix called ``name``; an unknown name raises M3LabError listing the known ones."""
    if name not in BY_NAME:
        raise M3LabError(f"unknown fix {name!r}", field="fix", hint="one of: " + ", ".join(BY_NAME))
    return BY_NAME[name]


def applied(fix: Fix, deployment) -> bool:
    """True when ``deployment`` already has the switch fix's settings (applying them changes nothing)."""
    if not fix.is_switch:
        raise ValueError(f"{fix.name} is vLLM's code, not a switch: it has no applied state in a Deployment")
    return deployment.with_settings(fix.settings).key() == deployment.key()


def table(fixes: tuple[Fix, ...] = FIXES) -> pd.DataFrame:
    """The fixes as rows: name, vLLM switch, ops relieved, the write-up's published figure with its configuration,
    the checklist steps that find and confirm each, m3lab's representation of the state before a code fix, and
    where vLLM has it."""
    rows = [{"fix": f.name, "vLLM switch": ", ".join(f"{k}={v}" for k, v in f.settings.items())
             or "none: vLLM 0.33.0's code", "relieves": ", ".join(f.ops),
             "write-up (published)": gains_text(f.name) if f.named else NOT_NAMED,
             "assumes": ", ".join(f"{k}={v}" for k, v in f.requires.items()),
             "found by": f"step {f.found_by} ({CHECKLIST[f.found_by]}): {f.found}",
             "confirmed by": f"step {f.confirm_step} ({CHECKLIST[f.confirm_step]}): {f.confirm}",
             "before (m3lab's representation)": f.before, "vLLM": f.vllm} for f in fixes]
    return pd.DataFrame(rows)
