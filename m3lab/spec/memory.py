"""Parameter counts, weight bytes per GPU and KV-cache bytes per token.

For MiniMax M3: 426,174,572,928 text-backbone parameters; 23.50 B active per token without embedding and
LM head; 137,472 B/token of bf16 KV for the whole model; 22,656 B/token/rank at TP4 with fp8 main and index
caches (29,952 with the default bf16 index cache).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from m3lab.spec.model import ModelSpec
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.quant import QuantScheme, dtype_bytes, load_quant, normalize_cache_dtype, weight_bytes


def _attention_params(m: ModelSpec) -> dict:
    """Per-layer attention parameters by weight group (qkv incl. norms, o)."""
    H = m.hidden
    if m.mla is not None:
        a = m.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = (H * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * m.heads_q * qk if a.q_lora_rank
             else H * m.heads_q * qk)
        kv = H * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank + a.kv_lora_rank * m.heads_q * (
            a.qk_nope_head_dim + a.v_head_dim)
        return {"attn_qkv": q + kv, "attn_o": m.heads_q * a.v_head_dim * H}
    q_heads = m.heads_q * (2 if m.attn_output_gate else 1)   # the output gate doubles q_proj's width
    qkv = H * (q_heads + 2 * m.heads_kv) * m.head_dim
    norms = {"per_head": 2 * m.head_dim, "per_layer": (m.heads_q + m.heads_kv) * m.head_dim}.get(m.qk_norm, 0)
    return {"attn_qkv": qkv + norms, "attn_o": m.q_width * H}


def _linear_params(m: ModelSpec, plan: ParallelPlan | None = None) -> dict:
    """Per Gated DeltaNet layer (on one rank of ``plan``; whole without one): in_proj_qkvz [2*kh*kd + 2*vh*vd, H],
    in_proj_ba [2*vh, H], conv1d [conv_dim, kernel], A_log and dt_bias [vh], gated norm [vd]; out_proj [H, vh*vd]."""
    a, H = m.linear, m.hidden
    kh, vh = (plan or ParallelPlan()).linear_heads_local(m)
    conv = (2 * kh * a.key_dim + vh * a.value_dim) * a.conv_kernel
    qkv = H * (2 * kh * a.key_dim + 2 * vh * a.value_dim + 2 * vh) + conv + 2 * vh + a.value_dim
    return {"attn_qkv": qkv, "attn_o": vh * a.value_dim * H}


def index_layers(m: ModelSpec) -> tuple[int, ...]:
    """Layers holding indexer weights and an index-key cache: every sparse layer for M3 (block style); for DSA
    only the layers that compute their own top-k (assumption: "shared" layers of GLM's ``indexer_types`` have
    no indexer and keep no index keys)."""
    if m.sparse is None:
        return ()
    return m.topk_layers if m.sparse.style == "dsa" else m.sparse_layers


def _indexer_params(m: ModelSpec) -> int:
    """Per indexer layer. M3: index q [ih*d, H], index k [d, H], two per-head norms (no value branch).
    DSA: wq_b [ih*d, q_lora], wk [d, H], weights_proj [ih, H], k LayerNorm (weight + bias)."""
    sp = m.sparse
    if sp.style == "dsa":
        q_in = m.mla.q_lora_rank if m.mla is not None and m.mla.q_lora_rank else m.hidden
        return q_in * sp.index_heads * sp.index_dim + m.hidden * (sp.index_dim + sp.index_heads) + 2 * sp.index_dim
    extra = 2 * sp.index_dim * sp.index_heads * m.hidden if sp.index_value else 0
    return m.hidden * (sp.index_heads + 1) * sp.index_dim + 2 * sp.index_dim + extra


def param_breakdown(m: ModelSpec) -> dict[str, int]:
    """Whole-model parameters by weight group (plus ``norms``), text backbone only."""
    H = m.hidden
    attn = _attention_params(m)
    lin = _linear_params(m) if m.linear is not None else {"attn_qkv": 0, "attn_o": 0}
    n_kv, n_lin = len(m.kv_layers), len(m.linear_layers)
    n_moe = len(m.moe_layers)
    out = {
        "embedding": m.vocab * H,
        "lm_head": 0 if m.tie_embeddings else m.vocab * H,
        "attn_qkv": attn["attn_qkv"] * n_kv + lin["attn_qkv"] * n_lin,
        "attn_o": attn["attn_o"] * n_kv + lin["attn_o"] * n_lin,
        "indexer_qk": _indexer_params(m) * len(index_layers(m)) if m.sparse else 0,
        "dense_mlp": 3 * H * m.dense_inter * len(m.dense_mlp_layers),
        "routed_expert": 3 * H * m.expert_inter * m.experts * n_moe,
        "shared_expert": 3 * H * m.shared_inter * n_moe,
        "router": (H * m.experts + (m.experts if m.router_bias else 0)) * n_moe,
        "norms": 2 * H * m.layers + H,
    }
    return out


def params_total(m: ModelSpec) -> int:
    """All text-backbone parameters (embedding and untied LM head included)."""
    return sum(param_breakdown(m).values())


def params_active(m: ModelSpec, *, embedding: bool = False, lm_head: bool = False) -> int:
    """Parameters one token touches: everything but the unselected routed experts (router bias excluded)."""
    b = param_breakdown(m)
    n_moe = len(m.moe_layers)
    active = (b["attn_qkv"] + b["attn_o"] + b["indexer_qk"] + b["dense_mlp"] + b["shared_expert"] + b["norms"]
              + 3 * m.hidden * m.expert_inter * m.topk * n_moe + m.hidden * m.experts * n_moe)
    return active + (b["embedding"] if embedding else 0) + (b["lm_head"] if lm_head else 0)


@dataclass(frozen=True)
class KVBytes:
    """KV-cache bytes per token: main K/V (all layers) and the index-key cache (sparse layers)."""

    main: int
    index: int

    @property
    def total(self) -> int:
        return self.main + self.index

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def kv_bytes(m: ModelSpec, kv_dtype: str = "bf16", index_dtype: str = "bf16",
             plan: ParallelPlan | None = None) -> KVBytes:
    """Bytes per token; with ``plan`` per TP rank (replicated KV heads and index keys counted on every rank)."""
    kb = dtype_bytes(normalize_cache_dtype(kv_dtype, "kv_dtype"))
    ib = dtype_bytes(normalize_cache_dtype(index_dtype, "index_dtype"))
    if m.mla is not None:  # latent + rope key, one copy per rank
        per_layer = m.mla.kv_lora_rank + m.mla.qk_rope_head_dim
    else:
        heads = plan.heads_kv_local(m) if plan else m.heads_kv
        per_layer = 2 * heads * m.head_dim
    main = int(len(m.kv_layers) * per_layer * kb)   # linear-attention layers keep a per-request state instead
    index = int(len(index_layers(m)) * m.sparse.index_dim * ib) if m.sparse else 0
    return KVBytes(main=main, index=index)


def state_bytes_per_request(m: ModelSpec, plan: ParallelPlan | None = None) -> int:
    """Fixed-size recurrent state of one request (linear-attention layers; 0 for other models), whole model
    or per TP rank: delta-rule state [vh, kd, vd] in its state dtype + conv state [kernel - 1, conv_dim] bf16,
    per linear layer. It does not grow with the context."""
    if m.linear is None:
        return 0
    a = m.linear
    kh, vh = (plan or ParallelPlan()).linear_heads_local(m)
    state = vh * a.key_dim * a.value_dim * dtype_bytes(a.state_dtype)
    conv = (a.conv_kernel - 1) * (2 * kh * a.key_dim + vh * a.value_dim) * dtype_bytes("bf16")
    return int(len(m.linear_layers) * (state + conv))


def kv_bytes_per_token(m: ModelSpec, kv_dtype: str = "bf16", index_dtype: str = "bf16",
                       plan: ParallelPlan | None = None) -> int:
    """Total KV-cache bytes per token (whole model, or per rank with ``plan``)."""
    return kv_bytes(m, kv_dtype, index_dtype, plan).total


def local_weight_elements(m: ModelSpec, plan: ParallelPlan) -> dict[str, float]:
    """Weight elements held by one GPU, by weight group (norms under ``norms``)."""
    H, tp = m.hidden, plan.tp
    attn = _attention_params(m)
    if m.mla is not None:
        qkv = attn["attn_qkv"] / tp  # approximation: MLA up-projections shard by heads, latents replicate
    else:
        q_heads = plan.heads_q_local(m) * (2 if m.attn_output_gate else 1)
        qkv = H * (q_heads + 2 * plan.heads_kv_local(m)) * m.head_dim
    lin = _linear_params(m, plan) if m.linear is not None else {"attn_qkv": 0, "attn_o": 0}
    n_kv, n_lin = len(m.kv_layers), len(m.linear_layers)
    if m.sparse is None:
        idx = 0
    elif m.sparse.style == "dsa":  # replicated indexer: every rank holds all of it
        idx = _indexer_params(m) * len(index_layers(m))
    else:
        idx = H * (plan.index_heads_local(m) + 1) * m.sparse.index_dim * len(m.sparse_layers)
    out = {
        "embedding": plan.vocab_local(m) * H,
        "lm_head": 0 if m.tie_embeddings else plan.vocab_local(m) * H,
        "attn_qkv": qkv * n_kv + lin["attn_qkv"] * n_lin,
        "attn_o": attn["attn_o"] / tp * n_kv + lin["attn_o"] * n_lin,
        "indexer_qk": idx,
        "dense_mlp": 3 * H * m.dense_inter / tp * len(m.dense_mlp_layers),
        "routed_expert": 3 * H * plan.expert_inter_local(m) * plan.experts_local(m) * len(m.moe_layers),
        "shared_expert": 3 * H * plan.shared_inter_local(m) * len(m.moe_layers),
        "router": H * m.experts * len(m.moe_layers),
        "norms": 2 * H * m.layers + H,
    }
    return out


def weight_bytes_breakdown(m: ModelSpec, plan: ParallelPlan, quant: QuantScheme | str = "bf16") -> dict[str, float]:
    """Weight bytes per GPU by weight group, MX scale bytes included (norms counted as bf16)."""
    q = load_quant(quant)
    elems = local_weight_elements(m, plan)
    # M3's index q/k projections are columns of the one fused qkv GEMM and share its format
    fused_index = m.sparse is not None and m.sparse.style == "block"
    dtype = {k: q.weight_dtype("attn_qkv" if k == "indexer_qk" and fused_index else k) for k in elems if k != "norms"}
    out = {k: weight_bytes(v, dtype[k]) for k, v in elems.items() if k != "norms"}
    out["norms"] = weight_bytes(elems["norms"], "bf16")
    return out


def weight_bytes_per_gpu(m: ModelSpec, plan: ParallelPlan, quant: QuantScheme | str = "bf16") -> float:
    """Bytes of weights one GPU holds under ``plan`` and ``quant``."""
    return float(sum(weight_bytes_breakdown(m, plan, quant).values()))


def memory_facts(deployment, plan=None) -> dict:
    """The numbers ``m3lab model`` prints for a Deployment (one flat dict, bytes and parameter counts): its model
    under its plan and quantisation (weights, KV and index-key cache dtypes). ``plan``: the plan as vLLM runs it
    (``m3lab.vllm.fastpaths.effective_plan``); None: the deployment's own."""
    m, q = deployment.model, deployment.quant
    plan = deployment.plan if plan is None else plan
    whole = kv_bytes(m, q.kv_dtype, q.index_dtype)
    rank = kv_bytes(m, q.kv_dtype, q.index_dtype, plan)
    return {
        "model": m.name, "tp": plan.tp, "ep": plan.ep, "quant": q.name, "kv_dtype": q.kv_dtype,
        "index_dtype": q.index_dtype,
        "params_total": params_total(m), "params_active": params_active(m), "mtp_modules": m.mtp_modules,
        "params_active_with_lm_head": params_active(m, lm_head=True),
        "kv_bytes_per_token": whole.total, "kv_bytes_per_token_main": whole.main,
        "kv_bytes_per_token_index": whole.index,
        "kv_bytes_per_token_per_rank": rank.total, "kv_bytes_per_token_per_rank_main": rank.main,
        "kv_bytes_per_token_per_rank_index": rank.index,
        "weight_bytes_per_gpu": weight_bytes_per_gpu(m, plan, q),
        "state_bytes_per_request": state_bytes_per_request(m),
        "state_bytes_per_request_per_rank": state_bytes_per_request(m, plan),
    }
