"""Assemble the OpTable: one row per op per layer of one engine step, on one GPU (see ``m3lab.optable``).

MiniMax M3 as vLLM 0.33.0's AMD model runs it (``vllm/models/minimax_m3/amd/model.py``): sparse layers project
q, k, v, index q and index k with ONE GEMM in one weight format (``qkv_proj``, 2560 columns per rank at TP4);
index-sharing reuse layers skip the index q/k norm, index RoPE and index-key cache write but keep the GEMM's
index columns; per layer two all-reduces at TP > 1: the post-attention one fused with the post-attention
Gemma norm (``fused_allreduce_gemma_rms_norm``, column ``fused_into`` on ``post_attn_norm``) and an explicit FFN
one, followed by the next layer's fused residual add + norm (``input_norm``, its own kernel).
"""
from __future__ import annotations

from dataclasses import dataclass

from m3lab.optable import ops
from m3lab.optable.ops import COLUMNS
from m3lab.optable.counts import AttentionCounts, attention_counts
from m3lab.optable.routing import Routing, make_routing
from m3lab.spec.model import ATTN_LINEAR, ATTN_SPARSE, MLP_MOE, ModelSpec, load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.quant import QuantScheme, dtype_bytes, load_quant
from m3lab.workload.step import EngineStep


@dataclass(frozen=True)
class _Ctx:
    """Everything a layer's rows depend on, computed once per step."""

    model: ModelSpec
    plan: ParallelPlan
    quant: QuantScheme
    step: EngineStep
    counts: AttentionCounts
    routing: Routing | None
    topk_source: dict  # sparse layer -> layer whose top-k it uses

    @property
    def T(self) -> int:
        return self.step.num_tokens


def _gemm(op: str, m: float, n: int, k: int, w_dtype: str, kind: str = "gemm") -> list[dict]:
    """A GEMM, preceded by its dynamic activation quantisation where the weights are quantised."""
    quant = [ops.act_quant(op, m, k, w_dtype)] if ops.needs_act_quant(w_dtype) else []
    return quant + [ops.gemm(op, m, n, k, w_dtype, kind=kind)]


def _qk_norm_weights(m: ModelSpec, p: ParallelPlan, own_index: bool) -> int:
    """q/k-norm weight elements read per layer on one rank (+ the index q/k norms where the index branch runs)."""
    w = {"per_head": 2 * m.head_dim,
         "per_layer": (p.heads_q_local(m) + p.heads_kv_local(m)) * m.head_dim}.get(m.qk_norm, 0)
    return w + (2 * m.sparse.index_dim if own_index else 0)


def _attention_rows(c: _Ctx, sparse: bool, computes_topk: bool) -> list[dict]:
    m, p, q, T = c.model, c.plan, c.quant, c.T
    H, hd = m.hidden, m.head_dim
    hq, hkv = p.heads_q_local(m), p.heads_kv_local(m)
    w_qkv = q.weight_dtype("attn_qkv")
    kvb, ib = dtype_bytes(q.kv_dtype), dtype_bytes(q.index_dtype)
    rows = [ops.elementwise("input_norm", "norm", T * H, reads=2, writes=2, flops_per=4, m=T, hidden=H,
                            weight_elems=H)]
    if m.mla is not None:
        return rows + _mla_rows(c, sparse, computes_topk)
    ih = p.index_heads_local(m) if sparse else 0
    own_index = sparse and computes_topk   # reuse layers skip index norm, RoPE, cache write (amd/model.py:1024-1101)
    idx_w = (ih + 1) * m.sparse.index_dim if own_index else 0
    gate = hq * hd if m.attn_output_gate else 0   # Qwen3.5: q_proj also emits a per-channel sigmoid gate
    # ONE GEMM, one weight format: q, k, v (+ index q, index k on every sparse layer, reuse layers included)
    rows += _gemm("qkv_proj", T, sum(p.qkv_widths(m, sparse)) + gate, H, w_qkv)
    normed = (hq + hkv) * hd + idx_w
    if m.qk_norm:
        rows.append(ops.elementwise("qk_norm", "norm", T * normed, reads=1, writes=1, flops_per=4, m=T,
                                    weight_elems=_qk_norm_weights(m, p, own_index)))
    if m.rotary_dim:
        rot = (hq + hkv + (ih + 1 if own_index else 0)) * m.rotary_dim
        rows.append(ops.elementwise("rope", "rope", T * rot, reads=1, writes=1, flops_per=3, m=T))
    kv_tok = 2 * hkv * hd * kvb                          # main K/V bytes per token per layer on this rank
    idx_tok = m.sparse.index_dim * ib if sparse else 0   # index-key bytes per token (replicated)
    idx_write = m.sparse.index_dim if own_index else 0   # the index cache exists on every sparse layer (memory)
    rows.append(ops.row("cache_write", "cache_write", m=T, act_dtype="bf16", w_dtype=q.kv_dtype, flops=0.0,
                        bytes_compute=T * (2 * hkv * hd + idx_write) * 2.0, bytes_weight=0.0,
                        bytes_kv=T * (kv_tok + (idx_tok if own_index else 0)), bytes_comm=0.0,
                        bytes_compute_written=0.0, bytes_kv_written=T * (kv_tok + (idx_tok if own_index else 0))))
    cnt = c.counts
    if sparse and computes_topk:
        sp = m.sparse
        rows.append(ops.row("indexer", "indexer", m=T, q_tokens=T, ctx_tokens=cnt.ctx_tokens,
                            keys_attended=cnt.dense_keys, heads_q=ih, heads_kv=1, head_dim=sp.index_dim,
                            act_dtype=q.index_dtype, flops=2.0 * ih * sp.index_dim * cnt.dense_keys,
                            bytes_compute=T * ih * sp.index_dim * ib + cnt.scored_blocks * ih * 4.0,
                            bytes_weight=0.0, bytes_kv=cnt.ctx_tokens * idx_tok, bytes_comm=0.0,
                            bytes_compute_written=cnt.scored_blocks * ih * 4.0, bytes_kv_written=0.0))
        rows.append(ops.row("topk", "topk", m=T, q_tokens=T, selected_blocks=cnt.selected_blocks * hkv,
                            heads_kv=hkv, act_dtype="fp32", flops=float(cnt.scored_blocks * ih),
                            bytes_compute=cnt.scored_blocks * ih * 4.0 + T * ih * sp.topk_blocks * 4.0,
                            bytes_weight=0.0, bytes_kv=0.0, bytes_comm=0.0,
                            bytes_compute_written=T * ih * sp.topk_blocks * 4.0, bytes_kv_written=0.0))
    keys = cnt.sparse_keys if sparse else cnt.dense_keys
    read_tok = cnt.sparse_read_tokens if sparse else cnt.ctx_tokens
    rows.append(ops.row("attention", "attention", m=T, q_tokens=T, ctx_tokens=cnt.ctx_tokens, keys_attended=keys,
                        selected_blocks=cnt.selected_blocks * hkv if sparse else float("nan"),
                        heads_q=hq, heads_kv=hkv, head_dim=hd, act_dtype="bf16", w_dtype=q.kv_dtype,
                        flops=4.0 * hq * hd * keys,
                        bytes_compute=2.0 * T * hq * hd * 2 + (T * hkv * m.sparse.topk_blocks * 4.0 if sparse else 0),
                        bytes_weight=0.0, bytes_kv=read_tok * kv_tok, bytes_comm=0.0,
                        bytes_compute_written=T * hq * hd * 2.0, bytes_kv_written=0.0))
    if gate:
        rows.append(ops.elementwise("attn_gate", "activation", T * gate, reads=2, writes=1, flops_per=5, m=T))
    rows += _gemm("o_proj", T, H, hq * hd, q.weight_dtype("attn_o"))
    return rows


def _mla_rows(c: _Ctx, sparse: bool = False, computes_topk: bool = False) -> list[dict]:
    """DeepSeek MLA. Dense: the non-absorbed prefill form (an approximation for decode). Sparse (DSA, GLM-5.x):
    the absorbed form vLLM's sparse MLA kernels use: queries are mapped into the latent space (W_UK) and the
    output back (W_UV) by per-head batched GEMMs whose FLOPs and weight bytes equal ``kv_b_proj`` on the new
    tokens; attention reads the selected latent rows [kv_lora + rope] of each query's top-k tokens."""
    m, p, q, T = c.model, c.plan, c.quant, c.T
    a, H, hq = m.mla, m.hidden, p.heads_q_local(m)
    w = q.weight_dtype("attn_qkv")
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    rows = []
    if a.q_lora_rank:
        rows += [*_gemm("q_a_proj", T, a.q_lora_rank, H, w),
                 ops.elementwise("q_a_norm", "norm", T * a.q_lora_rank, reads=1, writes=1, flops_per=4, m=T,
                                 weight_elems=a.q_lora_rank),
                 *_gemm("q_b_proj", T, hq * qk, a.q_lora_rank, w)]
    else:
        rows += _gemm("q_proj", T, hq * qk, H, w)
    lat = a.kv_lora_rank + a.qk_rope_head_dim
    kvb = dtype_bytes(q.kv_dtype)
    cnt = c.counts
    rows += [*_gemm("kv_a_proj", T, lat, H, w),
             ops.elementwise("kv_a_norm", "norm", T * a.kv_lora_rank, reads=1, writes=1, flops_per=4, m=T,
                             weight_elems=a.kv_lora_rank),
             *_gemm("kv_b_proj", T, hq * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, w)]
    sp = m.sparse if sparse else None
    own_idx = sp is not None and computes_topk
    idx_tok = sp.index_dim * dtype_bytes(q.index_dtype) if own_idx else 0
    rot = (hq + 1) * a.qk_rope_head_dim
    if own_idx:
        rows += _dsa_indexer_rows(c, idx_tok)
        rot += (p.index_heads_local(m) + 1) * a.qk_rope_head_dim
    rows += [ops.elementwise("rope", "rope", T * rot, reads=1, writes=1, flops_per=3, m=T),
             ops.row("cache_write", "cache_write", m=T, act_dtype="bf16", w_dtype=q.kv_dtype, flops=0.0,
                     bytes_compute=T * (lat + (sp.index_dim if own_idx else 0)) * 2.0, bytes_weight=0.0,
                     bytes_kv=T * (lat * kvb + idx_tok), bytes_comm=0.0, bytes_compute_written=0.0,
                     bytes_kv_written=T * (lat * kvb + idx_tok))]
    if sp is None:
        rows.append(ops.row("attention", "attention", m=T, q_tokens=T, ctx_tokens=cnt.ctx_tokens,
                            keys_attended=cnt.dense_keys, heads_q=hq, heads_kv=1, head_dim=qk, act_dtype="bf16",
                            w_dtype=q.kv_dtype, flops=2.0 * hq * (qk + a.v_head_dim) * cnt.dense_keys,
                            bytes_compute=T * hq * (qk + a.v_head_dim) * 2.0, bytes_weight=0.0,
                            bytes_kv=cnt.ctx_tokens * lat * kvb, bytes_comm=0.0,
                            bytes_compute_written=T * hq * a.v_head_dim * 2.0, bytes_kv_written=0.0))
    else:
        keys = cnt.sparse_keys
        rows.append(ops.row("attention", "attention", m=T, q_tokens=T, ctx_tokens=cnt.ctx_tokens, keys_attended=keys,
                            selected_blocks=cnt.selected_blocks, heads_q=hq, heads_kv=1, head_dim=lat,
                            act_dtype="bf16", w_dtype=q.kv_dtype, flops=2.0 * hq * (lat + a.kv_lora_rank) * keys,
                            bytes_compute=T * hq * (lat + a.kv_lora_rank) * 2.0 + T * sp.topk_blocks * 4.0,
                            bytes_weight=0.0, bytes_kv=cnt.sparse_read_tokens * lat * kvb, bytes_comm=0.0,
                            bytes_compute_written=T * hq * a.kv_lora_rank * 2.0, bytes_kv_written=0.0))
    rows += _gemm("o_proj", T, H, hq * a.v_head_dim, q.weight_dtype("attn_o"))
    return rows


def _dsa_indexer_rows(c: _Ctx, idx_tok: float) -> list[dict]:
    """DeepSeek sparse attention's lightning indexer on a layer that computes its own top-k: index q from the
    q latent (wq_b), index k and per-head weights from the hidden state (wk + weights_proj, one GEMM), a
    LayerNorm on k, head-weighted ReLU scores of every cached key, and a token-level top-k."""
    m, p, q, T = c.model, c.plan, c.quant, c.T
    sp, a, cnt = m.sparse, m.mla, c.counts
    ih, d = p.index_heads_local(m), sp.index_dim
    w_idx = q.weight_dtype("indexer_qk")
    q_in = a.q_lora_rank or m.hidden
    return [*_gemm("indexer_q_proj", T, ih * d, q_in, w_idx),
            *_gemm("indexer_k_proj", T, d + ih, m.hidden, w_idx),
            ops.elementwise("indexer_k_norm", "norm", T * d, reads=1, writes=1, flops_per=5, m=T, weight_elems=2 * d),
            ops.row("indexer", "indexer", m=T, q_tokens=T, ctx_tokens=cnt.ctx_tokens, keys_attended=cnt.dense_keys,
                    heads_q=ih, heads_kv=1, head_dim=d, act_dtype=q.index_dtype,
                    flops=2.0 * ih * d * cnt.dense_keys + 2.0 * ih * cnt.dense_keys,
                    bytes_compute=T * ih * (d * dtype_bytes(q.index_dtype) + 4.0) + cnt.scored_blocks * 4.0,
                    bytes_weight=0.0, bytes_kv=cnt.ctx_tokens * idx_tok, bytes_comm=0.0,
                    bytes_compute_written=cnt.scored_blocks * 4.0, bytes_kv_written=0.0),
            ops.row("topk", "topk", m=T, q_tokens=T, selected_blocks=cnt.selected_blocks, act_dtype="fp32",
                    flops=float(cnt.scored_blocks),
                    bytes_compute=cnt.scored_blocks * 4.0 + T * sp.topk_blocks * 4.0, bytes_weight=0.0,
                    bytes_kv=0.0, bytes_comm=0.0, bytes_compute_written=T * sp.topk_blocks * 4.0,
                    bytes_kv_written=0.0)]


def _linear_attention_rows(c: _Ctx) -> list[dict]:
    """Gated DeltaNet (Qwen3.5 linear-attention layer) on one rank: in_proj_qkvz and in_proj_ba GEMMs (vLLM's
    Qwen3.5 model runs them as four projections in_proj_qkv, in_proj_z, in_proj_b, in_proj_a of the same total
    FLOPs and bytes; Qwen3-Next's fused layout is counted), the causal depthwise conv1d over the q/k/v channels,
    the decay/beta gating kernel, the gated delta rule, the gated RMSNorm, out_proj. The recurrent
    state [vh, kd, vd] and the conv state [kernel - 1, conv_dim] of every request are read and written once per
    step (``bytes_kv``: the persistent-state plane; their size does not grow with the context)."""
    m, p, q, T, R = c.model, c.plan, c.quant, c.T, c.step.num_reqs
    a, H = m.linear, m.hidden
    kh, vh = p.linear_heads_local(m)
    kd, vd = a.key_dim, a.value_dim
    conv_dim = 2 * kh * kd + vh * vd
    w = q.weight_dtype("attn_qkv")
    state = vh * kd * vd * dtype_bytes(a.state_dtype)
    conv_state = (a.conv_kernel - 1) * conv_dim * 2.0
    return [ops.elementwise("input_norm", "norm", T * H, reads=2, writes=2, flops_per=4, m=T, hidden=H,
                            weight_elems=H),
            *_gemm("in_proj_qkvz", T, 2 * kh * kd + 2 * vh * vd, H, w),
            *_gemm("in_proj_ba", T, 2 * vh, H, w),
            ops.row("conv1d", "conv", m=T, act_dtype="bf16", w_dtype="bf16", flops=2.0 * T * conv_dim * a.conv_kernel,
                    bytes_compute=2.0 * T * conv_dim * 2.0, bytes_weight=conv_dim * a.conv_kernel * 2.0,
                    bytes_kv=2.0 * R * conv_state, bytes_comm=0.0, bytes_compute_written=T * conv_dim * 2.0,
                    bytes_kv_written=R * conv_state),
            ops.elementwise("gdn_gating", "activation", T * vh, reads=2, writes=2, flops_per=10, m=T),
            ops.row("gated_delta_rule", "linear_attention", m=T, q_tokens=T, heads_q=vh, heads_kv=kh, head_dim=kd,
                    act_dtype="bf16", w_dtype=a.state_dtype, flops=8.0 * T * vh * kd * vd,
                    bytes_compute=T * (2 * kh * kd + 2 * vh * vd + 2 * vh) * 2.0,
                    bytes_weight=2 * vh * 4.0, bytes_kv=2.0 * R * state, bytes_comm=0.0,
                    bytes_compute_written=T * vh * vd * 2.0, bytes_kv_written=R * state),
            ops.elementwise("gated_norm", "norm", T * vh * vd, reads=2, writes=1, flops_per=8, m=T, weight_elems=vd),
            *_gemm("out_proj", T, H, vh * vd, q.weight_dtype("attn_o"))]


def _ffn_rows(c: _Ctx, moe: bool) -> list[dict]:
    m, p, q, T = c.model, c.plan, c.quant, c.T
    H = m.hidden
    # on AMD the post-attention all-reduce runs fused with this norm (fused_allreduce_gemma_rms_norm,
    # amd/model.py:1377-1379); at TP1 there is no all-reduce and the norm is its own kernel
    fused_ar = {"fused_into": "allreduce_attn"} if p.tp > 1 else {}
    rows = [ops.elementwise("post_attn_norm", "norm", T * H, reads=2, writes=2, flops_per=4, m=T, hidden=H,
                            weight_elems=H, **fused_ar)]
    if not moe:
        inter = m.dense_inter // p.tp
        w = q.weight_dtype("dense_mlp")
        return rows + [*_gemm("gate_up_proj", T, 2 * inter, H, w),
                       ops.elementwise("act", "activation", T * inter, reads=2, writes=1, flops_per=8, m=T),
                       *_gemm("down_proj", T, H, inter, w)]
    r = c.routing
    rows.append(ops.gemm("router", T, m.experts, H, m.router_dtype if m.router_dtype == "fp32"
                         else q.weight_dtype("router"), kind="router"))
    w_routed, w_shared = q.weight_dtype("routed_expert"), q.weight_dtype("shared_expert")
    fused = p.fuses_shared(m, q)   # asked for, no EP, one expert format (ParallelPlan.shared_fusion_reason)
    inter = p.expert_inter_local(m)
    routed = float(r.routed_tokens(T, p.ep)[0])
    active = float(r.active_experts(T, p.ep)[0])
    hot = float(r.max_load(T, p.ep)[0])
    n_rows = p.experts_local(m)
    topk = m.topk
    if fused:  # shared expert(s) as always-selected extra rows of the grouped GEMM
        routed += T * m.n_shared
        active += m.n_shared
        hot = max(hot, float(T))
        n_rows += m.n_shared
        topk += m.n_shared
    g = dict(experts=n_rows, topk=topk, hidden=H, inter=inter, active_experts=active, max_load=hot)
    quant = ops.needs_act_quant(w_routed)
    rows.append(ops.moe_align(routed, T, topk, n_rows))
    if quant:  # the tokens are quantised once, before the gather into expert rows
        rows.append(ops.act_quant("moe_gate_up", T, H, w_routed))
    rows += [ops.grouped_gemm("moe_gate_up", routed, 2 * inter, H, w_routed, **g),
             ops.elementwise("moe_act", "activation", routed * inter, reads=2, writes=1, flops_per=8, m=routed)]
    if quant:
        rows.append(ops.act_quant("moe_down", routed, inter, w_routed))
    rows += [ops.grouped_gemm("moe_down", routed, H, inter, w_routed, **g), ops.moe_sum(routed, T, H, topk)]
    if m.n_shared and not fused:
        si = p.shared_inter_local(m)
        rows += [*_gemm("shared_gate_up", T, 2 * si, H, w_shared),
                 ops.elementwise("shared_act", "activation", T * si, reads=2, writes=1, flops_per=8, m=T),
                 *_gemm("shared_down", T, H, si, w_shared)]
    if p.ep > 1 and p.dp > 1:  # tokens travel to the experts' ranks and back
        rows += [ops.all2all("moe_dispatch", T * m.topk, H, p.ep), ops.all2all("moe_combine", T * m.topk, H, p.ep)]
    return rows


def _layer_key(m: ModelSpec, topk_source: dict, layer: int) -> tuple:
    """Layers with equal keys have identical rows: (attention kind, computes its own top-k, MLP kind)."""
    attn = m.attn_types[layer]
    return attn, attn == ATTN_SPARSE and topk_source.get(layer) == layer, m.mlp_types[layer] == MLP_MOE


def _class_rows(c: _Ctx, key: tuple) -> list[dict]:
    """Rows of one layer of structure class ``key`` (see :func:`_layer_key`)."""
    attn, computes_topk, moe = key
    m = c.model
    if attn == ATTN_LINEAR:
        rows = _linear_attention_rows(c)
    else:
        rows = _attention_rows(c, attn == ATTN_SPARSE, computes_topk)
    if c.plan.tp > 1:  # post-attention all-reduce (o_proj reduce_results=False), fused with post_attn_norm
        rows.append(ops.allreduce("allreduce_attn", c.T, m.hidden, c.plan.tp))
    rows += _ffn_rows(c, moe)
    if c.plan.tp > 1:  # FFN all-reduce, explicit on AMD (FusedMoE / dense down_proj reduce_results=True)
        rows.append(ops.allreduce("allreduce_ffn", c.T, m.hidden, c.plan.tp))
    return rows


def _edge_rows(c: _Ctx) -> tuple[list[dict], list[dict]]:
    """Embedding (+ its all-reduce) before the layers; final norm, LM head, logits gather after."""
    m, p, q, T = c.model, c.plan, c.quant, c.T
    H, R, v_local = m.hidden, c.step.num_reqs, p.vocab_local(m)
    w_emb = q.weight_dtype("embedding")
    # Vocab-parallel embedding: each rank reads only the rows its vocabulary shard owns. Assumption: token ids
    # spread evenly over the shards, so a rank reads T / tp rows on average (it still writes the [T, H] partial
    # result, zeros elsewhere, that the all-reduce sums).
    head = [ops.row("embedding", "embedding", m=T, n=H, act_dtype="bf16", w_dtype=w_emb, flops=0.0,
                    bytes_compute=T * H * 2.0 + T * 8.0, bytes_weight=T / p.tp * H * dtype_bytes(w_emb),
                    bytes_kv=0.0, bytes_comm=0.0, bytes_compute_written=T * H * 2.0, bytes_kv_written=0.0)]
    if p.tp > 1:
        head.append(ops.allreduce("allreduce_embed", T, H, p.tp))
    tail = [ops.elementwise("final_norm", "norm", T * H, reads=2, writes=1, flops_per=4, m=T, hidden=H,
                            weight_elems=H),
            ops.gemm("lm_head", R, v_local, H, q.weight_dtype("lm_head"), kind="lm_head")]
    if p.tp > 1:
        tail.append(ops.gather("logits_gather", R, v_local * p.tp, p.tp))
    for r in head + tail:
        r["layer"] = -1
    return head, tail


_TEXT_COLUMNS = ("op", "kind", "act_dtype", "w_dtype", "comm_algo", "fused_into")


def _frame(templates: list[dict], index, layers):
    """DataFrame whose row i is ``templates[index[i]]`` with ``layer = layers[i]`` (column-wise, no per-row dicts)."""
    import numpy as np
    import pandas as pd

    data = {}
    for col in COLUMNS:
        if col == "layer":
            data[col] = np.asarray(layers, dtype=np.int64)
        elif col in _TEXT_COLUMNS:
            data[col] = pd.Series(np.array([t.get(col) for t in templates], dtype=object)[index], dtype=object)
        else:
            vals = np.array([t.get(col, np.nan) for t in templates], dtype=float)
            data[col] = vals[index]
    return pd.DataFrame(data)


def build_optable(model, plan: ParallelPlan | None = None, quant="bf16", step: EngineStep | None = None,
                  routing=None):
    """OpTable of one engine step on one GPU: a pandas DataFrame with the columns of :data:`COLUMNS`.

    ``model``: ModelSpec or name; ``plan``: ParallelPlan (default TP1); ``quant``: QuantScheme or name;
    ``step``: EngineStep (default one decode at context 1); ``routing``: see ``routing.make_routing``.
    Each layer structure class is built once (the top-k source map once per build) and repeated column-wise.
    """
    import numpy as np

    model = load_model(model)
    plan = (plan or ParallelPlan()).validate(model)
    quant = load_quant(quant)
    step = step if step is not None else EngineStep.decode(1, 1)
    sp = model.sparse
    counts = attention_counts(step.new_tokens, step.context_lens, sp.block_size if sp else 0,
                              sp.topk_blocks if sp else 0)
    rt = make_routing(routing, model.experts, model.topk) if model.is_moe else None
    c = _Ctx(model, plan, quant, step, counts, rt, model.topk_source() if sp else {})
    head, tail = _edge_rows(c)
    templates = list(head)
    spans: dict = {}  # class key -> (first template index, row count)
    index, layers = [np.arange(len(head))], [np.full(len(head), -1)]
    for layer in range(model.layers):
        key = _layer_key(model, c.topk_source, layer)
        if key not in spans:
            rows = _class_rows(c, key)
            spans[key] = (len(templates), len(rows))
            templates += rows
        first, n = spans[key]
        index.append(np.arange(first, first + n))
        layers.append(np.full(n, layer))
    index.append(np.arange(len(templates), len(templates) + len(tail)))
    layers.append(np.full(len(tail), -1))
    templates += tail
    return _frame(templates, np.concatenate(index), np.concatenate(layers))
