"""Assemble the OpTable: one row per op per layer of one engine step, on one GPU (see ``m3lab.optable``)."""
from __future__ import annotations

from dataclasses import dataclass

from m3lab.optable import ops
from m3lab.optable.counts import AttentionCounts, attention_counts
from m3lab.optable.routing import Routing, make_routing
from m3lab.spec.model import ATTN_SPARSE, MLP_MOE, ModelSpec, load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.quant import QuantScheme, dtype_bytes, load_quant
from m3lab.workload.step import EngineStep

COLUMNS = ("layer", "op", "kind", "m", "n", "k", "experts", "topk", "hidden", "inter", "routed_tokens",
           "experts_active", "tokens_per_expert_max", "q_tokens", "ctx_tokens", "keys_attended",
           "selected_blocks", "heads_q", "heads_kv", "head_dim", "act_dtype", "w_dtype", "flops",
           "bytes_compute", "bytes_weight", "bytes_kv", "bytes_comm", "comm_payload", "comm_factor", "comm_algo",
           "comm_group")


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


def _attention_rows(c: _Ctx, sparse: bool, computes_topk: bool) -> list[dict]:
    m, p, q, T = c.model, c.plan, c.quant, c.T
    H, hd = m.hidden, m.head_dim
    hq, hkv = p.heads_q_local(m), p.heads_kv_local(m)
    w_qkv, w_idx = q.weight_dtype("attn_qkv"), q.weight_dtype("indexer_qk")
    kvb, ib = dtype_bytes(q.kv_dtype), dtype_bytes(q.index_dtype)
    rows = [ops.elementwise("input_norm", "norm", T * H, reads=2, writes=2, flops_per=4, m=T, hidden=H)]
    if m.mla is not None:
        return rows + _mla_rows(c)
    ih = p.index_heads_local(m) if sparse else 0
    idx_w = (ih + 1) * m.sparse.index_dim if sparse else 0
    fused_idx = sparse and w_idx == w_qkv
    rows.append(ops.gemm("qkv_proj", T, (hq + 2 * hkv) * hd + (idx_w if fused_idx else 0), H, w_qkv))
    if sparse and not fused_idx:
        rows.append(ops.gemm("indexer_qk_proj", T, idx_w, H, w_idx))
    normed = (hq + hkv) * hd + idx_w
    if m.qk_norm:
        rows.append(ops.elementwise("qk_norm", "norm", T * normed, reads=1, writes=1, flops_per=4, m=T))
    if m.rotary_dim:
        rot = (hq + hkv + (ih + 1 if sparse else 0)) * m.rotary_dim
        rows.append(ops.elementwise("rope", "rope", T * rot, reads=1, writes=1, flops_per=3, m=T))
    kv_tok = 2 * hkv * hd * kvb                          # main K/V bytes per token per layer on this rank
    idx_tok = m.sparse.index_dim * ib if sparse else 0   # index-key bytes per token (replicated)
    rows.append(ops.row("cache_write", "cache_write", m=T, act_dtype="bf16", w_dtype=q.kv_dtype, flops=0.0,
                        bytes_compute=T * (2 * hkv * hd + (m.sparse.index_dim if sparse else 0)) * 2.0,
                        bytes_weight=0.0, bytes_kv=T * (kv_tok + idx_tok), bytes_comm=0.0))
    cnt = c.counts
    if sparse and computes_topk:
        sp = m.sparse
        rows.append(ops.row("indexer", "indexer", m=T, q_tokens=T, ctx_tokens=cnt.ctx_tokens,
                            keys_attended=cnt.dense_keys, heads_q=ih, heads_kv=1, head_dim=sp.index_dim,
                            act_dtype=q.index_dtype, flops=2.0 * ih * sp.index_dim * cnt.dense_keys,
                            bytes_compute=T * ih * sp.index_dim * ib + cnt.scored_blocks * ih * 4.0,
                            bytes_weight=0.0, bytes_kv=cnt.ctx_tokens * idx_tok, bytes_comm=0.0))
        rows.append(ops.row("topk", "topk", m=T, q_tokens=T, selected_blocks=cnt.selected_blocks * hkv,
                            heads_kv=hkv, act_dtype="fp32", flops=float(cnt.scored_blocks * ih),
                            bytes_compute=cnt.scored_blocks * ih * 4.0 + T * ih * sp.topk_blocks * 4.0,
                            bytes_weight=0.0, bytes_kv=0.0, bytes_comm=0.0))
    keys = cnt.sparse_keys if sparse else cnt.dense_keys
    read_tok = cnt.sparse_read_tokens if sparse else cnt.ctx_tokens
    rows.append(ops.row("attention", "attention", m=T, q_tokens=T, ctx_tokens=cnt.ctx_tokens, keys_attended=keys,
                        selected_blocks=cnt.selected_blocks * hkv if sparse else float("nan"),
                        heads_q=hq, heads_kv=hkv, head_dim=hd, act_dtype="bf16", w_dtype=q.kv_dtype,
                        flops=4.0 * hq * hd * keys,
                        bytes_compute=2.0 * T * hq * hd * 2 + (T * hkv * m.sparse.topk_blocks * 4.0 if sparse else 0),
                        bytes_weight=0.0, bytes_kv=read_tok * kv_tok, bytes_comm=0.0))
    rows.append(ops.gemm("o_proj", T, H, hq * hd, q.weight_dtype("attn_o")))
    return rows


def _mla_rows(c: _Ctx) -> list[dict]:
    """DeepSeek MLA (non-absorbed prefill form; an approximation for decode)."""
    m, p, q, T = c.model, c.plan, c.quant, c.T
    a, H, hq = m.mla, m.hidden, p.heads_q_local(m)
    w = q.weight_dtype("attn_qkv")
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    rows = []
    if a.q_lora_rank:
        rows += [ops.gemm("q_a_proj", T, a.q_lora_rank, H, w), ops.gemm("q_b_proj", T, hq * qk, a.q_lora_rank, w)]
    else:
        rows.append(ops.gemm("q_proj", T, hq * qk, H, w))
    lat = a.kv_lora_rank + a.qk_rope_head_dim
    kvb = dtype_bytes(q.kv_dtype)
    cnt = c.counts
    rows += [ops.gemm("kv_a_proj", T, lat, H, w),
             ops.gemm("kv_b_proj", T, hq * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, w),
             ops.row("cache_write", "cache_write", m=T, act_dtype="bf16", w_dtype=q.kv_dtype, flops=0.0,
                     bytes_compute=T * lat * 2.0, bytes_weight=0.0, bytes_kv=T * lat * kvb, bytes_comm=0.0),
             ops.row("attention", "attention", m=T, q_tokens=T, ctx_tokens=cnt.ctx_tokens,
                     keys_attended=cnt.dense_keys, heads_q=hq, heads_kv=1, head_dim=qk, act_dtype="bf16",
                     w_dtype=q.kv_dtype, flops=2.0 * hq * (qk + a.v_head_dim) * cnt.dense_keys,
                     bytes_compute=T * hq * (qk + a.v_head_dim) * 2.0, bytes_weight=0.0,
                     bytes_kv=cnt.ctx_tokens * lat * kvb, bytes_comm=0.0),
             ops.gemm("o_proj", T, H, hq * a.v_head_dim, q.weight_dtype("attn_o"))]
    return rows


def _ffn_rows(c: _Ctx, moe: bool) -> list[dict]:
    m, p, q, T = c.model, c.plan, c.quant, c.T
    H = m.hidden
    rows = [ops.elementwise("post_attn_norm", "norm", T * H, reads=2, writes=2, flops_per=4, m=T, hidden=H)]
    if not moe:
        inter = m.dense_inter // p.tp
        w = q.weight_dtype("dense_mlp")
        return rows + [ops.gemm("gate_up_proj", T, 2 * inter, H, w),
                       ops.elementwise("act", "activation", T * inter, reads=2, writes=1, flops_per=8, m=T),
                       ops.gemm("down_proj", T, H, inter, w)]
    r = c.routing
    rows.append(ops.gemm("router", T, m.experts, H, m.router_dtype if m.router_dtype == "fp32"
                         else q.weight_dtype("router"), kind="router"))
    w_routed, w_shared = q.weight_dtype("routed_expert"), q.weight_dtype("shared_expert")
    fused = p.fuses_shared(m) and w_shared == w_routed
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
    rows += [ops.grouped_gemm("moe_gate_up", routed, 2 * inter, H, w_routed, **g),
             ops.elementwise("moe_act", "activation", routed * inter, reads=2, writes=1, flops_per=8, m=routed),
             ops.grouped_gemm("moe_down", routed, H, inter, w_routed, **g)]
    if m.n_shared and not fused:
        si = p.shared_inter_local(m)
        rows += [ops.gemm("shared_gate_up", T, 2 * si, H, w_shared),
                 ops.elementwise("shared_act", "activation", T * si, reads=2, writes=1, flops_per=8, m=T),
                 ops.gemm("shared_down", T, H, si, w_shared)]
    if p.ep > 1 and p.dp > 1:  # tokens travel to the experts' ranks and back
        rows += [ops.all2all("moe_dispatch", T * m.topk, H, p.ep), ops.all2all("moe_combine", T * m.topk, H, p.ep)]
    return rows


def _layer_rows(c: _Ctx, layer: int, cache: dict) -> list[dict]:
    m = c.model
    sparse = m.attn_types[layer] == ATTN_SPARSE
    key = (sparse, sparse and c.topk_source.get(layer) == layer, m.mlp_types[layer] == MLP_MOE)
    if key not in cache:
        rows = _attention_rows(c, key[0], key[1])
        if c.plan.tp > 1:
            rows.append(ops.allreduce("allreduce_attn", c.T, m.hidden, c.plan.tp))
        rows += _ffn_rows(c, key[2])
        if c.plan.tp > 1:
            rows.append(ops.allreduce("allreduce_ffn", c.T, m.hidden, c.plan.tp))
        cache[key] = rows
    return [dict(r, layer=layer) for r in cache[key]]


def _edge_rows(c: _Ctx) -> tuple[list[dict], list[dict]]:
    """Embedding (+ its all-reduce) before the layers; final norm, LM head, logits gather after."""
    m, p, q, T = c.model, c.plan, c.quant, c.T
    H, R, v_local = m.hidden, c.step.num_reqs, p.vocab_local(m)
    w_emb = q.weight_dtype("embedding")
    head = [ops.row("embedding", "embedding", m=T, n=H, act_dtype="bf16", w_dtype=w_emb, flops=0.0,
                    bytes_compute=T * H * 2.0 + T * 8.0, bytes_weight=T * H * dtype_bytes(w_emb), bytes_kv=0.0,
                    bytes_comm=0.0)]
    if p.tp > 1:
        head.append(ops.allreduce("allreduce_embed", T, H, p.tp))
    tail = [ops.elementwise("final_norm", "norm", T * H, reads=2, writes=1, flops_per=4, m=T, hidden=H),
            ops.gemm("lm_head", R, v_local, H, q.weight_dtype("lm_head"), kind="lm_head")]
    if p.tp > 1:
        tail.append(ops.gather("logits_gather", R, v_local * p.tp, p.tp))
    for r in head + tail:
        r["layer"] = -1
    return head, tail


def build_optable(model, plan: ParallelPlan | None = None, quant="bf16", step: EngineStep | None = None,
                  routing=None):
    """OpTable of one engine step on one GPU: a pandas DataFrame with the columns of :data:`COLUMNS`.

    ``model``: ModelSpec or name; ``plan``: ParallelPlan (default TP1); ``quant``: QuantScheme or name;
    ``step``: EngineStep (default one decode at context 1); ``routing``: see ``routing.make_routing``.
    """
    import pandas as pd

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
    cache: dict = {}
    rows = head + [r for layer in range(model.layers) for r in _layer_rows(c, layer, cache)] + tail
    df = pd.DataFrame.from_records(rows, columns=list(COLUMNS))
    for col in ("op", "kind", "act_dtype", "w_dtype", "comm_algo"):
        df[col] = df[col].astype(object).where(df[col].notna(), None)
    df["layer"] = df["layer"].astype("int64")
    return df
