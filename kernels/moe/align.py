"""Token alignment for the grouped GEMMs, on the GPU without host syncs (vLLM's ``moe_align_block_size`` layout).

From routed ids [T, k] (``-1`` = an expert of another rank, or mapped through ``expert_map`` [E_global] ->
local id or -1), build

- ``sorted_ids`` int32 [max_padded]: slot indices (t·k + j) grouped by expert, each expert's run padded to a
  multiple of BLOCK_M with the sentinel ``T·k`` (skipped slots never appear);
- ``expert_ids`` int32 [max_blocks]: the expert of each BLOCK_M block, -1 past the padded count;
- ``num_post`` int32 [1]: the padded count (blocks at or past it do nothing).

Sizes are bounded on the host from shapes alone (``max_padded = T·k + E·(BLOCK_M-1)``, and at most
``T·k·BLOCK_M`` when ``T·k < E``), so the grid is fixed and a CUDA graph can capture it. Order within an
expert is the slot order (stable), so results are deterministic.

Two implementations: one Triton program (``align_kernel``, up to ``SINGLE_PROGRAM_MAX`` slots: decode,
one launch), and a chain of torch ops (argsort, scatter, searchsorted: ~10 launches, for prefill sizes).
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..launches import launch, record

SINGLE_PROGRAM_MAX = 2048   # slots (T·k) up to which the one-program kernel is used
CHUNK = 64                  # slots per step of the one-program kernel (rank matrix CHUNK x CHUNK)


class Alignment(NamedTuple):
    sorted_ids: torch.Tensor     # int32 [max_padded]
    expert_ids: torch.Tensor     # int32 [max_blocks]
    num_post: torch.Tensor       # int32 [1]


def max_sizes(numel: int, num_experts: int, block_m: int) -> tuple[int, int]:
    """(max_padded, max_blocks) from shapes only."""
    padded = numel + num_experts * (block_m - 1)
    if numel < num_experts:
        padded = min(numel * block_m, padded)
    return padded, triton.cdiv(padded, block_m)


@triton.jit
def local_expert(p_ids, p_map, o, NUMEL, NUM_EXPERTS, HAS_MAP: tl.constexpr):
    """Local expert of slots o (ids through the expert map), -1 where skipped: < 0, remote, out of range or o >= NUMEL."""
    e = tl.load(p_ids + o, mask=o < NUMEL, other=-1).to(tl.int32)
    if HAS_MAP:
        e = tl.where(e >= 0, tl.load(p_map + e, mask=e >= 0, other=-1).to(tl.int32), -1)
    return tl.where((e >= 0) & (e < NUM_EXPERTS), e, -1)


@triton.jit
def align_kernel(p_ids, p_map, p_sorted, p_eids, p_npost, p_cursor,
                 NUMEL, NUM_EXPERTS, MAX_PADDED, MAX_BLOCKS,
                 HAS_MAP: tl.constexpr, BLOCK_M: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr):
    """One program. p_cursor: int32 scratch [E_P2]."""
    o_e = tl.arange(0, E_P2)
    o_c = tl.arange(0, CHUNK)
    counts = tl.zeros((E_P2,), dtype=tl.int32)
    for c0 in range(0, NUMEL, CHUNK):
        e = local_expert(p_ids, p_map, c0 + o_c, NUMEL, NUM_EXPERTS, HAS_MAP)
        counts += tl.sum((e[:, None] == o_e[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    total = tl.sum(padded, axis=0)
    tl.store(p_npost, total)
    for b0 in range(0, MAX_BLOCKS, CHUNK):
        b = b0 + o_c
        first = b * BLOCK_M
        eid = tl.sum((ends[None, :] <= first[:, None]).to(tl.int32), axis=1)
        tl.store(p_eids + b, tl.where(first < total, eid, -1), mask=b < MAX_BLOCKS)
    for p0 in range(0, MAX_PADDED, CHUNK):
        tl.store(p_sorted + p0 + o_c, NUMEL, mask=p0 + o_c < MAX_PADDED)
    run = ends - padded                                           # next free position of each expert
    earlier = o_c[None, :] < o_c[:, None]
    for c0 in range(0, NUMEL, CHUNK):
        e = local_expert(p_ids, p_map, c0 + o_c, NUMEL, NUM_EXPERTS, HAS_MAP)
        tl.store(p_cursor + o_e, run)
        tl.debug_barrier()
        rank = tl.sum(((e[:, None] == e[None, :]) & earlier).to(tl.int32), axis=1)
        base = tl.load(p_cursor + tl.maximum(e, 0))
        tl.store(p_sorted + base + rank, c0 + o_c, mask=e >= 0)
        run += tl.sum((e[:, None] == o_e[None, :]).to(tl.int32), axis=0)
        tl.debug_barrier()


def _align_torch(flat: torch.Tensor, num_experts: int, block_m: int, max_padded: int, max_blocks: int) -> Alignment:
    """The same layout with torch ops (no host sync: fixed sizes, scatter instead of bincount)."""
    dev, numel = flat.device, flat.numel()
    key = torch.where(flat >= 0, flat, num_experts).long()
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))
    counts = torch.cat([counts[:num_experts], counts.new_zeros(1)])  # (no host->device copy: graph capturable)
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = torch.cat([(ends - padded)[:num_experts], ends.new_full((1,), max_padded)])  # skipped: past the end
    first = torch.cumsum(counts, 0) - counts
    skey = key[order]
    pos = starts[skey] + torch.arange(numel, device=dev) - first[skey]
    sorted_ids = torch.full((max_padded + 1,), numel, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, pos.clamp(max=max_padded), order.to(torch.int32))
    b = torch.arange(max_blocks, device=dev) * block_m
    total = ends[num_experts - 1]
    eid = torch.searchsorted(ends[:num_experts], b, right=True)
    expert_ids = torch.where(b < total, eid, -1).to(torch.int32)
    return Alignment(sorted_ids[:max_padded], expert_ids, total.reshape(1).to(torch.int32))


def align(ids: torch.Tensor, block_m: int, num_experts: int, expert_map: torch.Tensor | None = None,
          impl: str | None = None) -> Alignment:
    """ids [T, k] (int; -1 = skip) -> Alignment. ``num_experts``: local experts (rows of the weight tensors).

    ``expert_map`` [E_global] int (global id -> local id or -1) when ids are global; ``impl``: "triton" |
    "torch" | None (by size: one Triton program up to SINGLE_PROGRAM_MAX slots).
    """
    numel = ids.numel()
    max_padded, max_blocks = max_sizes(numel, num_experts, block_m)
    flat = ids.reshape(-1)
    impl = impl or ("triton" if numel <= SINGLE_PROGRAM_MAX else "torch")
    if impl == "torch":
        if expert_map is not None:
            flat = torch.where(flat >= 0, expert_map.long()[flat.long().clamp(min=0)], -1)
        flat = torch.where((flat >= 0) & (flat < num_experts), flat, -1)
        record("moe_align_torch")
        return _align_torch(flat, num_experts, block_m, max_padded, max_blocks)
    dev = ids.device
    e_p2 = triton.next_power_of_2(num_experts + 1)
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    num_post = torch.empty(1, dtype=torch.int32, device=dev)
    cursor = torch.empty(e_p2, dtype=torch.int32, device=dev)
    flat = flat.contiguous()
    launch(align_kernel, (1,), flat, flat if expert_map is None else expert_map.contiguous(), sorted_ids, expert_ids,
                       num_post, cursor, numel, num_experts, max_padded, max_blocks,
                       HAS_MAP=expert_map is not None, BLOCK_M=block_m, E_P2=e_p2, CHUNK=CHUNK,
                       num_warps=8 if e_p2 >= 256 else 4)
    return Alignment(sorted_ids, expert_ids, num_post)
