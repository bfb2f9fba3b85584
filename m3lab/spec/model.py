"""Model architecture as data: :class:`ModelSpec`, loaded from a Hugging Face ``config.json``.

Supported families (by ``model_type``): MiniMax M3 (``minimax_m3_vl`` with a nested ``text_config`` and
``sparse_attention_config``, or the flat transformers>=5 names ``index_n_heads``, ``layer_types``,
``mlp_layer_types``, ...), MiniMax M2 (``minimax_m2``), Llama-style dense models (``llama``, ``mistral``,
``qwen2``, ``qwen3``), Mixtral, Qwen2/3-MoE and DeepSeek-V2/V3 (MLA attention, shared experts,
``first_k_dense_replace``), Qwen3.5 MoE (``qwen3_5_moe``: Gated DeltaNet linear attention
with a full gated-attention layer every 4th, :class:`LinearAttnConfig`) and GLM-5.x (``glm_moe_dsa``: MLA plus
DeepSeek sparse attention, a token-level :class:`SparseConfig` with ``style="dsa"``). Named configs ship
in ``m3lab/spec/configs`` (``index.yaml`` says where each came from). Anything malformed raises
:class:`m3lab.errors.M3LabError` naming the field.
"""
# long: ModelSpec and the readers of every config family it accepts, each beside the fields it fills
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from m3lab.errors import M3LabError
from m3lab.spec.vllm_config import cached_vllm_reads
from m3lab.vllm_src import install

CONFIG_DIR = Path(__file__).with_name("configs")
ATTN_DENSE, ATTN_SPARSE, ATTN_LINEAR = "dense", "sparse", "linear"
MLP_DENSE, MLP_MOE = "dense", "moe"
# M3 index sharing: vLLM on ROCm reads these from text_config only and rejects them at the top level of the VL
# config (MiniMaxM3SparseForConditionalGenerationConfig.INDEX_CACHE_KEYS, vllm/model_executor/models/config.py:790-808).
_INDEX_SHARING_KEYS = ("use_index_cache", "index_topk_freq", "index_skip_topk_offset")
# vLLM's MiniMaxM3TextConfig defaults where the checkpoint omits a key (vllm/transformers_utils/configs/minimax_m3.py).
M3_MAX_POSITION_DEFAULT = 524288
M3_MTP_MODULES_DEFAULT = 1
M3_SWIGLU_BETA_DEFAULT = 1.0


@dataclass(frozen=True)
class SparseConfig:
    """MiniMax-M3-style block-sparse attention with a lightning indexer (vLLM ``vllm/models/minimax_m3/common/``)."""

    index_heads: int          # index query heads (== KV heads for M3); the index key is one head
    index_dim: int            # index head dim
    block_size: int           # tokens per KV block (= one selectable block)
    topk_blocks: int          # blocks kept per (query token, KV head)
    local_blocks: int = 1     # forced most-recent blocks (the query's own block)
    init_blocks: int = 0      # forced first blocks
    index_topk_freq: int = 1  # 1: every sparse layer computes its own top-k
    index_skip_topk_offset: int = 0
    index_topk_pattern: tuple[str, ...] | None = None  # DSA (GLM indexer_types) per sparse ordinal; "S" reuses
    index_value: bool = False  # sparse_disable_index_value == 0: index branch has v/o projections
    style: str = "block"       # "block": M3 block top-k; "dsa": DeepSeek sparse attention (token top-k, MLA)
    index_q_replicated: bool = False  # DSA: every TP rank computes all index q heads (replicated projections)


@dataclass(frozen=True)
class LinearAttnConfig:
    """Gated DeltaNet linear attention (Qwen3-Next / Qwen3.5): a fixed-size recurrent state per request.

    Per layer and request: the delta-rule state [value_heads, key_dim, value_dim] in ``state_dtype`` plus the
    causal-conv state [conv_kernel - 1, conv_dim] (bf16), conv_dim = 2 * key_heads * key_dim + value_heads *
    value_dim (q, k, v channels). Key heads are shared by value_heads / key_heads value heads.
    """

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int
    state_dtype: str = "fp32"

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim


@dataclass(frozen=True)
class MLAConfig:
    """DeepSeek multi-head latent attention sizes."""

    q_lora_rank: int          # 0: plain q projection
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


def _layers(types: tuple[str, ...], kind: str, keep: bool = True) -> tuple[int, ...]:
    """Indices of the layers whose type is ``kind`` (``keep=False``: whose type is not)."""
    return tuple(i for i, t in enumerate(types) if (t == kind) == keep)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (the text backbone) as plain numbers.

    Per-layer kinds: ``attn_types[i]`` in {"dense", "sparse"}, ``mlp_types[i]`` in {"dense", "moe"}.
    ``shared_inter`` is the total shared-expert width (intermediate x n_shared).
    """

    name: str
    family: str
    hidden: int
    layers: int
    heads_q: int
    heads_kv: int
    head_dim: int
    vocab: int
    attn_types: tuple[str, ...]
    mlp_types: tuple[str, ...]
    dense_inter: int = 0
    expert_inter: int = 0
    shared_inter: int = 0
    experts: int = 0
    topk: int = 0
    n_shared: int = 0
    sparse: SparseConfig | None = None
    mla: MLAConfig | None = None
    linear: LinearAttnConfig | None = None
    attn_output_gate: bool = False   # q_proj also emits a per-channel sigmoid gate on the attention output
    rope_theta: float = 10000.0
    rotary_dim: int = 0
    norm_eps: float = 1e-6
    act: str = "silu"
    swiglu_alpha: float | None = None
    swiglu_limit: float | None = None
    swiglu_beta: float | None = None     # SwiGLU-OAI: gate * sigmoid(alpha * gate) * (up + beta)
    routed_scaling: float = 1.0
    scoring: str = "softmax"
    router_dtype: str = "bf16"
    router_bias: bool = False
    qk_norm: str = ""          # "" (none), "per_head" (one [head_dim] weight) or "per_layer" ([heads*head_dim])
    tie_embeddings: bool = False
    max_position: int = 0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # e.g. YaRN, as sorted (key, value) pairs
    mtp_modules: int = 0       # multi-token-prediction modules (M3: num_mtp_modules; vLLM's default is 1)
    source: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    # ---- layer sets (indices of the layers of one kind) ------------------------------------------------
    sparse_layers = property(lambda self: _layers(self.attn_types, ATTN_SPARSE))
    dense_attn_layers = property(lambda self: _layers(self.attn_types, ATTN_DENSE))
    linear_layers = property(lambda self: _layers(self.attn_types, ATTN_LINEAR))
    kv_layers = property(lambda self: _layers(self.attn_types, ATTN_LINEAR, keep=False),
                         doc="Layers with a per-token KV cache (all but linear-attention layers).")
    moe_layers = property(lambda self: _layers(self.mlp_types, MLP_MOE))
    dense_mlp_layers = property(lambda self: _layers(self.mlp_types, MLP_DENSE))

    @property
    def rope_scaling_dict(self) -> dict | None:
        """``rope_scaling`` as the config's dict (None when the config has none)."""
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    def computes_topk(self, layer: int) -> bool:
        """True for a sparse layer that runs its own indexer and top-k (False: it reuses another layer's)."""
        return self.topk_source().get(layer) == layer

    @property
    def topk_layers(self) -> tuple[int, ...]:
        """Sparse layers that run the indexer and top-k themselves (the others reuse: ``index_topk_freq``)."""
        return tuple(layer for layer, src in self.topk_source().items() if src == layer)

    def topk_source(self) -> dict[int, int]:
        """For each sparse layer, the layer whose top-k block selection it uses (itself if it computes)."""
        sp = self.sparse
        out: dict[int, int] = {}
        last = None
        for k, layer in enumerate(self.sparse_layers):
            if sp.index_topk_pattern is not None:
                reuse = k < len(sp.index_topk_pattern) and sp.index_topk_pattern[k] == "S"
            else:
                reuse = max(k - sp.index_skip_topk_offset, 0) % sp.index_topk_freq != 0
            if not reuse or last is None:
                last = layer
            out[layer] = last
        return out

    # ---- forwarded sparse fields (so ``model.block_size`` works as well as ``model.sparse.block_size``)
    def _sparse_field(self, name: str):
        if self.sparse is None:
            raise M3LabError(f"model {self.name!r} has no sparse attention, so no {name}", field=name)
        return getattr(self.sparse, name)

    index_heads = property(lambda self: self._sparse_field("index_heads"))
    index_dim = property(lambda self: self._sparse_field("index_dim"))
    block_size = property(lambda self: self._sparse_field("block_size"))
    topk_blocks = property(lambda self: self._sparse_field("topk_blocks"))
    local_blocks = property(lambda self: self._sparse_field("local_blocks"))
    init_blocks = property(lambda self: self._sparse_field("init_blocks"))
    index_topk_freq = property(lambda self: self._sparse_field("index_topk_freq"))
    index_skip_topk_offset = property(lambda self: self._sparse_field("index_skip_topk_offset"))

    @property
    def swiglu(self) -> dict[str, float]:
        """SwiGLU-OAI constants as keyword arguments of the kernels and references: alpha, limit, beta."""
        return {"alpha": self.swiglu_alpha, "limit": self.swiglu_limit, "beta": self.swiglu_beta}

    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and bool(self.moe_layers)

    @property
    def q_width(self) -> int:
        return self.heads_q * self.head_dim

    # ---- variants ---------------------------------------------------------------------------------
    def with_layers(self, n: int) -> ModelSpec:
        """The first ``n`` layers only (e.g. a GPU run at full width over a few layers)."""
        if not 1 <= int(n) <= self.layers:
            raise M3LabError(f"layers must be between 1 and {self.layers}, got {n}", field="layers")
        return dataclasses.replace(self, layers=int(n), attn_types=self.attn_types[:n], mlp_types=self.mlp_types[:n])

    def with_index_sharing(self, freq: int, offset: int = 0) -> ModelSpec:
        """The same model with vLLM's ``use_index_cache`` top-k reuse (``index_topk_freq``, offset)."""
        if self.sparse is None:
            raise M3LabError(f"model {self.name!r} has no sparse attention to share top-k in",
                             field="index_topk_freq")
        if int(freq) < 1:
            raise M3LabError(f"index_topk_freq must be >= 1, got {freq}", field="index_topk_freq")
        sp = dataclasses.replace(self.sparse, index_topk_freq=int(freq), index_skip_topk_offset=int(offset),
                                 index_topk_pattern=None)
        return dataclasses.replace(self, sparse=sp)

    @classmethod
    def from_hf_config(cls, config: dict, name: str | None = None, source: str = "") -> ModelSpec:
        """Parse a Hugging Face ``config.json`` dict (see the module docstring for the families)."""
        return parse_hf_config(config, name=name, source=source)

    @classmethod
    def mini(cls) -> ModelSpec:
        """Reduced same-structure MiniMax M3 for CPU tests: 1 dense + 3 sparse/MoE layers."""
        return parse_hf_config(MINI_M3_CONFIG, name="minimax-m3-mini",
                               source="m3lab: reduced MiniMax-M3 structure for CPU tests")


# A tiny M3 config in the checkpoint's own format (exercises the real parser).
MINI_M3_CONFIG: dict = {
    "model_type": "minimax_m3_vl",
    "text_config": {
        "hidden_size": 256, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "use_gemma_norm": True, "rope_theta": 5000000, "rotary_dim": 16,
        "hidden_act": "swigluoai", "use_qk_norm": True, "tie_word_embeddings": False,
        "dense_intermediate_size": 512, "shared_intermediate_size": 64, "num_local_experts": 8,
        "num_experts_per_tok": 2, "n_shared_experts": 1, "scoring_func": "sigmoid", "use_routing_bias": True,
        "moe_layer_freq": [0, 1, 1, 1], "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
        "routed_scaling_factor": 2.0,
        "sparse_attention_config": {
            "use_sparse_attention": True, "sparse_index_dim": 32, "sparse_num_index_heads": 2,
            "sparse_topk_blocks": 4, "sparse_block_size": 16, "sparse_disable_index_value": [0, 1, 1, 1],
            "sparse_score_type": "max", "sparse_init_block": 0, "sparse_local_block": 1,
            "sparse_attention_freq": [0, 1, 1, 1],
        },
    },
}


# ---- parsing helpers ---------------------------------------------------------------------------------
_MISSING = object()


def _get(cfg: dict, *names: str, default: Any = _MISSING, kind: type = int) -> Any:
    """First present key among ``names`` converted to ``kind``; error naming names[0] when missing/bad."""
    for n in names:
        if n in cfg and cfg[n] is not None:
            value = cfg[n]
            try:
                if kind is int:
                    if isinstance(value, bool) or float(value) != int(value):
                        raise ValueError
                    value = int(value)
                elif kind is float:
                    value = float(value)
                elif kind is bool:
                    value = bool(value)
            except (TypeError, ValueError):
                raise M3LabError(f"config field {n!r} must be {kind.__name__}, got {value!r}", field=n) from None
            if kind is int and value < 0:
                raise M3LabError(f"config field {n!r} must be >= 0, got {value}", field=n)
            return value
    if default is _MISSING:
        raise M3LabError(f"config field {names[0]!r} is missing", field=names[0],
                         hint="is this a Hugging Face config.json of a decoder model?")
    return default


def _positive(cfg: dict, *names: str) -> int:
    v = _get(cfg, *names)
    if v <= 0:
        raise M3LabError(f"config field {names[0]!r} must be > 0, got {v}", field=names[0])
    return v


def _per_layer(cfg: dict, key: str, layers: int, mapping: dict) -> tuple[str, ...] | None:
    """A per-layer list (0/1 flags or names) mapped to kinds; None if absent."""
    raw = cfg.get(key)
    if raw is None:
        return None
    if not isinstance(raw, (list, tuple)) or len(raw) != layers:
        raise M3LabError(f"config field {key!r} must be a list of {layers} entries (num_hidden_layers)",
                         field=key)
    try:
        return tuple(mapping[v] for v in raw)
    except (KeyError, TypeError):
        bad = next(v for v in raw if v not in mapping)
        raise M3LabError(f"config field {key!r} has unknown entry {bad!r} (allowed: {sorted(map(str, mapping))})",
                         field=key) from None


def _common(t: dict) -> dict:
    hidden = _positive(t, "hidden_size")
    heads = _positive(t, "num_attention_heads")
    heads_kv = _get(t, "num_key_value_heads", default=heads)
    if heads_kv <= 0 or heads % heads_kv:
        raise M3LabError(f"config field 'num_key_value_heads' ({heads_kv}) must divide num_attention_heads "
                         f"({heads})", field="num_key_value_heads")
    head_dim = _get(t, "head_dim", default=0) or hidden // heads
    rope = t.get("rope_parameters") if isinstance(t.get("rope_parameters"), dict) else {}
    t = {**rope, **t}  # transformers>=5 nests rope_theta / partial_rotary_factor in rope_parameters
    rotary = _get(t, "rotary_dim", default=0)
    if not rotary:
        rotary = int(round(head_dim * _get(t, "partial_rotary_factor", default=1.0, kind=float)))
    return dict(
        hidden=hidden, layers=_positive(t, "num_hidden_layers"), heads_q=heads, heads_kv=heads_kv,
        head_dim=head_dim, vocab=_positive(t, "vocab_size"),
        rope_theta=_get(t, "rope_theta", default=10000.0, kind=float), rotary_dim=rotary,
        norm_eps=_get(t, "rms_norm_eps", "layer_norm_eps", default=1e-6, kind=float),
        act=str(t.get("hidden_act", "silu")), tie_embeddings=bool(t.get("tie_word_embeddings", False)),
        max_position=_get(t, "max_position_embeddings", default=0),
        qk_norm=str(t.get("qk_norm_type") or "per_head") if t.get("use_qk_norm") else "",
    )


def _index_value(disable_v: Any, attn: tuple[str, ...]) -> bool:
    """True if some sparse layer keeps the index value/output branch (sparse_disable_index_value == 0)."""
    if not isinstance(disable_v, (list, tuple)):
        return not bool(disable_v)
    return any(not disable_v[i] for i, a in enumerate(attn) if a == ATTN_SPARSE and i < len(disable_v))


def _frozen(value: Any) -> Any:
    """A JSON value made hashable (dicts -> sorted pairs, lists -> tuples)."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def _not_a_vllm_option(key: str) -> M3LabError:
    return M3LabError(f"config field {key!r} is not a vLLM option for MiniMax M3", field=key,
                      hint="use text_config use_index_cache + index_topk_freq (+ index_skip_topk_offset)")


def _m3_index_sharing(t: dict) -> dict:
    """Index sharing as vLLM's AMD model reads it from the text config (``_should_skip_index_topk``,
    vllm/models/minimax_m3/amd/model.py:169-190): only with ``use_index_cache``; freq <= 1 means none."""
    if not t.get("use_index_cache", False):
        return {"index_topk_freq": 1, "index_skip_topk_offset": 0}
    freq = _get(t, "index_topk_freq", default=1) or 1
    return {"index_topk_freq": max(int(freq), 1), "index_skip_topk_offset": _get(t, "index_skip_topk_offset", default=0)}


def _m3_rope(t: dict, head_dim: int) -> dict:
    """RoPE fields as vLLM's AMD model reads them: get_rope(head_dim, partial_rotary_factor)
    (amd/model.py:201-239); rotary_dim is not read. transformers>=5 nests theta, factor and scaling in
    rope_parameters."""
    rope = t.get("rope_parameters") if isinstance(t.get("rope_parameters"), dict) else {}
    factor = _get({**rope, **t}, "partial_rotary_factor", default=0.5, kind=float)
    scaling = t.get("rope_scaling")
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    if scaling is not None and not isinstance(scaling, dict):
        raise M3LabError("config field 'rope_scaling' must be an object (e.g. YaRN)", field="rope_scaling")
    return {"rotary_dim": int(round(head_dim * factor)),
            "max_position": _get(t, "max_position_embeddings", default=M3_MAX_POSITION_DEFAULT),
            "rope_scaling": _frozen(scaling) if scaling else None}


def _m3_layer_types(merged: dict, layers: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(attention type, MLP type) of every layer, from the frequency lists or the named type lists."""
    attn = (_per_layer(merged, "sparse_attention_freq", layers, {0: ATTN_DENSE, 1: ATTN_SPARSE})
            or _per_layer(merged, "layer_types", layers,
                          {"full_attention": ATTN_DENSE, "minimax_m3_sparse": ATTN_SPARSE, "sparse": ATTN_SPARSE}))
    if attn is None:
        raise M3LabError("config field 'sparse_attention_freq' (or 'layer_types') is missing",
                         field="sparse_attention_freq")
    if merged.get("use_sparse_attention") is False:
        attn = (ATTN_DENSE,) * layers
    mlp = (_per_layer(merged, "moe_layer_freq", layers, {0: MLP_DENSE, 1: MLP_MOE})
           or _per_layer(merged, "mlp_layer_types", layers,
                         {"dense": MLP_DENSE, "sparse": MLP_MOE, "moe": MLP_MOE}))
    if mlp is None:
        raise M3LabError("config field 'moe_layer_freq' (or 'mlp_layer_types') is missing", field="moe_layer_freq")
    return attn, mlp


def _m3_sparse(t: dict, merged: dict, attn: tuple[str, ...], heads_kv: int) -> SparseConfig | None:
    """The sparse-attention block (indexer and block selection), None when no layer is sparse."""
    if ATTN_SPARSE not in attn:
        return None
    disable_v = merged.get("sparse_disable_index_value", 1)
    sparse = SparseConfig(
        index_heads=_positive(merged, "sparse_num_index_heads", "index_n_heads"),
        index_dim=_positive(merged, "sparse_index_dim", "index_head_dim"),
        block_size=_positive(merged, "sparse_block_size", "index_block_size"),
        topk_blocks=_positive(merged, "sparse_topk_blocks", "index_topk_blocks"),
        # the AMD model defaults a missing sparse_local_block to 0 (amd/model.py:797)
        local_blocks=_get(merged, "sparse_local_block", "index_local_blocks", default=0),
        init_blocks=_get(merged, "sparse_init_block", "index_init_blocks", default=0),
        index_value=_index_value(disable_v, attn),
        **_m3_index_sharing(t),
    )
    if sparse.index_heads != heads_kv:
        raise M3LabError(f"sparse_num_index_heads ({sparse.index_heads}) must equal num_key_value_heads "
                         f"({heads_kv})", field="sparse_num_index_heads")
    return sparse


def _minimax_m3(t: dict) -> dict:
    """MiniMax M3 text config read as vLLM 0.33.0's AMD model reads it (vllm/models/minimax_m3/amd/model.py)."""
    for where in (t, t.get("sparse_attention_config") or {}):
        if isinstance(where, dict) and "index_topk_pattern" in where:
            raise _not_a_vllm_option("index_topk_pattern")
    base = _common(t)
    base.update(_m3_rope(t, base["head_dim"]))
    sp_cfg = t.get("sparse_attention_config") or {}
    if not isinstance(sp_cfg, dict):
        raise M3LabError("config field 'sparse_attention_config' must be an object", field="sparse_attention_config")
    merged = {**t, **sp_cfg}
    attn, mlp = _m3_layer_types(merged, base["layers"])
    sparse = _m3_sparse(t, merged, attn, base["heads_kv"])
    inter = _positive(t, "intermediate_size")
    n_shared = _get(t, "n_shared_experts", default=0)
    return dict(base, family="minimax_m3", attn_types=attn, mlp_types=mlp, sparse=sparse,
                dense_inter=_get(t, "dense_intermediate_size", default=inter), expert_inter=inter,
                # vLLM sizes the shared expert intermediate_size x n_shared_experts (amd/model.py:437-445)
                shared_inter=inter * n_shared,
                experts=_positive(t, "num_local_experts", "num_experts"), topk=_positive(t, "num_experts_per_tok"),
                n_shared=n_shared, swiglu_alpha=_get(t, "swiglu_alpha", default=1.702, kind=float),
                swiglu_limit=_get(t, "swiglu_limit", default=7.0, kind=float),
                swiglu_beta=_get(t, "swiglu_beta", default=M3_SWIGLU_BETA_DEFAULT, kind=float),
                mtp_modules=_get(t, "num_mtp_modules", default=M3_MTP_MODULES_DEFAULT),
                routed_scaling=_get(t, "routed_scaling_factor", default=1.0, kind=float),
                scoring=str(t.get("scoring_func", "sigmoid")), router_dtype="fp32",
                router_bias=bool(t.get("use_routing_bias", False)))


def _minimax_m2(t: dict) -> dict:
    base = _common(t)
    types = t.get("attn_type_list")
    if types is not None and any(v != 1 for v in types):
        raise M3LabError("config field 'attn_type_list' has linear-attention layers (0), which are not supported",
                         field="attn_type_list")
    inter = _positive(t, "intermediate_size")
    shared = _get(t, "shared_intermediate_size", default=0)
    layers = base["layers"]
    return dict(base, family="minimax_m2", attn_types=(ATTN_DENSE,) * layers, mlp_types=(MLP_MOE,) * layers,
                expert_inter=inter, shared_inter=shared, n_shared=1 if shared else 0,
                experts=_positive(t, "num_local_experts"), topk=_positive(t, "num_experts_per_tok"),
                routed_scaling=_get(t, "routed_scaling_factor", default=1.0, kind=float),
                scoring=str(t.get("scoring_func", "sigmoid")), router_dtype="fp32",
                router_bias=bool(t.get("use_routing_bias", False)))


def _dense(t: dict) -> dict:
    base = _common(t)
    if t.get("model_type") == "qwen3":
        base["qk_norm"] = "per_head"
    layers = base["layers"]
    return dict(base, family="dense", attn_types=(ATTN_DENSE,) * layers, mlp_types=(MLP_DENSE,) * layers,
                dense_inter=_positive(t, "intermediate_size"))


def _mixtral(t: dict) -> dict:
    base = _common(t)
    layers = base["layers"]
    return dict(base, family="mixtral", attn_types=(ATTN_DENSE,) * layers, mlp_types=(MLP_MOE,) * layers,
                expert_inter=_positive(t, "intermediate_size"), experts=_positive(t, "num_local_experts"),
                topk=_positive(t, "num_experts_per_tok"))


def _qwen_moe(t: dict) -> dict:
    base = _common(t)
    if t.get("model_type") == "qwen3_moe":
        base["qk_norm"] = "per_head"
    layers = base["layers"]
    experts = _positive(t, "num_experts")
    step = _get(t, "decoder_sparse_step", default=1) or 1
    only = set(t.get("mlp_only_layers") or [])
    mlp = tuple(MLP_MOE if (i not in only and (i + 1) % step == 0) else MLP_DENSE for i in range(layers))
    shared = _get(t, "shared_expert_intermediate_size", default=0)
    return dict(base, family="qwen_moe", attn_types=(ATTN_DENSE,) * layers, mlp_types=mlp,
                dense_inter=_get(t, "intermediate_size", default=0), expert_inter=_positive(t, "moe_intermediate_size"),
                experts=experts, topk=_positive(t, "num_experts_per_tok"), shared_inter=shared,
                n_shared=1 if shared else 0)


def _deepseek(t: dict) -> dict:
    base = _common(t)
    layers = base["layers"]
    first_dense = _get(t, "first_k_dense_replace", default=0)
    freq = _get(t, "moe_layer_freq", default=1) or 1
    mlp = tuple(MLP_MOE if (i >= first_dense and i % freq == 0) else MLP_DENSE for i in range(layers))
    mla = MLAConfig(q_lora_rank=_get(t, "q_lora_rank", default=0), kv_lora_rank=_positive(t, "kv_lora_rank"),
                    qk_nope_head_dim=_positive(t, "qk_nope_head_dim"),
                    qk_rope_head_dim=_positive(t, "qk_rope_head_dim"), v_head_dim=_positive(t, "v_head_dim"))
    n_shared = _get(t, "n_shared_experts", default=0)
    inter = _positive(t, "moe_intermediate_size")
    return dict(base, family="deepseek", attn_types=(ATTN_DENSE,) * layers, mlp_types=mlp, mla=mla,
                mtp_modules=_get(t, "num_nextn_predict_layers", default=0),
                head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim, rotary_dim=mla.qk_rope_head_dim,
                dense_inter=_positive(t, "intermediate_size"), expert_inter=inter, shared_inter=inter * n_shared,
                n_shared=n_shared, experts=_positive(t, "n_routed_experts"), topk=_positive(t, "num_experts_per_tok"),
                routed_scaling=_get(t, "routed_scaling_factor", default=1.0, kind=float),
                scoring=str(t.get("scoring_func", "softmax")), router_bias=t.get("topk_method") == "noaux_tc")


def _qwen3_5_moe(t: dict) -> dict:
    """Qwen3.5 MoE: Gated DeltaNet linear attention with full (gated-output) attention every
    ``full_attention_interval``-th layer; routed experts plus one gated shared expert."""
    values = _qwen_moe(t)
    layers = values["layers"]
    attn = _per_layer(t, "layer_types", layers, {"full_attention": ATTN_DENSE, "linear_attention": ATTN_LINEAR})
    if attn is None:
        every = _positive(t, "full_attention_interval")
        attn = tuple(ATTN_DENSE if (i + 1) % every == 0 else ATTN_LINEAR for i in range(layers))
    linear = LinearAttnConfig(
        key_heads=_positive(t, "linear_num_key_heads"), value_heads=_positive(t, "linear_num_value_heads"),
        key_dim=_positive(t, "linear_key_head_dim"), value_dim=_positive(t, "linear_value_head_dim"),
        conv_kernel=_positive(t, "linear_conv_kernel_dim"),
        state_dtype="bf16" if str(t.get("mamba_ssm_dtype", "float32")) in ("bfloat16", "bf16") else "fp32")
    if linear.value_heads % linear.key_heads:
        raise M3LabError(f"linear_num_key_heads ({linear.key_heads}) must divide linear_num_value_heads "
                         f"({linear.value_heads})", field="linear_num_key_heads")
    return dict(values, family="qwen3_5_moe", attn_types=attn, linear=linear, qk_norm="per_head",
                attn_output_gate=bool(t.get("attn_output_gate", True)))


def _indexer_pattern(t: dict, layers: int) -> tuple[str, ...] | None:
    """GLM ``indexer_types`` ("full" computes the top-k, "shared" reuses it) as the per-sparse-layer S/F pattern."""
    raw = t.get("indexer_types")
    if raw is None:
        return None
    kinds = _per_layer(t, "indexer_types", layers, {"full": "F", "shared": "S"})
    return kinds


def _glm_moe_dsa(t: dict) -> dict:
    """GLM-5.x (``glm_moe_dsa``): DeepSeek MLA + DeepSeek sparse attention (lightning indexer, token-level
    top-k, index sharing via ``indexer_types`` / ``index_topk_freq``), first-k dense MLPs, shared expert."""
    values = _deepseek(t)
    layers = values["layers"]
    mlp = _per_layer(t, "mlp_layer_types", layers, {"dense": MLP_DENSE, "sparse": MLP_MOE, "moe": MLP_MOE})
    if mlp is not None:
        values["mlp_types"] = mlp
    pattern = _indexer_pattern(t, layers)
    freq = _get(t, "index_topk_freq", default=1) or 1
    if pattern is None and freq > 1:  # GLM's rule: layers < offset compute; then every freq-th from offset + freq - 1
        off = _get(t, "index_skip_topk_offset", default=0)
        pattern = tuple("F" if i < off or (i - off) % freq == freq - 1 else "S" for i in range(layers))
    sparse = SparseConfig(index_heads=_positive(t, "index_n_heads"), index_dim=_positive(t, "index_head_dim"),
                          block_size=1, topk_blocks=_positive(t, "index_topk"), local_blocks=0,
                          index_topk_freq=freq, index_skip_topk_offset=_get(t, "index_skip_topk_offset", default=0),
                          index_topk_pattern=pattern, style="dsa", index_q_replicated=True)
    return dict(values, family="glm_moe_dsa", attn_types=(ATTN_SPARSE,) * layers, sparse=sparse,
                router_dtype="fp32" if t.get("moe_router_dtype") == "float32" else "bf16")


_FAMILIES = {
    "minimax_m3": _minimax_m3, "minimax_m3_vl": _minimax_m3, "minimax_m3_text": _minimax_m3,
    "minimax_m2": _minimax_m2,
    "llama": _dense, "mistral": _dense, "qwen2": _dense, "qwen3": _dense,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
    "qwen3_5_moe": _qwen3_5_moe, "qwen3_5_moe_text": _qwen3_5_moe,
    "glm_moe_dsa": _glm_moe_dsa,
}


def parse_hf_config(config: dict, name: str | None = None, source: str = "", *, reader: str = "auto") -> ModelSpec:
    """Build a :class:`ModelSpec` from a config dict; M3LabError names the missing or bad field.

    MiniMax M3 configs in the checkpoint's own format (``sparse_attention_config``) are parsed by vLLM's
    ``MiniMaxM3Config`` (:mod:`m3lab.spec.vllm_config`) when vLLM is installed; m3lab's own reader serves the
    flat transformers-5 names (which vLLM 0.33.0's class does not read) and machines without vLLM.
    ``reader="m3lab"`` forces m3lab's reader (compared with vLLM's in a test).
    """
    if not isinstance(config, dict):
        raise M3LabError("config must be a JSON object (a Hugging Face config.json)", field="config")
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise M3LabError("config field 'text_config' must be an object", field="text_config")
    t = dict(text) if text else dict(config)
    model_type = str(config.get("model_type") or t.get("model_type") or "")
    if not model_type and any("MiniMaxM3" in a for a in config.get("architectures", []) or []):
        model_type = "minimax_m3"
    parser = _FAMILIES.get(model_type) or (_minimax_m3 if model_type.startswith("minimax_m3") else None)
    misplaced = [k for k in (*_INDEX_SHARING_KEYS, "index_topk_pattern") if text and k in config]
    if parser is _minimax_m3 and misplaced:
        if "index_topk_pattern" in misplaced:
            raise _not_a_vllm_option("index_topk_pattern")
        moved = json.dumps({"text_config": {k: config[k] for k in misplaced}})
        raise M3LabError(f"config field {misplaced[0]!r} is at the top level, where vLLM on ROCm rejects it "
                         f"(MiniMax M3 reads index sharing from text_config only)", field=misplaced[0],
                         hint=f"move it into text_config: --hf-overrides '{moved}'")
    if parser is None:
        raise M3LabError(f"config field 'model_type' is {model_type or 'missing'!r}: not supported",
                         field="model_type", hint=f"supported: {', '.join(sorted(_FAMILIES))}")
    values = parser(t)  # m3lab's reader: its input checks run for every family
    name = name or str(config.get("_name_or_path") or model_type)
    if parser is _minimax_m3 and reader != "m3lab" and "sparse_attention_config" in t and _vllm_parses():
        spec = spec_via_vllm(config, name=name, source=source)  # vLLM's MiniMaxM3Config: the production parse
        return dataclasses.replace(spec, extra={**spec.extra, "model_type": model_type})
    return ModelSpec(name=name, source=source, extra={"model_type": model_type}, **values)


def spec_via_vllm(config: dict, name: str | None = None, source: str = "") -> ModelSpec:
    """The ModelSpec of what vLLM's AMD model reads from vLLM's parse of a MiniMax M3 ``config``
    (:func:`m3lab.spec.vllm_config.cached_vllm_reads`)."""
    v = dict(cached_vllm_reads(config))
    n, sparse_ids, moe_ids = v.pop("layers"), set(v.pop("sparse_layers")), set(v.pop("moe_layers"))
    attn = tuple(ATTN_SPARSE if i in sparse_ids else ATTN_DENSE for i in range(n))
    sp, disable_v, scaling = v.pop("sparse"), v.pop("sparse_disable_index_value"), v.pop("rope_scaling")
    model_type = v.pop("model_type")
    return ModelSpec(name=name or str(config.get("_name_or_path") or model_type), family="minimax_m3", layers=n,
                     attn_types=attn,
                     mlp_types=tuple(MLP_MOE if i in moe_ids else MLP_DENSE for i in range(n)),
                     sparse=SparseConfig(**sp, index_value=_index_value(disable_v, attn)) if sp else None,
                     rope_scaling=_frozen(scaling) if scaling else None, source=source,
                     extra={"model_type": model_type}, **v)


def _vllm_parses() -> bool:
    """Whether vLLM's config class parses M3 configs here (else m3lab's reader, with a one-time notice)."""
    return install.tell_once("parsing MiniMax M3 configs with vLLM's MiniMaxM3Config (m3lab's own reader is used)")


# ---- registry ----------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _index() -> dict:
    import yaml

    return yaml.safe_load((CONFIG_DIR / "index.yaml").read_text())


#: Quantised checkpoints of a model whose config is not a named one of their own: (model, quant) -> Hugging Face id.
CHECKPOINTS = {("minimax-m3", "mxfp4"): "amd/MiniMax-M3-MXFP4"}


def checkpoint_id(model: str, quant: str) -> str:
    """The Hugging Face checkpoint ``vllm serve`` loads for ``model`` with ``quant`` weights: a named config
    "<model>-<quant>" is that quantised checkpoint of the same architecture (``minimax-m3`` with MXFP8 weights
    is ``minimax-m3-mxfp8``'s MiniMaxAI/MiniMax-M3-MXFP8), else the model's own id, else its name."""
    if (model, quant) in CHECKPOINTS:
        return CHECKPOINTS[(model, quant)]
    index = _index()
    entry = index.get(f"{model}-{quant}") or index.get(model, {})
    return str(entry.get("hf_id") or model)


def list_models() -> list[str]:
    """Names accepted by :func:`load_model` (plus any path to a config.json)."""
    return sorted([*_index(), "minimax-m3-mini"])


@lru_cache(maxsize=64)
def _load_named(key: str) -> ModelSpec:
    if key == "minimax-m3-mini":
        return ModelSpec.mini()
    entry = _index()[key]
    path = CONFIG_DIR / entry["file"]
    spec = parse_hf_config(json.loads(path.read_text()), name=key, source=entry["source"])
    spec.extra["config_file"] = entry["file"]   # relative to CONFIG_DIR: the record's key is the same in every clone
    return spec


def raw_config(model: ModelSpec) -> dict:
    """The ``config.json`` dict ``model`` was parsed from (a fresh copy), for building vLLM's own model."""
    if model.name == "minimax-m3-mini":
        return json.loads(json.dumps(MINI_M3_CONFIG))
    path = model.extra.get("config_file")
    if not path:
        raise M3LabError(f"model {model.name!r} was not loaded from a config.json", field="model",
                         hint="load it by name or from a config.json path")
    return json.loads((CONFIG_DIR / path).read_text())   # a shipped config's name; an absolute path stays as is


def _resolve_name(name: str) -> str | None:
    key = name.strip().lower()
    if key in _index() or key == "minimax-m3-mini":
        return key
    for k, entry in _index().items():  # accept the Hugging Face id too
        if str(entry.get("hf_id", "")).lower() == key:
            return k
    return None


def load_model(name_or_path: str | ModelSpec) -> ModelSpec:
    """A named model (see :func:`list_models`), a Hugging Face id of one, or a path to a config.json/dir."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    key = _resolve_name(str(name_or_path))
    if key is not None:
        return _load_named(key)
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise M3LabError(f"model config file {str(path)!r} not found", field="model")
        try:
            cfg = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            reason = err.msg if hasattr(err, "msg") else err
            raise M3LabError(f"model config {str(path)!r} is not valid JSON ({reason})", field="model") from None
        spec = parse_hf_config(cfg, name=path.parent.name if path.name == "config.json" else path.stem,
                               source=f"file {path}")
        spec.extra["config_file"] = str(path)
        return spec
    raise M3LabError(f"unknown model {str(name_or_path)!r}", field="model",
                     hint=f"use one of {', '.join(list_models())} or a path to a config.json")
