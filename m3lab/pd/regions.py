"""Where each KV element lives on one rank: element maps read off the model's own cache layouts.

A P/D hand-off copies bytes, so it needs, for every element of a request's KV, its byte offset on the
prefill rank and on the decode rank. This module does not restate the layouts: it allocates a two-block
:class:`m3lab.model.kv_cache.PagedKVCache` in an integer dtype of the cache's element size, writes probe
values through the cache's own ``write`` (the path the decoder uses), and reads back where each
(plane, head, token, channel) landed. Whatever layouts ``m3lab.model.kv_cache.LAYOUTS`` holds (vLLM's Triton
``[blocks, kv_heads, block, 2*head_dim]``, AITER's page-16 K/V views sharing a block) are measured, not assumed.

A :class:`Region` is one per-layer tensor on one rank: the main K/V cache (planes K, V), the replicated
index-key cache ``[blocks, block, index_dim]`` (one plane, one head), or, for fp8 with per-(head, token)
scales, the K-scale and V-scale tensors ``[kv_heads, blocks * block]`` fp32 that vLLM's Triton sparse attention
reads (``vllm/models/minimax_m3/common/ops/sparse_attn.py:492-527``). Offsets are in elements:
``block * block_stride + inner[plane, head_slot, token, channel]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from m3lab.errors import M3LabError
from m3lab.model.kv_cache import LAYOUTS, PagedKVCache

PROBE_DTYPES = {1: torch.int8, 2: torch.int16, 4: torch.int32}   # element size -> integer probe dtype
CACHE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}
SCALE_BYTES = 4   # fp32 per-(head, token) KV scales


@dataclass(frozen=True, eq=False)   # compared and hashed by identity: the constructors below are memoised
class Region:
    """One per-layer cache tensor of one rank (see the module docstring).

    name: "main" | "index" | "k_scale" | "v_scale"; esize: bytes per element; block_stride: elements from
    one block to the next; inner: int64 [planes, head_slots, block, channels] element offsets within a block
    (relative to ``block * block_stride``); heads: global head id of each slot (index: (0,), replicated).
    """

    name: str
    esize: int
    block_stride: int
    inner: np.ndarray
    heads: tuple[int, ...]
    replicated: bool = False

    @property
    def block_bytes(self) -> int:
        return self.block_stride * self.esize

    def slot(self, head: int) -> int:
        return self.heads.index(head)


def _layout_names() -> tuple[str, ...]:
    return tuple(LAYOUTS)


def check_layout(layout: str, field: str = "layout") -> str:
    names = _layout_names()
    if layout not in names:
        raise M3LabError(f"unknown KV layout {layout!r}", field=field, hint=f"one of {', '.join(names)}")
    return layout


@lru_cache(maxsize=64)
def _probe_main(layout: str, kv_heads: int, block: int, head_dim: int, esize: int) -> tuple[np.ndarray, int]:
    """Element offsets [2, H, block, D] of block 0 and the block stride, written through PagedKVCache.write."""
    dt = PROBE_DTYPES[esize]
    limit = torch.iinfo(dt).max
    if block - 1 > limit or head_dim - 1 > limit or 2 * kv_heads + 2 > limit:
        raise M3LabError(f"probe values exceed {dt}: block {block}, head_dim {head_dim}", field="block_size")

    def run(fill_k, fill_v) -> np.ndarray:
        cache = PagedKVCache(num_blocks=2, block_size=block, kv_heads=kv_heads, head_dim=head_dim,
                             index_dim=1, sparse=[False], layout=layout, dtype=dt)
        slots = torch.arange(2 * block)
        t = (slots % block)[:, None, None].expand(-1, kv_heads, head_dim)
        h = torch.arange(kv_heads)[None, :, None].expand(2 * block, -1, head_dim)
        c = torch.arange(head_dim)[None, None, :].expand(2 * block, kv_heads, -1)
        cache.write(0, slots, fill_k(t, h, c).to(dt), fill_v(t, h, c).to(dt))
        return cache.kv[0].reshape(-1).numpy().astype(np.int64)

    tok = run(lambda t, h, c: t, lambda t, h, c: t)
    chan = run(lambda t, h, c: c, lambda t, h, c: c)
    code = run(lambda t, h, c: 2 * h + 1, lambda t, h, c: 2 * h + 2)   # 0 = never written
    n = code.size
    if (code == 0).any():
        raise M3LabError(f"layout {layout!r} leaves {int((code == 0).sum())} of {n} elements unwritten",
                         field="layout")
    stride = n // 2
    pos = np.arange(n)
    inner = np.full((2, kv_heads, block, head_dim), -1, np.int64)
    plane, head = (code - 1) % 2, (code - 1) // 2
    blk = np.repeat([0, 1], stride)
    first = blk == 0
    inner[plane[first], head[first], tok[first], chan[first]] = pos[first]
    second = np.full_like(inner, -1)
    second[plane[~first], head[~first], tok[~first], chan[~first]] = pos[~first] - stride
    if (inner < 0).any() or not np.array_equal(inner, second):
        raise M3LabError(f"layout {layout!r} is not block-major (block 1 is not block 0 shifted by one stride)",
                         field="layout")
    return inner, stride


@lru_cache(maxsize=16)
def _probe_index(block: int, index_dim: int, esize: int) -> tuple[np.ndarray, int]:
    """Element offsets [1, 1, block, Di] of the index-key cache, written through PagedKVCache.write."""
    dt = PROBE_DTYPES[esize]

    def run(fill) -> np.ndarray:
        cache = PagedKVCache(num_blocks=2, block_size=block, kv_heads=1, head_dim=16, index_dim=index_dim,
                             sparse=[True], index_dtype=dt, dtype=torch.int16)
        slots = torch.arange(2 * block)
        t = (slots % block)[:, None].expand(-1, index_dim)
        c = torch.arange(index_dim)[None, :].expand(2 * block, -1)
        kv = torch.zeros(2 * block, 1, 16, dtype=torch.int16)
        cache.write(0, slots, kv, kv, fill(t, c).to(dt))
        return cache.index[0].reshape(-1).numpy().astype(np.int64)

    tok, chan = run(lambda t, c: t), run(lambda t, c: c)
    stride = tok.size // 2
    inner = np.full((1, 1, block, index_dim), -1, np.int64)
    inner[0, 0, tok[:stride], chan[:stride]] = np.arange(stride)
    if (inner < 0).any():
        raise M3LabError("the index-key cache map is not one-to-one", field="index_dim")
    return inner, stride


@lru_cache(maxsize=256)
def main_region(layout: str, heads: tuple[int, ...], block: int, head_dim: int, esize: int) -> Region:
    inner, stride = _probe_main(check_layout(layout), len(heads), block, head_dim, esize)
    return Region("main", esize, stride, inner, tuple(heads))


@lru_cache(maxsize=64)
def index_region(block: int, index_dim: int, esize: int) -> Region:
    inner, stride = _probe_index(block, index_dim, esize)
    return Region("index", esize, stride, inner, (0,), replicated=True)


@lru_cache(maxsize=64)
def scale_regions(heads: tuple[int, ...], block: int, num_blocks: int) -> tuple[Region, Region]:
    """fp32 per-(head, token) scales ``[kv_heads, num_blocks * block]`` (K and V): element (h, slot) at
    ``h * num_blocks * block + slot``, so a block's tokens are contiguous per head."""
    h = np.arange(len(heads))[:, None]
    inner = (h * num_blocks * block + np.arange(block)[None, :])[None, :, :, None].astype(np.int64)
    return (Region("k_scale", SCALE_BYTES, block, inner, tuple(heads)),
            Region("v_scale", SCALE_BYTES, block, inner, tuple(heads)))
