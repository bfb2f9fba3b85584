"""One nearest-M rule for every launch table keyed by token count M (GEMM and MoE alike).

vLLM's rule (``vllm/model_executor/layers/fused_moe/fused_moe.py``, ``try_get_optimal_moe_config``):
``configs[min(configs.keys(), key=lambda x: abs(x - M))]``: the key nearest ``M``; on a tie the key that comes
first in the table, which for tables written in ascending M (vLLM's and m3lab's) is the smaller M.
"""
from __future__ import annotations

from typing import Iterable


def nearest_key(keys: Iterable[int], m: int) -> int | None:
    """The key nearest ``m`` (ties: the first in ``keys``' order), None for no keys."""
    keys = list(keys)
    return min(keys, key=lambda x: abs(x - m)) if keys else None
