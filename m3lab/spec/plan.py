"""Parallel plan (TP, EP, DP, prefill/decode role) and the local sizes it implies (reference §3).

Rules as vLLM applies them:
- q heads per rank = heads_q / tp; KV heads per rank = max(1, heads_kv / tp): when tp > heads_kv each KV head is
  replicated on tp / heads_kv ranks.
- index q heads shard exactly like the KV heads (M3); DSA index q heads are replicated (vLLM's indexer uses
  replicated projections); the single index-key head is replicated on every rank.
- Gated DeltaNet (linear attention) key and value heads shard by TP (both must be divisible).
- MoE: with ep == 1 every rank holds all experts at inter / tp (TP-MoE); with ep > 1 each rank holds
  experts / ep whole experts. A fused shared expert adds ``n_shared`` rows to the grouped GEMM on every rank.
- Embedding and LM head are vocab-parallel: ceil(vocab padded to 64 / tp) rows per rank.
"""
from __future__ import annotations

from dataclasses import dataclass

from m3lab.errors import M3LabError
from m3lab.spec.model import ModelSpec

ROLES = ("both", "prefill", "decode")
VOCAB_PAD = 64  # vLLM pads the vocabulary to a multiple of 64 before sharding


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ParallelPlan:
    """How one model replica is split: ``tp`` x ``dp`` GPUs, experts over ``ep`` of them."""

    tp: int = 1
    ep: int = 1
    dp: int = 1
    role: str = "both"
    fused_shared_expert: bool = True

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
        """Index q heads per rank: sharded exactly like the KV heads (M3); all of them for DSA (replicated)."""
        if model.sparse is not None and model.sparse.index_q_replicated:
            return model.index_heads
        return max(1, model.index_heads // self.tp)

    def linear_heads_local(self, model: ModelSpec) -> tuple[int, int]:
        """Gated DeltaNet (key heads, value heads) per rank."""
        return model.linear.key_heads // self.tp, model.linear.value_heads // self.tp

    # ---- MoE ---------------------------------------------------------------------------------------
    def fuses_shared(self, model: ModelSpec) -> bool:
        """True when the shared expert(s) run as extra rows of the routed grouped GEMM."""
        return (self.fused_shared_expert and model.n_shared > 0 and model.expert_inter > 0
                and model.shared_inter == model.n_shared * model.expert_inter)

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
        """Shared-expert width per rank (replicated whole under EP, column-parallel otherwise)."""
        return model.shared_inter if self.ep > 1 else model.shared_inter // self.tp

    # ---- vocabulary --------------------------------------------------------------------------------
    def vocab_local(self, model: ModelSpec) -> int:
        return _ceil_div(_ceil_div(model.vocab, VOCAB_PAD) * VOCAB_PAD, self.tp)

    def describe(self) -> dict:
        return {"tp": self.tp, "ep": self.ep, "dp": self.dp, "role": self.role,
                "fused_shared_expert": self.fused_shared_expert}


def as_plan(plan) -> ParallelPlan:
    """A ParallelPlan from a ParallelPlan, a dict of its fields, or None (its defaults)."""
    if plan is None:
        return ParallelPlan()
    if isinstance(plan, dict):
        return ParallelPlan(**plan)
    return plan
