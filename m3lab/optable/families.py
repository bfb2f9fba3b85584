"""OpTable rows of the attention of other model families: DeepSeek MLA (and DSA's lightning indexer) and Gated
DeltaNet linear attention (Qwen3.5). MiniMax M3's rows are in :mod:`m3lab.optable.builder`."""
from __future__ import annotations

from m3lab.optable import ops
from m3lab.optable.context import StepContext, gemm_rows
from m3lab.spec.quant import dtype_bytes


def mla_rows(c: StepContext, sparse: bool = False, computes_topk: bool = False) -> list[dict]:
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
        rows += [*gemm_rows("q_a_proj", T, a.q_lora_rank, H, w),
                 ops.elementwise("q_a_norm", "norm", T * a.q_lora_rank, reads=1, writes=1, flops_per=4, m=T,
                                 weight_elems=a.q_lora_rank),
                 *gemm_rows("q_b_proj", T, hq * qk, a.q_lora_rank, w)]
    else:
        rows += gemm_rows("q_proj", T, hq * qk, H, w)
    lat = a.kv_lora_rank + a.qk_rope_head_dim
    kvb = dtype_bytes(q.kv_dtype)
    cnt = c.counts
    rows += [*gemm_rows("kv_a_proj", T, lat, H, w),
             ops.elementwise("kv_a_norm", "norm", T * a.kv_lora_rank, reads=1, writes=1, flops_per=4, m=T,
                             weight_elems=a.kv_lora_rank),
             *gemm_rows("kv_b_proj", T, hq * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, w)]
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
    rows += gemm_rows("o_proj", T, H, hq * a.v_head_dim, q.weight_dtype("attn_o"))
    return rows


def _dsa_indexer_rows(c: StepContext, idx_tok: float) -> list[dict]:
    """DeepSeek sparse attention's lightning indexer on a layer that computes its own top-k: index q from the
    q latent (wq_b), index k and per-head weights from the hidden state (wk + weights_proj, one GEMM), a
    LayerNorm on k, head-weighted ReLU scores of every cached key, and a token-level top-k."""
    m, p, q, T = c.model, c.plan, c.quant, c.T
    sp, a, cnt = m.sparse, m.mla, c.counts
    ih, d = p.index_heads_local(m), sp.index_dim
    w_idx = q.weight_dtype("indexer_qk")
    q_in = a.q_lora_rank or m.hidden
    return [*gemm_rows("indexer_q_proj", T, ih * d, q_in, w_idx),
            *gemm_rows("indexer_k_proj", T, d + ih, m.hidden, w_idx),
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


def linear_attention_rows(c: StepContext) -> list[dict]:
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
            *gemm_rows("in_proj_qkvz", T, 2 * kh * kd + 2 * vh * vd, H, w),
            *gemm_rows("in_proj_ba", T, 2 * vh, H, w),
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
            *gemm_rows("out_proj", T, H, vh * vd, q.weight_dtype("attn_o"))]
