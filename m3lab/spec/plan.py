"""Parallel plan (TP, EP, DP, prefill/decode role) and the local sizes it implies.

Rules as vLLM applies them:
- q heads per rank = heads_q / tp; KV heads per rank = max(1, heads_kv / tp): when tp > heads_kv each KV head is
  replicated on tp / heads_kv ranks.
- index q heads shard exactly like the KV heads (M3); DSA index q heads are replicated (vLLM's indexer uses
  replicated projections); the single index-key head is replicated on every rank.
- Gated DeltaNet (linear attention) key and value heads shard by TP (both must be divisible).
- M3 sparse layers project q, k, v, index q and index k with ONE fused GEMM (vLLM
  ``MinimaxM3QKVParallelLinearWithIndexer``, ``vllm/model_executor/layers/linear.py:1374-1445``): index q shards
  like the KV heads, or is replicated on every rank when vLLM runs the indexer context-parallel
  (``index_q_replicated``: ``replicate_index_q``, ``vllm/models/minimax_m3/amd/model.py:681-698``; asking for it
  with ``minimax_m3_indexer_cp`` is ``indexer_cp``, and vLLM turns it on only when its MSA-CP gate passes).
- MoE: with ep == 1 every rank holds all experts at inter / tp (TP-MoE); with ep > 1 each rank holds
  experts / ep whole experts. The shared expert is a TP-sharded MergedColumnParallelLinear (shared_inter / tp)
  whatever the EP degree (``amd/model.py:286-300``). Shared-expert fusion (the shared expert as an extra row of
  the routed grouped GEMM) is asked for with ``VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS``; whether vLLM fuses
  is vLLM's decision (``MiniMaxM3MoE.__init__``), taken by the fast-path resolver.
- Embedding and LM head are vocab-parallel: ceil(vocab padded to 64 / tp) rows per rank.

:class:`ParallelPlan` holds the inputs (what the launch line asks for). :class:`EffectivePlan` is the plan as vLLM
runs it: the inputs plus vLLM's answers that change local sizes (index q replicated, shared expert fused), from
``m3lab.vllm.fastpaths.effective_plan`` (or a Dispatch, :mod:`m3lab.optable.dispatch`). Without those answers a
plan's sizes are what was asked: nothing replicated, the shared expert fused when asked and its slice per rank
is a routed expert's.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from m3lab.arith import ceil_div
from m3lab.errors import M3LabError
from m3lab.spec.model import ModelSpec

ROLES = ("both", "prefill", "decode")
VOCAB_PAD = 64  # vLLM pads the vocabulary to a multiple of 64 before sharding


@dataclass(frozen=True)
class ParallelPlan:
    """How one model replica is split: ``tp`` x ``dp`` GPUs, experts over ``ep`` of them."""

    tp: int = 1
    ep: int = 1
    dp: int = 1
    role: str = "both"
    fused_shared_expert: bool = False  # asked for (VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS); see fuses_shared
    indexer_cp: bool = False           # asked for: --attention-config minimax_m3_indexer_cp
    # vLLM's answer, not an input (a class attribute, not a field): only an EffectivePlan replicates index q
    index_q_replicated = False

    @property
    def world(self) -> int:
        return self.tp * self.dp

    def validate(self, model: ModelSpec) -> ParallelPlan:
        """Raise M3LabError naming the field if this plan cannot serve ``model``; return self."""
        for name in ("tp", "ep", "dp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise M3LabError(f"{name} must be a positive integer, got {v!r}", field=name)
        if self.role not in ROLES:
            raise M3LabError(f"role {self.role!r} is not one of {', '.join(ROLES)}", field="role")
        tp = self.tp
        if model.heads_q % tp:
            raise M3LabError(f"tp {tp} must divide the {model.heads_q} query heads of {model.name}", field="tp",
                             hint="use a power of two such as 1, 2, 4, 8")
        if model.mla is None:
            kv = model.heads_kv
            if (tp <= kv and kv % tp) or (tp > kv and tp % kv):
                raise M3LabError(f"tp {tp} and the {kv} KV heads must divide one another", field="tp")
        lin = model.linear
        if lin is not None and (lin.key_heads % tp or lin.value_heads % tp):
            raise M3LabError(f"tp {tp} must divide the {lin.key_heads} linear-attention key heads and "
                             f"{lin.value_heads} value heads of {model.name}", field="tp")
        for label, width in (("dense_inter", model.dense_inter), ("shared_inter", model.shared_inter)):
            if width and width % tp:
                raise M3LabError(f"tp {tp} must divide {label} {width}", field="tp")
        if model.is_moe:
            if model.experts % self.ep:
                raise M3LabError(f"ep {self.ep} must divide the {model.experts} routed experts", field="ep")
            if self.ep == 1 and model.expert_inter % tp:
                raise M3LabError(f"tp {tp} must divide the expert intermediate size {model.expert_inter}", field="tp")
        elif self.ep > 1:
            raise M3LabError(f"ep {self.ep} needs a MoE model; {model.name} is dense", field="ep")
        if self.ep > 1 and self.world % self.ep:
            raise M3LabError(f"ep {self.ep} must divide the tp x dp = {self.world} GPUs", field="ep")
        return self

    # ---- attention ---------------------------------------------------------------------------------
    def heads_q_local(self, model: ModelSpec) -> int:
        return model.heads_q // self.tp

    def heads_kv_local(self, model: ModelSpec) -> int:
        """KV heads held per rank (at least one: replicated when tp > heads_kv)."""
        return max(1, model.heads_kv // self.tp)

    def kv_replication(self, model: ModelSpec) -> int:
        """Ranks holding a copy of each KV head (1 unless tp > heads_kv)."""
        return max(1, self.tp // model.heads_kv)

    def index_heads_local(self, model: ModelSpec) -> int:
        """Index q heads per rank: sharded exactly like the KV heads (M3); all of them for DSA and when vLLM
        runs the M3 indexer context-parallel (``index_q_replicated``).

        Asking for indexer CP (``indexer_cp``) does not replicate anything by itself: vLLM replicates index q
        only when ``msa_indexer_cp_enabled`` holds (the MSA indexer runs and its CP gate passes,
        ``vllm/models/minimax_m3/amd/indexer_msa.py``). That is vLLM's decision, taken by the fast-path
        resolver (``m3lab.vllm.fastpaths.effective_plan`` gives the :class:`EffectivePlan` with it set).
        """
        if model.sparse is not None and (model.sparse.index_q_replicated or self.index_q_replicated):
            return model.index_heads
        return max(1, model.index_heads // self.tp)

    def qkv_widths(self, model: ModelSpec, sparse: bool) -> tuple[int, ...]:
        """Output columns per rank of the fused projection: (q, k, v) on dense layers, (q, k, v, index q,
        index k) on M3 sparse layers (one GEMM, one weight format; the index key is replicated).
        M3 at TP4: (2048, 128, 128, 128, 128) = 2560 columns; TP1: 9856."""
        hd, kv = model.head_dim, self.heads_kv_local(model)
        qkv = (self.heads_q_local(model) * hd, kv * hd, kv * hd)
        if not sparse:
            return qkv
        d = model.sparse.index_dim
        return (*qkv, self.index_heads_local(model) * d, d)

    def dense_inter_local(self, model: ModelSpec) -> int:
        """Dense-MLP intermediate width per rank (column-parallel over tp)."""
        return model.dense_inter // self.tp

    def linear_heads_local(self, model: ModelSpec) -> tuple[int, int]:
        """Gated DeltaNet (key heads, value heads) per rank."""
        return model.linear.key_heads // self.tp, model.linear.value_heads // self.tp

    # ---- MoE ---------------------------------------------------------------------------------------
    def shared_fusion_reason(self, model: ModelSpec) -> str | None:
        """Why the shared expert is NOT fused into the routed grouped GEMM (None when it is), from the inputs and
        the layout alone: not asked for, no shared expert, or a shared expert whose slice per rank is not a routed
        expert's (it cannot be a row of the local expert table: the shared expert is TP-sharded, routed experts
        are whole under EP). Whether vLLM fuses what was asked and fits is vLLM's decision
        (``MiniMaxM3MoE.__init__``; the NVIDIA model has no fusion): :class:`EffectivePlan` carries it."""
        if not self.fused_shared_expert:
            return "not asked for (VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=0, vLLM's default)"
        if model.n_shared <= 0 or model.expert_inter <= 0:
            return f"{model.name} has no shared expert"
        if model.shared_inter != model.n_shared * model.expert_inter:
            return (f"shared expert width {model.shared_inter} is not n_shared x expert width "
                    f"{model.n_shared} x {model.expert_inter}")
        shared, routed = self.shared_inter_local(model) // model.n_shared, self.expert_inter_local(model)
        if shared != routed:
            return (f"the shared expert's slice per rank ({shared} wide, TP-sharded) is not a routed expert's "
                    f"({routed}, ep={self.ep}): it cannot be a row of the local expert table")
        return None

    def fuses_shared(self, model: ModelSpec) -> bool:
        """True when the shared expert(s) run as extra rows of the routed grouped GEMM (see
        :meth:`shared_fusion_reason`)."""
        return self.shared_fusion_reason(model) is None

    def experts_local(self, model: ModelSpec) -> int:
        """Routed experts held per rank."""
        return model.experts // self.ep

    def expert_rows_local(self, model: ModelSpec) -> int:
        """Rows of the local grouped GEMM: local routed experts (+ n_shared when fused)."""
        return self.experts_local(model) + (model.n_shared if self.fuses_shared(model) else 0)

    def expert_inter_local(self, model: ModelSpec) -> int:
        """Expert intermediate width per rank: inter / tp under TP-MoE, whole under EP."""
        return model.expert_inter if self.ep > 1 else model.expert_inter // self.tp

    def shared_inter_local(self, model: ModelSpec) -> int:
        """Shared-expert width per rank: column-parallel over tp, under EP as well (``amd/model.py:286-300``)."""
        return model.shared_inter // self.tp

    # ---- vocabulary --------------------------------------------------------------------------------
    def vocab_local(self, model: ModelSpec) -> int:
        return ceil_div(ceil_div(model.vocab, VOCAB_PAD) * VOCAB_PAD, self.tp)

    def describe(self) -> dict:
        return {"tp": self.tp, "ep": self.ep, "dp": self.dp, "role": self.role,
                "fused_shared_expert": self.fused_shared_expert, "indexer_cp": self.indexer_cp}

    def as_run(self, *, index_q_replicated: bool, shared_expert_fused: bool, fusion_off: str = "") -> EffectivePlan:
        """This plan with vLLM's answers (see :class:`EffectivePlan`)."""
        inputs = {f.name: getattr(self, f.name) for f in dataclasses.fields(ParallelPlan)}
        return EffectivePlan(**inputs, index_q_replicated=index_q_replicated,
                             shared_expert_fused=shared_expert_fused, fusion_off=fusion_off)


@dataclass(frozen=True)
class EffectivePlan(ParallelPlan):
    """A plan as vLLM runs it: the inputs plus vLLM's answers that change local sizes, taken by vLLM's own code
    (``m3lab.vllm.fastpaths.effective_plan``; the OpTable reads them off its Dispatch). Not a record field: a
    Deployment holds the inputs, and this is derived from them.

    ``index_q_replicated``: vLLM runs the M3 indexer context-parallel (``msa_indexer_cp_enabled``), so every
    rank projects all index q heads; ``shared_expert_fused``: vLLM built the shared expert into the routed experts
    (``MiniMaxM3MoE.is_fused_shared_expert_enabled``); ``fusion_off``: vLLM's reason when asked and not fused."""

    index_q_replicated: bool = False
    shared_expert_fused: bool = False
    fusion_off: str = ""

    def shared_fusion_reason(self, model: ModelSpec) -> str | None:
        """vLLM's answer: None when it fused the shared expert, else why not (not asked, or vLLM's reason)."""
        if self.shared_expert_fused:
            return None
        if not self.fused_shared_expert:
            return super().shared_fusion_reason(model)
        return self.fusion_off or "asked for; vLLM does not fuse it for this deployment"

    def describe(self) -> dict:
        return {**super().describe(), "index_q_replicated": self.index_q_replicated,
                "shared_expert_fused": self.shared_expert_fused}


def as_plan(plan: Any) -> ParallelPlan:
    """A ParallelPlan from a ParallelPlan, a dict of its fields, or None (its defaults: one GPU, shared expert
    not fused)."""
    if plan is None:
        return ParallelPlan()
    if isinstance(plan, dict):
        known = {f.name for f in dataclasses.fields(ParallelPlan)}
        unknown = sorted(set(plan) - known)
        if unknown:
            raise M3LabError(f"unknown plan field {unknown[0]!r}", field=unknown[0],
                             hint=f"one of {', '.join(sorted(known))}")
        return ParallelPlan(**plan)
    return plan
