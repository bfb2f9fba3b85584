"""What vLLM runs for each op of a step, as plain data: the OpTable's ``decision``, ``path`` and ``kernel`` columns.

A :class:`Dispatch` holds the fast-path resolver's answer (``m3lab.vllm.fastpaths.resolve``) for one deployment,
per phase (``decode``, ``prefill``) and per (resolver op, layer kind): the short path id, the kernels it launches
and the status. :mod:`m3lab.serving.dispatch` builds it (it calls the resolver, once per deployment); this module
only reads it, so the OpTable stays below the resolver in the import graph.

Given a Dispatch, :func:`~m3lab.optable.build_optable` follows vLLM's structure rather than the spec's defaults:
shared-expert fusion and the local widths (vLLM's answers in the resolver's effective plan: :meth:`Dispatch.plan`),
index sharing (the resolver has ``sparse_reuse`` layers), the page-table builder (its ``page_table`` decision
runs), the routing top-k kernel, and, in a step with decodes and prefill chunks, separate attention / indexer
rows per phase (vLLM launches the decode and the prefill kernels separately). :data:`OP_DECISION` maps each OpTable op to the resolver op whose
decision picks its kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from m3lab.errors import M3LabError
from m3lab.spec.plan import EffectivePlan, ParallelPlan
from m3lab.spec.record_key import stable_key

PHASES = ("decode", "prefill")
RUNS = "runs"

# OpTable op -> the resolver op whose decision picks the kernel that runs it (m3lab.vllm.fastpaths op names)
OP_DECISION: Mapping[str, str] = {
    "input_norm": "norm", "final_norm": "norm",
    "qkv_proj_quant": "qkv_proj", "qkv_proj": "qkv_proj",
    "qk_norm": "qk_norm_rope_insert", "rope": "qk_norm_rope_insert", "cache_write": "qk_norm_rope_insert",
    "indexer": "indexer", "topk": "indexer", "page_table": "page_table", "attention": "attention",
    "o_proj_quant": "o_proj", "o_proj": "o_proj",
    "allreduce_embed": "allreduce_norm", "allreduce_attn": "allreduce_norm", "post_attn_norm": "allreduce_norm",
    "allreduce_ffn": "allreduce_norm",
    "gate_up_proj_quant": "gate_up_proj", "gate_up_proj": "gate_up_proj", "act": "activation",
    "down_proj_quant": "down_proj", "down_proj": "down_proj",
    "router": "router", "routing": "routing",
    "moe_align": "experts", "moe_gate_up_quant": "experts", "moe_gate_up": "experts", "moe_act": "experts",
    "moe_down_quant": "experts", "moe_down": "experts", "moe_sum": "experts",
    "moe_gate_up_dequant": "experts", "moe_down_dequant": "experts",
    "shared_gate_up_quant": "shared_gate_up", "shared_gate_up": "shared_gate_up", "shared_act": "activation",
    "shared_down_quant": "shared_down", "shared_down": "shared_down",
    "lm_head": "lm_head",
}
# OpTable ops that run in every phase's kernel set: they take the decision of the step's phase (decode when the
# step has no prefill chunk, prefill otherwise: the GEMM tile, router tier and all-reduce size follow the tokens)
PHASED_OPS = frozenset({"indexer", "topk", "page_table", "attention"})


@dataclass(frozen=True)
class PathChoice:
    """One decision of the resolver: the path id, its kernels, the status (runs / off / refused / skipped)."""

    op: str
    layer_kind: str
    path: str
    kernels: tuple[str, ...] = ()
    status: str = RUNS
    decision: str = ""
    note: str = ""

    @property
    def runs(self) -> bool:
        return self.status == RUNS


@dataclass(frozen=True)
class Dispatch:
    """The resolver's decisions for one deployment, per phase: ``choices[phase][(op, layer_kind)]``.

    ``tokens[phase]``: the step size each phase was resolved at (decode: requests x rows per request)."""

    hardware: str
    choices: Mapping[str, Mapping[tuple[str, str], PathChoice]]
    tokens: Mapping[str, int] = field(default_factory=dict)
    # vLLM's answers that change local sizes (the resolver's effective plan, m3lab.vllm.fastpaths.effective_plan)
    index_q_replicated: bool = False
    shared_expert_fused: bool = False
    fusion_off: str = ""

    def choice(self, op: str, layer_kind: str, phase: str) -> PathChoice | None:
        """The decision for resolver ``op`` on ``layer_kind`` in ``phase`` (the model-level row as fallback;
        None when the resolver has no decision for the op there, i.e. it does not run)."""
        table = self.choices[phase]
        return table.get((op, layer_kind)) or table.get((op, "model"))

    def runs(self, op: str, layer_kind: str, phase: str) -> bool:
        c = self.choice(op, layer_kind, phase)
        return c is not None and c.runs

    @property
    def index_sharing(self) -> bool:
        """True when vLLM runs index-sharing reuse layers (the resolver resolved a ``sparse_reuse`` kind)."""
        return any(kind == "sparse_reuse" for _, kind in self.choices["decode"])

    @property
    def fused_shared_expert(self) -> bool:
        """True when vLLM fused the shared expert into the routed experts (no separate shared-expert MLP)."""
        return self.shared_expert_fused

    def plan(self, plan: ParallelPlan) -> EffectivePlan:
        """``plan`` as vLLM runs it for this deployment: with vLLM's answers on index-q replication and
        shared-expert fusion, so its local widths are the ones vLLM's model holds."""
        return plan.as_run(index_q_replicated=self.index_q_replicated, shared_expert_fused=self.shared_expert_fused,
                           fusion_off=self.fusion_off)

    def key(self) -> str:
        """Stable hash of every decision (what vLLM runs), for caches of anything built from it."""
        return stable_key(self)

    def refused(self) -> list[PathChoice]:
        """Decisions vLLM refuses at start-up (the deployment does not serve)."""
        return [c for table in self.choices.values() for c in table.values() if c.status == "refused"]

    def check_serves(self) -> None:
        """Raise M3LabError naming the first refusal (vLLM would not start this deployment)."""
        bad = self.refused()
        if bad:
            raise M3LabError(f"vLLM refuses this deployment: {bad[0].op}: {bad[0].note}", field=bad[0].op,
                             hint="see `m3lab fastpaths` for the conditions; change the setting it names")


def layer_kind(attn: str, sparse_attn: str, computes_topk: bool) -> str:
    """The resolver's layer kind of an OpTable layer class: dense, sparse (computes its top-k) or sparse_reuse."""
    if attn != sparse_attn:
        return "dense"
    return "sparse" if computes_topk else "sparse_reuse"
