"""Paged KV cache with an index-key side cache, in vLLM 0.33.0's MiniMax M3 layouts.

Main K/V cache per layer, one tensor in a named layout (:data:`LAYOUTS`):

- ``"triton"`` (the default): ``[num_blocks, kv_heads, block, 2 * head_dim]``, K in ``[..., :head_dim]`` and V in
  ``[..., head_dim:]`` (``vllm/models/minimax_m3/common/ops/sparse_attn.py:10-12``), read by vLLM's Triton
  sparse-attention kernels.
- ``"aiter"``: AITER paged sparse attention. The KV manager allocates two head slots per block, K then V
  (``FullAttentionSpec(num_head_slots=2)``, block-interleaved LBHNC, ``common/sparse_attention.py:173-183``):
  ``[num_blocks, 2, block, kv_heads * head_dim]``. vLLM views it as 16-token pages
  (``amd/model.py:857-909``): K ``[phys16, kv_heads, head_dim / x, 16, x]`` and V
  ``[phys16, kv_heads, 16 / x, head_dim, x]`` with ``x = 16 // element_size`` and ``phys16 = 2 * num_blocks *
  block / 16``; the V view starts half a block later, so page id ``2 * (block / 16) * b + j`` addresses the
  j-th 16-token page of block b in both views (:meth:`PagedKVCache.aiter_pages`).

Sparse layers also own an index-key cache ``[num_blocks, block, index_dim]`` (one key head, replicated;
``common/indexer.py:118-153``), allocated on every sparse layer, also on index-sharing reuse layers. A sequence
owns a list of physical blocks (its block table); token position p lives in block table[p // block] at offset
p % block.
"""
from dataclasses import dataclass
from typing import Callable

import torch

from m3lab.arith import ceil_div
from m3lab.errors import M3LabError

PAGE = 16  # token page of AITER's paged-attention kernels
DEFAULT_LAYOUT = "triton"


def _x(t: torch.Tensor) -> int:
    """AITER's vector width: 16 bytes of elements (8 for bf16, 4 for fp32, 16 for fp8)."""
    return 16 // t.element_size()


@dataclass(frozen=True)
class Layout:
    """A main-cache layout: allocation shape, K/V planes as [NB, block, H, D] and a token write."""

    name: str
    shape: Callable[[int, int, int, int], tuple[int, ...]]        # (num_blocks, block, heads, dim) -> shape
    planes: Callable[[torch.Tensor, int, int], tuple[torch.Tensor, torch.Tensor]]  # (cache, heads, dim) -> k, v
    write: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
    planes_are_views: bool


def _triton_planes(c: torch.Tensor, h: int, d: int):
    return c[..., :d].permute(0, 2, 1, 3), c[..., d:].permute(0, 2, 1, 3)


def _triton_write(c, b, o, k, v):
    d = k.shape[-1]
    c[b, :, o, :d] = k.to(c.dtype)
    c[b, :, o, d:] = v.to(c.dtype)


def _aiter_k6(c: torch.Tensor, h: int, d: int) -> torch.Tensor:
    """[NB, 2, block, H*D] -> [NB, 2, block/16, H, D/x, 16, x] (K pages read through slot 0)."""
    nb, _, block, _ = c.shape
    x = _x(c)
    return c.view(nb, 2, block // PAGE, h, d // x, PAGE, x)


def _aiter_v6(c: torch.Tensor, h: int, d: int) -> torch.Tensor:
    """[NB, 2, block, H*D] -> [NB, 2, block/16, H, 16/x, D, x] (V pages read through slot 1)."""
    nb, _, block, _ = c.shape
    x = _x(c)
    return c.view(nb, 2, block // PAGE, h, PAGE // x, d, x)


def _aiter_planes(c: torch.Tensor, h: int, d: int):
    nb, _, block, _ = c.shape
    k = _aiter_k6(c, h, d)[:, 0].permute(0, 1, 4, 2, 3, 5).reshape(nb, block, h, d)
    v = _aiter_v6(c, h, d)[:, 1].permute(0, 1, 3, 5, 2, 4).reshape(nb, block, h, d)
    return k, v


def _aiter_write(c, b, o, k, v):
    n, h, d = k.shape
    x = _x(c)
    j, t = o // PAGE, o % PAGE
    _aiter_k6(c, h, d)[b, 0, j, :, :, t, :] = k.to(c.dtype).reshape(n, h, d // x, x)
    _aiter_v6(c, h, d)[b, 1, j, :, t // x, :, t % x] = v.to(c.dtype)


LAYOUTS = {
    "triton": Layout("triton", lambda nb, b, h, d: (nb, h, b, 2 * d), _triton_planes, _triton_write, True),
    "aiter": Layout("aiter", lambda nb, b, h, d: (nb, 2, b, h * d), _aiter_planes, _aiter_write, False),
}


class PagedKVCache:
    """Paged K/V (+ index-key) cache for the layers of one rank.

    sparse: per layer, whether it has an index-key cache. kv_heads, head_dim, index_dim: local widths.
    """

    def __init__(self, *, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, index_dim: int,
                 sparse: list[bool], layout: str = DEFAULT_LAYOUT, dtype: torch.dtype = torch.bfloat16,
                 index_dtype: torch.dtype | None = None, device: str | torch.device = "cpu"):
        if layout not in LAYOUTS:
            raise M3LabError(f"unknown KV layout {layout!r}", field="layout", hint=f"one of {sorted(LAYOUTS)}")
        self.layout = LAYOUTS[layout]
        self.num_blocks, self.block_size, self.head_dim, self.kv_heads = num_blocks, block_size, head_dim, kv_heads
        shape = self.layout.shape(num_blocks, block_size, kv_heads, head_dim)
        self.kv = [torch.zeros(shape, dtype=dtype, device=device) for _ in sparse]
        if layout == "aiter":
            x = 16 // self.kv[0].element_size() if self.kv else 1
            if block_size % PAGE or head_dim % x or PAGE % x:
                raise M3LabError(f"the AITER layout needs block_size % 16 == 0 and head_dim % {x} == 0 "
                                 f"(got {block_size}, {head_dim})", field="layout", hint="use the triton layout")
        self.index = [torch.zeros(num_blocks, block_size, index_dim, dtype=index_dtype or dtype, device=device)
                      if s else None for s in sparse]
        self.free = list(range(num_blocks))
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    # --- allocation -------------------------------------------------------------------------
    def append(self, seq: int, n: int) -> int:
        """Reserve n more tokens for sequence ``seq``; returns the first new position."""
        start = self.lengths.get(seq, 0)
        table = self.tables.setdefault(seq, [])
        need = ceil_div(start + n, self.block_size) - len(table)
        if need > len(self.free):
            raise M3LabError(f"KV cache out of blocks: sequence {seq} needs {need} more, {len(self.free)} free",
                             field="num_blocks", hint="allocate the cache with a larger num_blocks")
        table.extend(self.free.pop(0) for _ in range(need))
        self.lengths[seq] = start + n
        return start

    def block_table(self, seq: int, device=None) -> torch.Tensor:
        """Physical block ids of a sequence, int64 [n_logical]."""
        return torch.tensor(self.tables[seq], dtype=torch.long, device=device or self.kv[0].device)

    def slots(self, seq: int, start: int, n: int) -> torch.Tensor:
        """Flat slot ids (block * block_size + offset) of positions start .. start+n-1, int64 [n] on the CPU."""
        pos = torch.arange(start, start + n)
        table = torch.tensor(self.tables[seq], dtype=torch.long)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    # --- views --------------------------------------------------------------------------------
    def k_plane(self, layer: int) -> torch.Tensor:
        """K of a layer as [NB, block, H, D] (a view in the Triton layout, a copy in the AITER one)."""
        return self.layout.planes(self.kv[layer], self.kv_heads, self.head_dim)[0]

    def v_plane(self, layer: int) -> torch.Tensor:
        """V of a layer as [NB, block, H, D] (a view in the Triton layout, a copy in the AITER one)."""
        return self.layout.planes(self.kv[layer], self.kv_heads, self.head_dim)[1]

    def aiter_pages(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The AITER page-16 views of a layer (as ``amd/model.py:857-909`` builds them, no copy):
        K [phys16, H, D/x, 16, x] and V [phys16, H, 16/x, D, x] (V starts half a block later)."""
        if self.layout.name != "aiter":
            raise M3LabError(f"page-16 views exist only in the aiter layout, not {self.layout.name!r}",
                             field="layout")
        c = self.kv[layer]
        x, phys16 = _x(c), 2 * self.num_blocks * (self.block_size // PAGE)
        k = c.view(phys16, self.kv_heads, self.head_dim // x, PAGE, x)
        v = c.view(phys16, self.kv_heads, PAGE // x, self.head_dim, x)[self.block_size // PAGE:]
        return k, v

    # --- writes and reads -----------------------------------------------------------------------
    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              ik: torch.Tensor | None = None) -> None:
        """Store k, v [n, H, D] (and index keys ik [n, Di]) at flat slots [n]."""
        slots = slots.to(self.kv[layer].device)
        b, o = slots // self.block_size, slots % self.block_size
        self.layout.write(self.kv[layer], b, o, k, v)
        if ik is not None:
            self.index[layer][b, o] = ik.to(self.index[layer].dtype)

    def gather(self, layer: int, seq: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous k, v [length, H, D] of a sequence's first ``length`` tokens (a copy)."""
        slots = self.slots(seq, 0, length).to(self.kv[layer].device)
        b, o = slots // self.block_size, slots % self.block_size
        return self.k_plane(layer)[b, o], self.v_plane(layer)[b, o]

    def gather_index(self, layer: int, seq: int, length: int) -> torch.Tensor:
        """Index keys [length, Di] of a sequence's first ``length`` tokens."""
        slots = self.slots(seq, 0, length).to(self.kv[layer].device)
        return self.index[layer][slots // self.block_size, slots % self.block_size]
