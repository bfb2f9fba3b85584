"""Hugging Face tensor names of MiniMax M3 and how they fuse into the reference model's weights.

HF names (the MiniMaxAI/MiniMax-M3 checkpoint's safetensors index): prefix
``language_model.model.`` (``language_model.lm_head.weight`` for the head), e.g.
``layers.{i}.self_attn.q_proj.weight``, ``layers.{i}.block_sparse_moe.experts.{e}.w1.weight``.
Each internal weight (see ``m3lab.model.decoder``) is a list of :class:`Part` — an HF tensor and its
sharding rule — concatenated along the output rows.
"""
from dataclasses import dataclass

from m3lab.spec.model import ATTN_SPARSE, MLP_DENSE, ModelSpec
from m3lab.spec.plan import ParallelPlan

PREFIX = "language_model.model."
HEAD = "language_model.lm_head.weight"

# sharding rules (vLLM ``vllm/model_executor/layers/linear.py``: column- and row-parallel linears)
COL = "col"  # output rows split evenly over tp (column-parallel)
ROW = "row"  # input columns split evenly over tp (row-parallel)
Q_HEADS = "q_heads"  # rows by q head: rank r keeps heads [r*Hq/tp, (r+1)*Hq/tp)
KV_HEADS = "kv_heads"  # rows by KV head, replicated when tp > heads (rank r keeps head r // (tp/heads))
REPLICATE = "replicate"  # every rank keeps the whole tensor
VOCAB = "vocab"  # vocab-parallel rows


@dataclass(frozen=True)
class Part:
    """One HF tensor feeding an internal weight: its name (without ``.weight``) and sharding rule."""

    name: str
    rule: str


def attn_parts(model: ModelSpec, plan: ParallelPlan, i: int) -> dict[str, list[Part]]:
    """Internal attention weights of layer i -> HF parts. On sparse layers the index q/k projections are loaded
    into the one fused qkv weight (``amd/model.py:1603-1612``): index q shards like the KV heads (replicated
    with the indexer context parallelism), index k is replicated."""
    a = f"{PREFIX}layers.{i}.self_attn."
    qkv = [Part(a + "q_proj", Q_HEADS), Part(a + "k_proj", KV_HEADS), Part(a + "v_proj", KV_HEADS)]
    if model.attn_types[i] == ATTN_SPARSE:
        qkv += [Part(a + "index_q_proj", REPLICATE if plan.index_q_replicated else KV_HEADS),
                Part(a + "index_k_proj", REPLICATE)]
    out = {
        f"layers.{i}.qkv": qkv,
        f"layers.{i}.o_proj": [Part(a + "o_proj", ROW)],
        f"layers.{i}.q_norm": [Part(a + "q_norm", REPLICATE)],
        f"layers.{i}.k_norm": [Part(a + "k_norm", REPLICATE)],
        f"layers.{i}.input_norm": [Part(f"{PREFIX}layers.{i}.input_layernorm", REPLICATE)],
        f"layers.{i}.post_norm": [Part(f"{PREFIX}layers.{i}.post_attention_layernorm", REPLICATE)],
    }
    if model.attn_types[i] == ATTN_SPARSE:
        out[f"layers.{i}.iq_norm"] = [Part(a + "index_q_norm", REPLICATE)]
        out[f"layers.{i}.ik_norm"] = [Part(a + "index_k_norm", REPLICATE)]
    return out


def mlp_parts(model: ModelSpec, i: int) -> dict[str, list[Part]]:
    """Dense MLP (layers 0-2) or the MoE's router and shared expert (experts are handled apart). The shared
    expert is TP-sharded (column / row parallel) also under EP (``amd/model.py:286-300``)."""
    if model.mlp_types[i] == MLP_DENSE:
        m = f"{PREFIX}layers.{i}.mlp."
        return {f"layers.{i}.gate_up": [Part(m + "gate_proj", COL), Part(m + "up_proj", COL)],
                f"layers.{i}.down": [Part(m + "down_proj", ROW)]}
    m = f"{PREFIX}layers.{i}.block_sparse_moe."
    return {f"layers.{i}.router": [Part(m + "gate", REPLICATE)],
            f"layers.{i}.router_bias": [Part(m + "e_score_correction_bias", REPLICATE)],
            f"layers.{i}.shared_gate_up": [Part(m + "shared_experts.gate_proj", COL),
                                           Part(m + "shared_experts.up_proj", COL)],
            f"layers.{i}.shared_down": [Part(m + "shared_experts.down_proj", ROW)]}


def expert_names(i: int, e: int) -> tuple[str, str, str]:
    """HF names (without ``.weight``) of expert e's w1 (gate), w3 (up), w2 (down) in layer i."""
    m = f"{PREFIX}layers.{i}.block_sparse_moe.experts.{e}."
    return m + "w1", m + "w3", m + "w2"


def global_parts() -> dict[str, list[Part]]:
    """Embedding, final norm and LM head."""
    return {"embed": [Part(PREFIX + "embed_tokens", VOCAB)], "norm": [Part(PREFIX + "norm", REPLICATE)],
            "lm_head": [Part(HEAD.removesuffix(".weight"), VOCAB)]}


def hf_shapes(model: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every HF text-backbone tensor name (with ``.weight``/bias suffix) -> its full (unquantised) shape."""
    c, out = model, {}
    d, h = c.head_dim, c.hidden
    ix, idim = (c.sparse.index_heads, c.sparse.index_dim) if c.sparse is not None else (0, 0)
    out[PREFIX + "embed_tokens.weight"] = (c.vocab, h)
    out[PREFIX + "norm.weight"] = (h,)
    out[HEAD] = (c.vocab, h)
    for i in range(c.layers):
        a = f"{PREFIX}layers.{i}.self_attn."
        out.update({a + "q_proj.weight": (c.heads_q * d, h), a + "k_proj.weight": (c.heads_kv * d, h),
                    a + "v_proj.weight": (c.heads_kv * d, h), a + "o_proj.weight": (h, c.heads_q * d),
                    a + "q_norm.weight": (d,), a + "k_norm.weight": (d,),
                    f"{PREFIX}layers.{i}.input_layernorm.weight": (h,),
                    f"{PREFIX}layers.{i}.post_attention_layernorm.weight": (h,)})
        if c.attn_types[i] == ATTN_SPARSE:
            out.update({a + "index_q_proj.weight": (ix * idim, h), a + "index_k_proj.weight": (idim, h),
                        a + "index_q_norm.weight": (idim,), a + "index_k_norm.weight": (idim,)})
        if c.mlp_types[i] == MLP_DENSE:
            m = f"{PREFIX}layers.{i}.mlp."
            out.update({m + "gate_proj.weight": (c.dense_inter, h), m + "up_proj.weight": (c.dense_inter, h),
                        m + "down_proj.weight": (h, c.dense_inter)})
            continue
        m = f"{PREFIX}layers.{i}.block_sparse_moe."
        out.update({m + "gate.weight": (c.experts, h), m + "e_score_correction_bias": (c.experts,),
                    m + "shared_experts.gate_proj.weight": (c.shared_inter, h),
                    m + "shared_experts.up_proj.weight": (c.shared_inter, h),
                    m + "shared_experts.down_proj.weight": (h, c.shared_inter)})
        for e in range(c.experts):
            w1, w3, w2 = expert_names(i, e)
            out.update({w1 + ".weight": (c.expert_inter, h), w3 + ".weight": (c.expert_inter, h),
                        w2 + ".weight": (h, c.expert_inter)})
    return out
