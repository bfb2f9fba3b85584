"""vLLM's own M3 Triton kernels as implementations of the reference model's fast paths.

Each function takes the reference op's keyword arguments (``m3lab.model``) and calls vLLM's kernel entry from the
installed vLLM (imported through :mod:`m3lab.vllm_src.imports`, never copied):

- sparse attention: ``common/ops/sparse_attn.py`` ``minimax_m3_sparse_attn_decode`` (split-K
  ``_gqa_sparse_decode_kernel`` + ``_merge_topk_attn_out_kernel``) and ``minimax_m3_sparse_attn``
  (``_gqa_sparse_fwd_kernel``); the KV cache must be (or is copied into) vLLM's Triton layout
  ``[blocks, kv_heads, 128, 2*128]`` (K then V in the last axis);
- the indexer: ``common/ops/index_topk.py`` ``minimax_m3_index_decode`` (score + partial/merge top-k, one call)
  and ``minimax_m3_index_score`` + ``minimax_m3_index_topk`` (prefill). The reference model splits score and
  top-k into two ops, vLLM's decode fuses them: the ``indexer`` op runs vLLM's whole decode call and keeps its
  top-k in ``m3lab.dispatch.registry.INDEXER_HANDOFF``; the following ``topk`` op returns it;
- ``amd/ops/gemma_rmsnorm.py`` ``gemma_rmsnorm`` and ``amd/ops/swiglu_oai.py`` ``swiglu_oai_split`` (on CUDA these
  run as peers: vLLM's NVIDIA model uses FlashInfer's norm and ``SiluAndMulWithClamp``).

Shapes follow the reference: q [T, Hq, D]; k_cache/v_cache [NB, 128, Hkv, D]; blocks [Hkv, T, 16] int32 (-1 pad);
iq [T, Hi, Di]; index_cache [NB, 128, Di]; block_tables [R, W]; seq_lens [R]; cu_seqlens_q [R+1].
"""
from __future__ import annotations

from typing import Any

import torch

from m3lab.arith import ceil_div
from m3lab.dispatch.registry import INDEXER_HANDOFF, FastPathRegistry, attach_impls
from m3lab.vllm_src import install
from m3lab.vllm_src.imports import m3_module


def _ops(name: str):
    return m3_module(name, "running vLLM's M3 kernels in the reference model")


def triton_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """[NB, H, B, 2D] over the same storage when the planes are views of vLLM's Triton layout, else a copy."""
    nb, b, h, d = k_cache.shape
    kt = k_cache.permute(0, 2, 1, 3)  # [NB, H, B, D]
    st = kt.stride()
    packed = (st[3] == 1 and st[2] == 2 * d and v_cache.data_ptr() == k_cache.data_ptr() + d * k_cache.element_size()
              and v_cache.stride() == k_cache.stride())
    if packed:
        return torch.as_strided(kt, (nb, h, b, 2 * d), st, kt.storage_offset())
    return torch.cat([kt, v_cache.permute(0, 2, 1, 3)], dim=-1).contiguous()


def _decode_rows(counts: list[int]) -> int | None:
    """Rows per request when every request adds the same small number of tokens (a uniform decode batch)."""
    return counts[0] if counts and all(n == counts[0] for n in counts) and counts[0] == 1 else None


def sparse_attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, blocks=None, *, tables, starts,
                     counts, scale):
    """vLLM's Triton block-sparse GQA (decode split-K or prefill) -> o [T, Hq, D]."""
    ops = _ops("common.ops.sparse_attn")
    kv = triton_kv_cache(k_cache, v_cache)
    out = torch.full_like(q, float("nan"))  # poisoned: every row must be written
    bt, sl = block_tables.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous()
    topk = blocks.to(torch.int32).contiguous()
    heads_kv = kv.shape[1]
    rows = _decode_rows(counts)
    if rows is not None:
        ops.minimax_m3_sparse_attn_decode(q.contiguous(), kv, topk, bt, sl, heads_kv, scale, out, decode_query_len=rows)
    else:
        prefix = torch.tensor(starts, dtype=torch.int32, device=q.device)
        ops.minimax_m3_sparse_attn(q.contiguous(), kv, topk, bt, cu_seqlens_q.to(torch.int32).contiguous(), sl, prefix,
                                   max(counts), heads_kv, scale, out)
    return out


def make_indexer(topk: int, init_blocks: int, local_blocks: int):
    """The ``indexer`` op on vLLM's kernels, for a model with these top-k settings (M3: 16, 0, 1)."""

    def indexer(iq, index_cache, block_tables, seq_lens, cu_seqlens_q, *, tables, starts, counts, block_size,
                **layer_topk):  # the op's topk / init_blocks / local_blocks: the same model facts as the closure's
        ops = _ops("common.ops.index_topk")
        heads = iq.shape[1]
        bt, sl = block_tables.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous()
        max_seq = max(s + n for s, n in zip(starts, counts))
        rows = _decode_rows(counts)
        if rows is not None:
            nb = ceil_div(max_seq, block_size)
            score = torch.empty(heads, iq.shape[0], ceil_div(nb, 16) * 16, dtype=torch.float32, device=iq.device)
            sel = ops.minimax_m3_index_decode(iq.contiguous(), index_cache, bt, sl, max_seq, topk, init_blocks,
                                              local_blocks, heads, rows, rows, score_out=score)
            INDEXER_HANDOFF.scores, INDEXER_HANDOFF.topk, INDEXER_HANDOFF.prefill_args = score, sel, None
            return score
        prefix = torch.tensor(starts, dtype=torch.int32, device=iq.device)
        cu = cu_seqlens_q.to(torch.int32).contiguous()
        score = ops.minimax_m3_index_score(iq.contiguous(), index_cache, bt, cu, sl, prefix, max(counts), max_seq, heads)
        INDEXER_HANDOFF.scores, INDEXER_HANDOFF.topk, INDEXER_HANDOFF.prefill_args = score, None, (cu, prefix, max(counts))
        return score

    return indexer


def topk_blocks(scores, positions, *, block_size, topk, local_blocks, init_blocks):
    """The ``topk`` op: vLLM's decode selection (made by the indexer call) or its prefill bitonic top-k."""
    state = INDEXER_HANDOFF
    if state.scores is not scores:
        raise RuntimeError("the vLLM top-k path needs the scores of vLLM's indexer call in the same layer")
    if state.topk is not None:
        return state.topk
    cu, prefix, max_q = state.prefill_args
    return _ops("common.ops.index_topk").minimax_m3_index_topk(scores, cu, prefix, max_q, topk, init_blocks, local_blocks)


def gemma_rmsnorm(x, w, eps=1e-6):
    """vLLM's Triton Gemma RMSNorm (fp32, x (1 + w)): x [T, H] -> [T, H]."""
    return _ops("amd.ops.gemma_rmsnorm").gemma_rmsnorm(x, w, eps)


def swiglu_oai(h, alpha, limit, beta=1.0):
    """vLLM's fp32 Triton SwiGLU-OAI on [T, 2I] = [gate | up] -> [T, I] (beta: M3's swiglu_beta, vLLM default 1.0)."""
    return _ops("amd.ops.swiglu_oai").swiglu_oai_split(h, alpha=alpha, beta=1.0 if beta is None else beta, limit=limit)


def unquantized_linear(x, w, w_scale=None, *, w_format="bf16"):
    """vLLM's CUDA unquantized GEMM (``default_unquantized_gemm``: ``F.linear``, i.e. cuBLAS)."""
    return torch.nn.functional.linear(x, w.to(x.dtype))


def implementations(topk: int = 16, init_blocks: int = 0, local_blocks: int = 1) -> dict[str, Any]:
    """Registry path name -> implementation, for :func:`attach_vllm_kernels`."""
    indexer = make_indexer(topk, init_blocks, local_blocks)
    return {"attention.triton_sparse_decode": sparse_attention, "attention.triton_sparse_prefill": sparse_attention,
            "indexer.triton_decode": indexer, "indexer.triton_prefill": indexer,
            "topk.triton_decode": topk_blocks, "topk.triton_prefill": topk_blocks,
            "norm.triton_gemma_rmsnorm": gemma_rmsnorm, "activation.triton_swiglu_oai": swiglu_oai,
            "gemm.unquantized": unquantized_linear}


def attach_vllm_kernels(registry: FastPathRegistry, *, topk: int = 16, init_blocks: int = 0,
                        local_blocks: int = 1) -> dict[str, str]:
    """Attach vLLM's own M3 kernels to the registry's paths; -> {path: "ok" | error text}."""
    if not install.available():
        return {"vllm": install.problem()}
    return attach_impls(registry, implementations(topk, init_blocks, local_blocks))
