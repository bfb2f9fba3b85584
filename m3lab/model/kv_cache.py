"""Paged KV cache with an index-key side cache (reference §4).

Per layer one tensor in a named layout (:data:`LAYOUTS`); the default is the vLLM model file's
``[num_blocks, 2, block, kv_heads, head_dim]``. Sparse layers also own an index-key cache
``[num_blocks, block, index_dim]`` (no head axis). A sequence owns a list of physical blocks
(its block table); token position p lives in block table[p // block] at offset p % block.

16-token pages: a 128-token block is 8 consecutive 16-token pages, page ``8 b + j`` = tokens
``16 j .. 16 j + 15`` of block b; :meth:`PagedKVCache.page` returns that page as a view (no copy).
"""
from dataclasses import dataclass
from typing import Callable

import torch

from m3lab.errors import M3LabError

PAGE = 16  # token page of the 16-token paged-attention kernels (AITER)


@dataclass(frozen=True)
class Layout:
    """A main-cache layout: allocation shape and K/V plane views [NB, block, H, D]."""

    name: str
    shape: Callable[[int, int, int, int], tuple[int, ...]]  # (num_blocks, block, heads, dim) -> shape
    k_plane: Callable[[torch.Tensor, int], torch.Tensor]  # (cache, dim) -> [NB, block, H, D] view
    v_plane: Callable[[torch.Tensor, int], torch.Tensor]


LAYOUTS = {
    "vllm": Layout("vllm", lambda nb, b, h, d: (nb, 2, b, h, d), lambda c, d: c[:, 0], lambda c, d: c[:, 1]),
    "kv_split": Layout("kv_split", lambda nb, b, h, d: (2, nb, b, h, d), lambda c, d: c[0], lambda c, d: c[1]),
    "triton": Layout("triton", lambda nb, b, h, d: (nb, h, b, 2 * d),
                     lambda c, d: c[..., :d].permute(0, 2, 1, 3), lambda c, d: c[..., d:].permute(0, 2, 1, 3)),
}


class PagedKVCache:
    """Paged K/V (+ index-key) cache for the layers of one rank.

    sparse: per layer, whether it has an index-key cache. kv_heads, head_dim, index_dim: local widths.
    """

    def __init__(self, *, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, index_dim: int,
                 sparse: list[bool], layout: str = "vllm", dtype: torch.dtype = torch.bfloat16,
                 index_dtype: torch.dtype | None = None, device: str | torch.device = "cpu"):
        if layout not in LAYOUTS:
            raise M3LabError(f"unknown KV layout {layout!r}", field="layout", hint=f"one of {sorted(LAYOUTS)}")
        self.layout = LAYOUTS[layout]
        self.num_blocks, self.block_size, self.head_dim = num_blocks, block_size, head_dim
        shape = self.layout.shape(num_blocks, block_size, kv_heads, head_dim)
        self.kv = [torch.zeros(shape, dtype=dtype, device=device) for _ in sparse]
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
        need = -(-(start + n) // self.block_size) - len(table)
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
        """K of a layer as [NB, block, H, D] (a view of the cache)."""
        return self.layout.k_plane(self.kv[layer], self.head_dim)

    def v_plane(self, layer: int) -> torch.Tensor:
        """V of a layer as [NB, block, H, D] (a view of the cache)."""
        return self.layout.v_plane(self.kv[layer], self.head_dim)

    def page(self, layer: int, page: int, plane: str = "k") -> torch.Tensor:
        """16-token page ``page`` (= block page // (block/16), sub-page page % (block/16)) as a view [16, H, D]."""
        per_block = self.block_size // PAGE
        view = self.k_plane(layer) if plane == "k" else self.v_plane(layer)
        j = page % per_block
        return view[page // per_block, j * PAGE:(j + 1) * PAGE]

    # --- writes and reads -----------------------------------------------------------------------
    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              ik: torch.Tensor | None = None) -> None:
        """Store k, v [n, H, D] (and index keys ik [n, Di]) at flat slots [n]."""
        slots = slots.to(self.kv[layer].device)
        b, o = slots // self.block_size, slots % self.block_size
        self.k_plane(layer)[b, o] = k.to(self.kv[layer].dtype)
        self.v_plane(layer)[b, o] = v.to(self.kv[layer].dtype)
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
