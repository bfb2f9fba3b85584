"""Closed-form per-step attention counts (no per-token loops), vectorised over the requests of a step.

Request i computes queries at positions p in [a_i, b_i) with a_i = context - new, b_i = context.
Dense causal attention: query p attends p + 1 keys. M3 sparse attention with block size B and top-K blocks
(own block forced, as vLLM ``vllm/models/minimax_m3/common/sparse_attention.py``): p + 1 keys while p < K*B, else (K-1)*B + (p mod B) + 1.
The indexer scores p // B + 1 blocks per query; the selection keeps min(p // B + 1, K) of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _sum_div(x: np.ndarray, B: int) -> np.ndarray:
    """sum_{p < x} floor(p / B)."""
    q, r = np.divmod(x, B)
    return B * q * (q - 1) // 2 + q * r


def _sum_pos1(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_{a <= p < b} (p + 1)."""
    return (b * (b + 1) - a * (a + 1)) // 2


def _sum_mod(a: np.ndarray, b: np.ndarray, B: int) -> np.ndarray:
    """sum_{a <= p < b} (p mod B)."""
    def upto(x):
        return x * (x - 1) // 2 - B * _sum_div(x, B)
    return upto(b) - upto(a)


@dataclass(frozen=True)
class AttentionCounts:
    """Totals over all queries of a step (per request arrays where noted)."""

    q_tokens: int            # new tokens (queries)
    ctx_tokens: int          # sum of context lengths (keys in cache after the step)
    dense_keys: int          # sum over queries of keys attended by causal dense attention
    sparse_keys: int         # ... by block-sparse attention (0 without a sparse config)
    scored_blocks: int       # sum over queries of blocks the indexer scores
    selected_blocks: int     # sum over queries of blocks kept by top-k
    sparse_read_tokens: int  # sum over requests of min(context, keys its queries attend): K/V tokens read


def attention_counts(new_tokens: np.ndarray, context_lens: np.ndarray, block_size: int = 0,
                     topk_blocks: int = 0) -> AttentionCounts:
    """Counts for one step; ``block_size``/``topk_blocks`` 0 means no sparse attention."""
    n = np.asarray(new_tokens, dtype=np.int64)
    b = np.asarray(context_lens, dtype=np.int64)
    a = b - n
    dense = _sum_pos1(a, b)
    if not block_size:
        return AttentionCounts(int(n.sum()), int(b.sum()), int(dense.sum()), 0, 0, 0, 0)
    B, K = int(block_size), int(topk_blocks)
    s = K * B
    lo_b = np.minimum(b, s)
    lo_a = np.minimum(a, s)
    hi_a = np.maximum(a, s)
    hi_n = np.maximum(b - hi_a, 0)
    sparse = _sum_pos1(lo_a, lo_b) + hi_n * ((K - 1) * B + 1) + _sum_mod(hi_a, np.maximum(b, hi_a), B)
    scored = _sum_div(b, B) - _sum_div(a, B) + n
    selected = (_sum_div(lo_b, B) - _sum_div(lo_a, B) + (lo_b - lo_a)) + K * hi_n
    return AttentionCounts(int(n.sum()), int(b.sum()), int(dense.sum()), int(sparse.sum()), int(scored.sum()),
                           int(selected.sum()), int(np.minimum(b, sparse).sum()))
