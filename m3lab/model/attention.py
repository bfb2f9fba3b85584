"""Attention blocks of the reference decoder: dense GQA (layers 0-2) and sparse GQA + indexer.

Varlen over the requests of a step: queries are concatenated, keys come from the paged cache
through each request's block table. The per-request math is ``kernels/sparse_attn/reference.py``
and ``kernels/indexer/reference.py``.
"""
import torch

from m3lab.kernels.indexer.reference import block_max, force_blocks, index_scores, select_topk_blocks
from m3lab.kernels.sparse_attn.reference import dense_attention_ref, sparse_attention_ref


def attention_varlen(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, blocks: torch.Tensor | None = None, *,
                     tables: list[list[int]], starts: list[int], counts: list[int], scale: float) -> torch.Tensor:
    """Causal GQA over paged K/V for R requests.

    q [T, Hq, D]; k_cache, v_cache [NB, block, Hkv, D] (cache planes); block_tables [R, W];
    seq_lens, cu_seqlens_q: the varlen metadata as tensors (the python lists tables/starts/counts carry
    the same values, so that the meta device works); blocks [Hkv, T, K] selected logical blocks
    (sparse) or None (dense). -> o [T, Hq, D].
    """
    bs = k_cache.shape[1]
    outs, off = [], 0
    for table, start, n in zip(tables, starts, counts):
        qr = q[off:off + n]
        q_pos = torch.arange(start, start + n, device=q.device)
        phys = torch.tensor(table, dtype=torch.long, device=q.device)
        if blocks is None:
            ctx = start + n
            k = k_cache[phys].flatten(0, 1)[:ctx]
            v = v_cache[phys].flatten(0, 1)[:ctx]
            outs.append(dense_attention_ref(qr, k, v, q_pos, scale))
        else:
            outs.append(sparse_attention_ref(qr, k_cache, v_cache, phys, blocks[:, off:off + n], q_pos, scale))
        off += n
    return torch.cat(outs, dim=0)


def indexer_varlen(iq: torch.Tensor, index_cache: torch.Tensor, block_tables: torch.Tensor,
                   seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, *, tables: list[list[int]],
                   starts: list[int], counts: list[int], block_size: int, topk: int | None = None,
                   init_blocks: int = 0, local_blocks: int = 1) -> torch.Tensor:
    """Block-max index scores: iq [T, Hi, Di], index_cache [NB, block, Di] -> fp32 [Hi, T, NBmax] (-inf padded).

    topk / init_blocks / local_blocks: the layer's top-k settings, for fast paths that select in the same call
    (vLLM's decode indexer); the reference scores only (``topk_blocks`` selects)."""
    width = max(len(t) for t in tables)
    outs, off = [], 0
    for table, start, n in zip(tables, starts, counts):
        phys = torch.tensor(table, dtype=torch.long, device=iq.device)
        ik = index_cache[phys].flatten(0, 1)[:start + n]  # [S, Di]
        q_pos = torch.arange(start, start + n, device=iq.device)
        s = block_max(index_scores(iq[off:off + n], ik, q_pos), block_size)
        outs.append(torch.nn.functional.pad(s, (0, width - s.shape[-1]), value=float("-inf")))
        off += n
    return torch.cat(outs, dim=1)


def topk_blocks(scores: torch.Tensor, positions: torch.Tensor, *, block_size: int, topk: int, local_blocks: int,
                init_blocks: int) -> torch.Tensor:
    """Force local/init blocks and keep the top-k: scores [Hi, T, NB], positions [T] -> int32 [Hi, T, topk]."""
    forced = force_blocks(scores, positions, block_size, local_blocks, init_blocks)
    return select_topk_blocks(forced, topk)
