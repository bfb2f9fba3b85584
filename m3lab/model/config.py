"""Model config of the reference decoder, adapted from ``m3lab.spec.model.ModelSpec``.

:class:`M3Config` holds the global (unsharded) architecture; :class:`LocalDims` the per-rank widths
for a plan (reference §3): q heads / tp, KV and index heads max(1, n / tp) (replicated beyond),
index k replicated, dense/shared inter / tp, experts: TP-MoE (all experts, inter / tp) or EP
(experts / ep, whole inter).
"""
from dataclasses import dataclass, field, replace
from typing import Any

from m3lab.errors import M3LabError

VOCAB_PAD = 64  # vLLM pads the vocabulary to a multiple of 64 before vocab-parallel sharding


@dataclass(frozen=True)
class M3Config:
    """Global architecture (defaults: MiniMax M3, reference §1)."""

    name: str = "minimax-m3"
    hidden: int = 6144
    layers: int = 60
    heads_q: int = 64
    heads_kv: int = 4
    head_dim: int = 128
    vocab: int = 200064
    dense_inter: int = 12288
    expert_inter: int = 3072
    shared_inter: int = 3072
    experts: int = 128
    topk: int = 4
    n_shared: int = 1
    attn_kinds: tuple[str, ...] = ("dense",) * 3 + ("sparse",) * 57  # per layer: dense | sparse
    mlp_kinds: tuple[str, ...] = ("dense",) * 3 + ("moe",) * 57  # per layer: dense | moe
    index_heads: int = 4
    index_dim: int = 128
    block_size: int = 128
    topk_blocks: int = 16
    local_blocks: int = 1
    init_blocks: int = 0
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 0
    index_topk_pattern: tuple[str, ...] | None = None  # per sparse ordinal; "S" marks a reuser
    rope_theta: float = 5e6
    rotary_dim: int = 64
    eps: float = 1e-6
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    routed_scaling: float = 2.0

    def __post_init__(self):
        if len(self.attn_kinds) != self.layers or len(self.mlp_kinds) != self.layers:
            raise M3LabError(f"attn_kinds/mlp_kinds need {self.layers} entries (one per layer)",
                             field="attn_kinds")
        if self.heads_q % self.heads_kv:
            raise M3LabError(f"heads_q={self.heads_q} must be a multiple of heads_kv={self.heads_kv}",
                             field="heads_q")
        if self.rotary_dim > self.head_dim or self.rotary_dim % 2:
            raise M3LabError(f"rotary_dim={self.rotary_dim} must be even and <= head_dim", field="rotary_dim")

    @classmethod
    def mini(cls, **overrides: Any) -> "M3Config":
        """The reduced same-structure M3 of ``m3lab.spec`` (16-token blocks, top-4) for CPU tests."""
        from m3lab.spec.model import ModelSpec
        return from_spec(ModelSpec.mini(), **overrides)

    def with_layers(self, n: int) -> "M3Config":
        """The first ``n`` layers only (e.g. a GPU run at full width over a few layers)."""
        return replace(self, layers=n, attn_kinds=self.attn_kinds[:n], mlp_kinds=self.mlp_kinds[:n])

    def sparse_ordinal(self, layer: int) -> int:
        """Index k of a sparse layer among the sparse layers (k = 0 for the first)."""
        return sum(1 for a in self.attn_kinds[:layer] if a == "sparse")

    def computes_topk(self, layer: int) -> bool:
        """Index sharing (reference §5): sparse ordinal k computes its own top-k iff max(k - offset, 0) % freq == 0."""
        k = self.sparse_ordinal(layer)
        if self.index_topk_pattern is not None:
            return not (k < len(self.index_topk_pattern) and self.index_topk_pattern[k] == "S")
        return max(k - self.index_skip_topk_offset, 0) % max(self.index_topk_freq, 1) == 0


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    """First attribute (or nested ``sparse.``/``rope.`` attribute, or dict key) that exists."""
    for name in names:
        cur = obj
        for part in name.split("."):
            if isinstance(cur, dict):
                cur = cur.get(part, None)
            else:
                try:
                    cur = getattr(cur, part, None)
                except M3LabError:  # ModelSpec's sparse properties raise on models without sparse attention
                    cur = None
            if cur is None:
                break
        if cur is not None:
            return cur
    return default


def _kinds(spec: Any, n: int, names: tuple[str, ...], on: str, off: str, on_values: tuple) -> tuple[str, ...]:
    raw = _get(spec, *names)
    if raw is None:
        return tuple([off] * n)
    return tuple(on if (v in on_values or v is True or v == 1) else off for v in list(raw)[:n])


def from_spec(spec: Any, **overrides: Any) -> M3Config:
    """Adapt a ``ModelSpec`` (or any object/dict with its field names) into an :class:`M3Config`."""
    d = M3Config()
    n = int(_get(spec, "layers", default=d.layers))
    vals = dict(
        name=str(_get(spec, "name", default=d.name)), hidden=_get(spec, "hidden", default=d.hidden), layers=n,
        heads_q=_get(spec, "heads_q"), heads_kv=_get(spec, "heads_kv"), head_dim=_get(spec, "head_dim"),
        vocab=_get(spec, "vocab"), dense_inter=_get(spec, "dense_inter"),
        expert_inter=_get(spec, "expert_inter"), shared_inter=_get(spec, "shared_inter"),
        experts=_get(spec, "experts"), topk=_get(spec, "topk"), n_shared=_get(spec, "n_shared"),
        attn_kinds=_kinds(spec, n, ("attn_types", "attn_kinds"), "sparse",
                          "dense", ("sparse", "minimax_m3_sparse")),
        mlp_kinds=_kinds(spec, n, ("mlp_types", "mlp_kinds"), "moe", "dense",
                         ("moe", "sparse")),
        index_heads=_get(spec, "sparse.index_heads", "index_heads"),
        index_dim=_get(spec, "sparse.index_dim", "index_dim"),
        block_size=_get(spec, "sparse.block_size", "block_size"),
        topk_blocks=_get(spec, "sparse.topk_blocks", "topk_blocks"),
        local_blocks=_get(spec, "sparse.local_blocks", "local_blocks"),
        init_blocks=_get(spec, "sparse.init_blocks", "init_blocks"),
        index_topk_freq=_get(spec, "sparse.index_topk_freq", "index_topk_freq"),
        index_skip_topk_offset=_get(spec, "sparse.index_skip_topk_offset", "index_skip_topk_offset"),
        index_topk_pattern=_get(spec, "sparse.index_topk_pattern", "index_topk_pattern"),
        rope_theta=_get(spec, "rope_theta", "rope.theta"), rotary_dim=_get(spec, "rotary_dim", "rope.rotary_dim"),
        eps=_get(spec, "norm_eps", "eps", "rms_norm_eps"), swiglu_alpha=_get(spec, "swiglu_alpha"),
        swiglu_limit=_get(spec, "swiglu_limit"), routed_scaling=_get(spec, "routed_scaling"),
    )
    vals = {k: v for k, v in vals.items() if v is not None}
    vals.update(overrides)
    return M3Config(**vals)


def as_plan(plan: Any):
    """A ParallelPlan from a ParallelPlan, a dict of its fields, or None (its defaults: TP1, shared expert fused)."""
    from m3lab.spec.plan import ParallelPlan
    if plan is None:
        return ParallelPlan()
    if isinstance(plan, dict):
        return ParallelPlan(**plan)
    return plan


@dataclass(frozen=True)
class LocalDims:
    """Per-rank widths of a config under a plan (tp, ep)."""

    cfg: M3Config
    tp: int = 1
    ep: int = 1
    fused_shared_expert: bool = False
    q_heads: int = field(init=False)
    kv_heads: int = field(init=False)
    index_heads: int = field(init=False)
    dense_inter: int = field(init=False)
    shared_inter: int = field(init=False)
    expert_inter: int = field(init=False)
    experts: int = field(init=False)
    vocab: int = field(init=False)

    def __post_init__(self):
        c, tp, ep = self.cfg, self.tp, self.ep
        for what, total in (("heads_q", c.heads_q), ("dense_inter", c.dense_inter), ("shared_inter", c.shared_inter)):
            if total % tp:
                raise M3LabError(f"{what}={total} is not divisible by tp={tp}", field="tp")
        if c.experts % ep:
            raise M3LabError(f"experts={c.experts} is not divisible by ep={ep}", field="ep")
        set_ = object.__setattr__
        if self.fused_shared_expert and c.shared_inter != c.n_shared * c.expert_inter:
            set_(self, "fused_shared_expert", False)  # only an expert-sized shared MLP joins the table
        set_(self, "q_heads", c.heads_q // tp)
        set_(self, "kv_heads", max(1, c.heads_kv // tp))
        set_(self, "index_heads", max(1, c.index_heads // tp))
        set_(self, "dense_inter", c.dense_inter // tp)
        set_(self, "shared_inter", c.shared_inter if ep > 1 else c.shared_inter // tp)
        set_(self, "expert_inter", c.expert_inter // tp if ep == 1 else c.expert_inter)
        set_(self, "experts", c.experts // ep)
        set_(self, "vocab", -(-(-(-c.vocab // VOCAB_PAD) * VOCAB_PAD) // tp))

    @classmethod
    def from_plan(cls, cfg: M3Config, plan: Any = None) -> "LocalDims":
        """From a ParallelPlan, a dict of its fields, or None (ParallelPlan's defaults)."""
        plan = as_plan(plan)
        return cls(cfg, tp=plan.tp, ep=plan.ep, fused_shared_expert=plan.fused_shared_expert)

    @property
    def qkv_widths(self) -> tuple[int, int, int, int, int]:
        """Columns of the fused projection: q, k, v, index q, index k (sparse layers)."""
        c = self.cfg
        return (self.q_heads * c.head_dim, self.kv_heads * c.head_dim, self.kv_heads * c.head_dim,
                self.index_heads * c.index_dim, c.index_dim)

    @property
    def table_experts(self) -> int:
        """Rows of the expert table: local routed experts (+1 when the shared expert is fused)."""
        return self.experts + (1 if self.fused_shared_expert else 0)
