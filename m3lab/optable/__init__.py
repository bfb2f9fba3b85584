"""The OpTable: one row per op per layer of one engine step, on one GPU (the single source of truth).

``build_optable(model, plan, quant, step, routing=None) -> pandas.DataFrame``. Every later view (shape
histograms, rooflines, serving estimates) is a group-by over it.

Columns (units: elements, FLOPs, bytes; NaN where not applicable):

- ``layer``: decoder layer, -1 for embedding/head ops. ``op``: name (input_norm, qkv_proj (on M3 sparse
  layers the one fused q/k/v/index GEMM), qk_norm, rope, cache_write, indexer, topk, attention, o_proj,
  allreduce_attn, post_attn_norm, gate_up_proj, act, down_proj, router, routing, page_table, moe_gate_up,
  moe_act, moe_down, shared_gate_up, shared_act, shared_down,
  moe_dispatch, moe_combine, allreduce_ffn, embedding, allreduce_embed, final_norm, lm_head, logits_gather;
  ``<gemm op>_quant`` (dynamic activation quantisation before a GEMM with quantised weights), moe_align (sort
  the (token, expert) pairs), moe_sum (weighted top-k combine); attention output gate: attn_gate;
  MLA: q_a_proj, q_a_norm, q_b_proj, q_proj, kv_a_proj, kv_a_norm, kv_b_proj; DSA indexer: indexer_q_proj,
  indexer_k_proj, indexer_k_norm; Gated DeltaNet: in_proj_qkvz, in_proj_ba, conv1d, gated_delta_rule,
  gated_norm, out_proj).
- ``kind``: gemm, grouped_gemm, attention, indexer, topk, page_table, norm, rope, activation, router, cache_write,
  quant, moe_align, moe_sum, linear_attention, conv, allreduce, allgather, all2all, embedding, lm_head.
  Dense GEMM shapes = rows with kind in {gemm, router, lm_head}.
- ``m``, ``n``, ``k``: local GEMM shape y[m, n] = x[m, k] w[n, k]^T after sharding (m = tokens; for grouped
  GEMMs m = routed (token, expert) rows; for lm_head m = requests sampled).
- ``experts``, ``topk``, ``hidden``, ``inter``: grouped GEMM problem (local expert rows incl. a fused shared
  expert; top-k incl. the shared one); ``routed_tokens`` (expected rows), ``experts_active`` (expected experts
  touched, whose weights are read), ``tokens_per_expert_max`` (mean load of the most popular expert), all
  from :mod:`.routing`.
- ``q_tokens``, ``ctx_tokens`` (sum of context lengths), ``keys_attended`` (sum over queries),
  ``selected_blocks`` (sum over queries and local KV heads), ``heads_q``, ``heads_kv``, ``head_dim``:
  attention and indexer (indexer: heads_q = local index heads, one shared key head).
- ``act_dtype``, ``w_dtype``: activation and weight dtypes (w_dtype of attention/cache rows = KV dtype).
- ``flops``; bytes in three planes: ``bytes_compute`` (activations read + written), ``bytes_weight``
  (weights read, MX scales included; norm weights too; the vocab-parallel embedding reads T / tp rows per
  rank on average, assuming token ids spread evenly over the vocabulary shards), ``bytes_kv`` (KV +
  index-key cache reads and writes; linear-attention recurrent and conv state, read + written once per
  request per step),
  ``bytes_comm`` (on-the-wire bytes per GPU = ``comm_payload`` x ``comm_factor``; ``comm_algo`` ring:
  factor 2(p-1)/p for all-reduce, gather/all2all: (p-1)/p; ``comm_group`` = p).
- ``bytes_compute_written``, ``bytes_kv_written``: the part of ``bytes_compute`` and of ``bytes_kv`` the op
  writes (outputs; cache and state writes); the rest of each is read. Weights are only read.
- ``fused_into``: the op whose kernel this op runs inside, where vLLM's AMD model fuses it (``post_attn_norm``
  -> ``allreduce_attn`` at TP > 1); empty otherwise.
- ``requests``: requests whose queries an attention, indexer or page-table row serves.
- With a :class:`~m3lab.optable.dispatch.Dispatch` (what vLLM runs for the deployment): ``decision``, ``path``
  and ``kernel`` (the fast-path resolver's label, short path id and kernels of the decision that picks the
  row's kernel), ``phase`` (decode / prefill for the attention-side rows, which a step with both launches
  apart), plus the rows vLLM adds: ``routing`` (the top-k kernel after the router) and ``page_table`` (the
  sparse page adapter's table builder, where it runs). See :mod:`m3lab.optable.dispatch`.

Per-expert token counts come from a routing model (balanced, Zipf, recorded) and are never materialised
per step; long workloads go through :mod:`m3lab.analysis.shapes`.
"""
from m3lab.optable.builder import build_optable
from m3lab.optable.dispatch import Dispatch, PathChoice
from m3lab.optable.ops import COLUMNS
from m3lab.optable.routing import Routing, balanced, make_routing, recorded, zipf

__all__ = ["COLUMNS", "Dispatch", "PathChoice", "Routing", "balanced", "build_optable", "make_routing", "recorded",
           "zipf"]
