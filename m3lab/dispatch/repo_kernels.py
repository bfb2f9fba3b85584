"""This repo's indexer kernels as the reference model's ``indexer`` and ``topk`` fast paths.

The reference model splits the indexer into two ops (block-max scores, then top-k); vLLM's decode indexer
(``common/ops/index_topk.py`` ``minimax_m3_index_decode``) scores and selects in one call. So do these: at
decode (one query row per request) :func:`indexer` launches the score kernel and the top-k kernel
(``kernels/indexer``) and leaves the selection in ``m3lab.dispatch.registry.INDEXER_HANDOFF``; the layer's
``topk`` op (path ``topk.triton_decode``) returns it without a launch. At prefill the indexer scores only and the
``topk`` op (``topk.triton_prefill``) launches the top-k kernel. The other fast paths attach the kernels'
launchers directly (``m3lab.dispatch.registry.REPO_KERNELS``).

Shapes as the references (``m3lab.model.attention``): iq [T, Hi, Di]; index_cache [NB, block, Di]; block_tables
[R, W]; seq_lens [R]; cu_seqlens_q [R+1] -> scores fp32 [Hi, T, NBmax]; top-k int32 [Hi, T, K] (-1 unused).
"""
import torch

from m3lab.dispatch.registry import INDEXER_HANDOFF


def indexer(iq: torch.Tensor, index_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
            cu_seqlens_q: torch.Tensor, *, tables: list[list[int]], starts: list[int], counts: list[int],
            block_size: int, topk: int, init_blocks: int, local_blocks: int) -> torch.Tensor:
    """Scores (and at decode the top-k, handed to the ``topk`` op) -> fp32 [Hi, T, NBmax], -inf past each row."""
    from m3lab.kernels.indexer import launcher  # local: pulls in triton
    scores = launcher.indexer_varlen(iq, index_cache, block_tables, seq_lens, cu_seqlens_q, tables=tables,
                                     starts=starts, counts=counts, block_size=block_size)
    selected = None
    if counts and all(n == 1 for n in counts):
        selected = launcher.select_topk(scores, block_tables.to(torch.int32), seq_lens.to(torch.int32),
                                        cu_seqlens_q.to(torch.int32), block_size=block_size, topk=topk,
                                        local_blocks=local_blocks, init_blocks=init_blocks, max_q_len=1,
                                        max_seq_len=max(s + n for s, n in zip(starts, counts))).topk
    INDEXER_HANDOFF.scores, INDEXER_HANDOFF.topk, INDEXER_HANDOFF.prefill_args = scores, selected, None
    return scores


def topk_blocks(scores: torch.Tensor, positions: torch.Tensor, *, block_size: int, topk: int, local_blocks: int,
                init_blocks: int) -> torch.Tensor:
    """The selection the indexer call made (decode), else the top-k kernel on ``scores`` -> int32 [Hi, T, topk]."""
    if INDEXER_HANDOFF.scores is scores and INDEXER_HANDOFF.topk is not None:
        return INDEXER_HANDOFF.topk
    from m3lab.kernels.indexer import launcher  # local: pulls in triton
    return launcher.topk_blocks(scores, positions, block_size=block_size, topk=topk, local_blocks=local_blocks,
                                init_blocks=init_blocks)
