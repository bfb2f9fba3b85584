"""Assemble the OpTable: one row per op per layer of one engine step, on one GPU (see ``m3lab.optable``).

MiniMax M3 as vLLM 0.33.0's AMD model runs it (``vllm/models/minimax_m3/amd/model.py``): sparse layers project
q, k, v, index q and index k with ONE GEMM in one weight format (``qkv_proj``, 2560 columns per rank at TP4);
index-sharing reuse layers skip the index q/k norm, index RoPE and index-key cache write but keep the GEMM's
index columns; per layer two all-reduces at TP > 1: the post-attention one fused with the post-attention
Gemma norm (``fused_allreduce_gemma_rms_norm``, column ``fused_into`` on ``post_attn_norm``) and an explicit FFN
one, followed by the next layer's fused residual add + norm (``input_norm``, its own kernel).

With a :class:`~m3lab.optable.dispatch.Dispatch` (what vLLM runs for the deployment) every row carries the
resolver's ``decision``, ``path`` and ``kernel``, and the structure follows vLLM's decisions (see
:mod:`m3lab.optable.dispatch`): fused shared expert, index-sharing reuse layers, the page-table builder, the routing
top-k kernel, and per-phase attention / indexer rows (``phase``) in a step with decodes and prefill chunks.
"""
from __future__ import annotations

from m3lab.errors import M3LabError
from m3lab.optable import ops
from m3lab.optable.ops import COLUMNS
from m3lab.optable.context import StepContext, gemm_rows
from m3lab.optable.counts import AttentionCounts, attention_counts
from m3lab.optable.dispatch import OP_DECISION, PHASED_OPS, Dispatch, layer_kind
from m3lab.optable.families import linear_attention_rows, mla_rows
from m3lab.optable.routing import make_routing
from m3lab.spec.model import ATTN_LINEAR, ATTN_SPARSE, MLP_MOE, ModelSpec, load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.quant import QuantScheme, dtype_bytes, load_quant
from m3lab.workload.step import EngineStep


def _qk_norm_weights(m: ModelSpec, p: ParallelPlan, own_index: bool) -> int:
    """q/k-norm weight elements read per layer on one rank (+ the index q/k norms where the index branch runs)."""
    w = {"per_head": 2 * m.head_dim,
         "per_layer": (p.heads_q_local(m) + p.heads_kv_local(m)) * m.head_dim}.get(m.qk_norm, 0)
    return w + (2 * m.sparse.index_dim if own_index else 0)


def _attention_rows(c: StepContext, sparse: bool, computes_topk: bool) -> list[dict]:
    m, p, q, T = c.model, c.plan, c.quant, c.T
    H, hd = m.hidden, m.head_dim
    hq, hkv = p.heads_q_local(m), p.heads_kv_local(m)
    w_qkv = q.weight_dtype("attn_qkv")
    kvb, ib = dtype_bytes(q.kv_dtype), dtype_bytes(q.index_dtype)
    rows = [ops.elementwise("input_norm", "norm", T * H, reads=2, writes=2, flops_per=4, m=T, hidden=H,
                            weight_elems=H)]
    if m.mla is not None:
        return rows + mla_rows(c, sparse, computes_topk)
    ih = p.index_heads_local(m) if sparse else 0
    own_index = sparse and computes_topk   # reuse layers skip index norm, RoPE, cache write (amd/model.py:1024-1101)
    idx_w = (ih + 1) * m.sparse.index_dim if own_index else 0
    gate = hq * hd if m.attn_output_gate else 0   # Qwen3.5: q_proj also emits a per-channel sigmoid gate
    # ONE GEMM, one weight format: q, k, v (+ index q, index k on every sparse layer, reuse layers included)
    rows += gemm_rows("qkv_proj", T, sum(p.qkv_widths(m, sparse)) + gate, H, w_qkv)
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
    kind = layer_kind(ATTN_SPARSE if sparse else "dense", ATTN_SPARSE, computes_topk)
    for phase, cnt, t, r in c.parts():
        attend = _attend_rows(c, cnt, t, r, sparse, computes_topk, kind, phase)
        rows += [dict(x, phase=phase, requests=r) for x in attend]
    if gate:
        rows.append(ops.elementwise("attn_gate", "activation", T * gate, reads=2, writes=1, flops_per=5, m=T))
    rows += gemm_rows("o_proj", T, H, hq * hd, q.weight_dtype("attn_o"))
    return rows


def _attend_rows(c: StepContext, cnt: AttentionCounts, T: int, R: int, sparse: bool, computes_topk: bool, kind: str,
                 phase: str | None) -> list[dict]:
    """Indexer, top-k, page-table builder and attention rows of ``T`` query tokens of ``R`` requests (one phase)."""
    m, p, q = c.model, c.plan, c.quant
    hd, hq, hkv = m.head_dim, p.heads_q_local(m), p.heads_kv_local(m)
    ih = p.index_heads_local(m) if sparse else 0
    kv_tok = 2 * hkv * hd * dtype_bytes(q.kv_dtype)
    idx_tok = m.sparse.index_dim * dtype_bytes(q.index_dtype) if sparse else 0
    ib = dtype_bytes(q.index_dtype)
    rows = []
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
    if sparse and c.runs("page_table", kind, phase):
        rows.insert(len(rows) - 1, _page_table_row(m, cnt, T, R, hkv))
    return rows


def _page_table_row(m: ModelSpec, cnt: AttentionCounts, T: int, R: int, hkv: int) -> dict:
    """The sparse page adapter's table builder: 128-token blocks -> page-16 ids (8 pages a block). Reads the
    top-k ids [T, hkv, K] int32, the requests' block tables and lengths; writes [T x hkv, 8K] int32."""
    i32, k = dtype_bytes("int32"), m.sparse.topk_blocks
    reads, writes = T * hkv * k * i32 + cnt.ctx_tokens / m.sparse.block_size * i32 + R * i32, T * hkv * k * 8 * i32
    return ops.row("page_table", "page_table", m=T, q_tokens=T, heads_kv=hkv, act_dtype="int32", flops=0.0,
                   bytes_compute=reads + writes, bytes_weight=0.0, bytes_kv=0.0, bytes_comm=0.0,
                   bytes_compute_written=writes, bytes_kv_written=0.0)


EMULATED_EXPERTS = "mxfp4_emulation"   # the resolver's path id of vLLM's OCP MX emulation of the experts


def _experts_emulated(c: StepContext) -> bool:
    """True when vLLM runs the step's experts through its OCP MX emulation (the Dispatch's experts path)."""
    if c.dispatch is None:
        return False
    return any(op == "experts" and ch.runs and ch.path == EMULATED_EXPERTS
               for (op, _), ch in c.dispatch.choices[c.phase].items())


def _ffn_rows(c: StepContext, moe: bool) -> list[dict]:
    m, p, q, T = c.model, c.plan, c.quant, c.T
    H = m.hidden
    # on AMD the post-attention all-reduce runs fused with this norm (fused_allreduce_gemma_rms_norm,
    # amd/model.py:1377-1379); at TP1 there is no all-reduce and the norm is its own kernel
    fused_ar = {"fused_into": "allreduce_attn"} if p.tp > 1 else {}
    rows = [ops.elementwise("post_attn_norm", "norm", T * H, reads=2, writes=2, flops_per=4, m=T, hidden=H,
                            weight_elems=H, **fused_ar)]
    if not moe:
        inter = p.dense_inter_local(m)
        w = q.weight_dtype("dense_mlp")
        return rows + [*gemm_rows("gate_up_proj", T, 2 * inter, H, w),
                       ops.elementwise("act", "activation", T * inter, reads=2, writes=1, flops_per=8, m=T),
                       *gemm_rows("down_proj", T, H, inter, w)]
    r = c.routing
    rows.append(ops.gemm("router", T, m.experts, H, m.router_dtype if m.router_dtype == "fp32"
                         else q.weight_dtype("router"), kind="router"))
    w_routed, w_shared = q.weight_dtype("routed_expert"), q.weight_dtype("shared_expert")
    # the shared expert as extra grouped-GEMM rows: as vLLM resolved it (the Dispatch's effective plan), else as
    # asked (ParallelPlan.shared_fusion_reason)
    fused = p.fuses_shared(m)
    if c.dispatch is not None:  # the routing top-k kernel: reads the fp32 logits, writes ids and weights
        rows.append(ops.row("routing", "topk", m=T, topk=m.topk, act_dtype="fp32", flops=4.0 * T * m.experts,
                            bytes_compute=T * m.experts * 4.0 + T * (m.topk + 1) * 8.0, bytes_weight=0.0,
                            bytes_kv=0.0, bytes_comm=0.0, bytes_compute_written=T * (m.topk + 1) * 8.0,
                            bytes_kv_written=0.0))
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
    # vLLM's OCP MX emulation of the experts dequantises every local expert's weights to BF16 each forward, then
    # runs its BF16 fused MoE on them (vllm/model_executor/layers/fused_moe/experts/ocp_mx_emulation_moe.py)
    emulated = _experts_emulated(c)
    w_gemm = ops.ACT if emulated else w_routed
    rows.append(ops.moe_align(routed, T, topk, n_rows))
    if quant:  # the tokens are quantised once, before the gather into expert rows
        rows.append(ops.act_quant("moe_gate_up", T, H, w_routed))
    if emulated:
        rows.append(ops.dequant("moe_gate_up", n_rows, 2 * inter, H, w_routed))
    rows += [ops.grouped_gemm("moe_gate_up", routed, 2 * inter, H, w_gemm, **g),
             ops.elementwise("moe_act", "activation", routed * inter, reads=2, writes=1, flops_per=8, m=routed)]
    if quant:
        rows.append(ops.act_quant("moe_down", routed, inter, w_routed))
    if emulated:
        rows.append(ops.dequant("moe_down", n_rows, H, inter, w_routed))
    rows += [ops.grouped_gemm("moe_down", routed, H, inter, w_gemm, **g), ops.moe_sum(routed, T, H, topk)]
    if m.n_shared and not fused:
        si = p.shared_inter_local(m)
        rows += [*gemm_rows("shared_gate_up", T, 2 * si, H, w_shared),
                 ops.elementwise("shared_act", "activation", T * si, reads=2, writes=1, flops_per=8, m=T),
                 *gemm_rows("shared_down", T, H, si, w_shared)]
    if p.ep > 1 and p.dp > 1:  # tokens travel to the experts' ranks and back
        rows += [ops.all2all("moe_dispatch", T * m.topk, H, p.ep), ops.all2all("moe_combine", T * m.topk, H, p.ep)]
    return rows


def _layer_key(m: ModelSpec, topk_source: dict, layer: int) -> tuple:
    """Layers with equal keys have identical rows: (attention kind, computes its own top-k, MLP kind)."""
    attn = m.attn_types[layer]
    return attn, attn == ATTN_SPARSE and topk_source.get(layer) == layer, m.mlp_types[layer] == MLP_MOE


def topk_sources(model: ModelSpec, dispatch: Dispatch | None = None) -> dict:
    """Sparse layer -> the layer whose top-k it uses: the model's index-sharing schedule, unless a Dispatch says
    vLLM runs no reuse layers for this deployment (then every sparse layer computes its own)."""
    if model.sparse is None:
        return {}
    if dispatch is not None and not dispatch.index_sharing:
        return {layer: layer for layer in model.sparse_layers}
    return model.topk_source()


def _annotate(c: StepContext, rows: list[dict], kind: str) -> list[dict]:
    """Add the resolver's decision, path id and kernels to every row that a decision covers (with a Dispatch).
    A row whose decision does not run (or is missing) means the OpTable and vLLM disagree: raise."""
    if c.dispatch is None:
        return rows
    out = []
    for r in rows:
        op = OP_DECISION.get(r["op"])
        if op is None:
            out.append(r)
            continue
        phase = r.get("phase") if r["op"] in PHASED_OPS and r.get("phase") else c.phase
        ch = c.dispatch.choice(op, kind, phase) or (c.dispatch.choice(op, "dense", phase) if kind == "model" else None)
        mono = c.dispatch.choice("monokernel", kind, phase)
        if (ch is None or not ch.runs) and mono is not None and mono.runs and mono.path == "mono_ffn":
            ch = mono   # the persistent FFN kernel runs the op it replaced
        if ch is None or not ch.runs:
            raise M3LabError(f"OpTable row {r['op']!r} on {kind} layers has no running vLLM decision "
                             f"({op}: {ch.status if ch else 'none'}) in the {phase} phase", field="dispatch",
                             hint="the OpTable builder and the fast-path resolver disagree; report this")
        out.append(dict(r, decision=ch.decision, path=ch.path, kernel=", ".join(ch.kernels)))
    return out


def _class_rows(c: StepContext, key: tuple) -> list[dict]:
    """Rows of one layer of structure class ``key`` (see :func:`_layer_key`), annotated from the Dispatch."""
    attn, computes_topk, moe = key
    return _annotate(c, _stock_class_rows(c, key), layer_kind(attn, ATTN_SPARSE, computes_topk))


def _stock_class_rows(c: StepContext, key: tuple) -> list[dict]:
    attn, computes_topk, moe = key
    m = c.model
    if attn == ATTN_LINEAR:
        rows = linear_attention_rows(c)
    else:
        rows = _attention_rows(c, attn == ATTN_SPARSE, computes_topk)
    if c.plan.tp > 1:  # post-attention all-reduce (o_proj reduce_results=False), fused with post_attn_norm
        rows.append(ops.allreduce("allreduce_attn", c.T, m.hidden, c.plan.tp))
    rows += _ffn_rows(c, moe)
    if c.plan.tp > 1:  # FFN all-reduce, explicit on AMD (FusedMoE / dense down_proj reduce_results=True)
        rows.append(ops.allreduce("allreduce_ffn", c.T, m.hidden, c.plan.tp))
    return rows


def _edge_rows(c: StepContext) -> tuple[list[dict], list[dict]]:
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
    return _annotate(c, head, "model"), _annotate(c, tail, "model")


_TEXT_COLUMNS = ("op", "kind", "act_dtype", "w_dtype", "comm_algo", "fused_into", "phase", "decision", "path", "kernel")


def _columns(templates: list[dict], index) -> dict:
    """Numpy columns of :data:`COLUMNS` but ``layer`` whose row i is ``templates[index[i]]`` (text: object arrays;
    numbers: float, NaN where a template lacks the column)."""
    import numpy as np

    data = {}
    for col in COLUMNS:
        if col == "layer":
            continue
        if col in _TEXT_COLUMNS:
            data[col] = np.array([t.get(col) for t in templates], dtype=object)[index]
        else:
            data[col] = np.array([t.get(col, np.nan) for t in templates], dtype=float)[index]
    return data


def _templates(model, plan, quant, step, routing, dispatch) -> tuple[list[dict], int, list[tuple[int, int]], int]:
    """The step's row templates: (templates, head rows, [(first template, row count) of each layer's structure
    class, per layer], tail rows). The head rows (layer -1) come first, then each class's rows once, in the order
    the classes first appear, then the tail rows (layer -1). See :func:`build_optable` for the arguments."""
    model = load_model(model)
    plan = (plan or ParallelPlan()).validate(model)
    if dispatch is not None:  # local widths and fusion as vLLM runs the deployment
        plan = dispatch.plan(plan)
    quant = load_quant(quant)
    step = step if step is not None else EngineStep.decode(1, 1)
    sp = model.sparse
    counts = attention_counts(step.new_tokens, step.context_lens, sp.block_size if sp else 0,
                              sp.topk_blocks if sp else 0)
    rt = make_routing(routing, model.experts, model.topk) if model.is_moe else None
    if dispatch is not None and model.sparse is None:
        raise M3LabError(f"a Dispatch describes MiniMax M3's kernels; {model.name!r} has no block-sparse attention",
                         field="dispatch")
    c = StepContext(model, plan, quant, step, counts, rt, topk_sources(model, dispatch), dispatch)
    head, tail = _edge_rows(c)
    templates = list(head)
    spans: dict = {}  # class key -> (first template index, row count)
    per_layer = []
    for layer in range(model.layers):
        key = _layer_key(model, c.topk_source, layer)
        if key not in spans:
            rows = _class_rows(c, key)
            spans[key] = (len(templates), len(rows))
            templates += rows
        per_layer.append(spans[key])
    return templates + tail, len(head), per_layer, len(tail)


def build_optable(model, plan: ParallelPlan | None = None, quant="bf16", step: EngineStep | None = None,
                  routing=None, dispatch: Dispatch | None = None):
    """OpTable of one engine step on one GPU: a pandas DataFrame with the columns of :data:`COLUMNS`.

    ``model``: ModelSpec or name; ``plan``: ParallelPlan (default TP1); ``quant``: QuantScheme or name;
    ``step``: EngineStep (default one decode at context 1); ``routing``: see ``routing.make_routing``;
    ``dispatch``: what vLLM runs for the deployment (:mod:`m3lab.optable.dispatch`; None: the spec's structure,
    no decision columns). Each layer structure class is built once and repeated column-wise.
    """
    import numpy as np
    import pandas as pd

    templates, n_head, per_layer, n_tail = _templates(model, plan, quant, step, routing, dispatch)
    index = [np.arange(n_head)] + [np.arange(first, first + n) for first, n in per_layer] \
        + [np.arange(len(templates) - n_tail, len(templates))]
    layers = [np.full(n_head, -1)] + [np.full(n, layer) for layer, (_, n) in enumerate(per_layer)] \
        + [np.full(n_tail, -1)]
    data = {"layer": np.concatenate(layers).astype(np.int64)} | _columns(templates, np.concatenate(index))
    return pd.DataFrame({col: pd.Series(data[col], dtype=object) if col in _TEXT_COLUMNS else data[col]
                         for col in COLUMNS})


def class_columns(model, plan: ParallelPlan | None = None, quant="bf16", step: EngineStep | None = None,
                  routing=None, dispatch: Dispatch | None = None) -> dict:
    """The OpTable of :func:`build_optable` reduced to one layer per structure class, as numpy columns (what the
    cost model consumes; no DataFrame): the rows of the first layer of each class, in OpTable order, and a
    ``calls`` column (float [rows]) = the layers of the row's class (1 for the embedding and head rows)."""
    import numpy as np

    templates, n_head, per_layer, n_tail = _templates(model, plan, quant, step, routing, dispatch)
    first_layer: dict = {}
    for layer, span in enumerate(per_layer):
        first_layer.setdefault(span, layer)
    uses = {span: sum(1 for s in per_layer if s == span) for span in first_layer}
    layer = np.full(len(templates), -1, dtype=np.int64)
    calls = np.ones(len(templates))
    for (first, n), lay in first_layer.items():
        layer[first:first + n], calls[first:first + n] = lay, uses[(first, n)]
    data = {"layer": layer} | _columns(templates, np.arange(len(templates)))
    return {col: data[col] for col in COLUMNS} | {"calls": calls}
