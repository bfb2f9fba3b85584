"""Launchers of the indexer kernels and the fast-path entries the reference model calls.

Metadata is vLLM's varlen form: ``cu_seqlens_q [R+1]`` (query rows of request r are rows
cu[r] .. cu[r+1]-1, the LAST q_len positions of its sequence), ``seq_lens [R]`` (keys visible to its last
row), ``block_tables [R, W]`` (logical -> physical cache block). Decode (1 row), 1 + k verification rows
and prefill chunks are the same call. ``max_q_len`` / ``max_seq_len`` fix the grid (pass them inside a
CUDA graph; otherwise they are read from the metadata, a host sync). On Hopper and later both kernels use
programmatic dependent launch (``kernels/pdl.py``), so the selection's launch overlaps the scoring.
"""
from dataclasses import dataclass

import torch
import triton

from ..launches import launch
from ..pdl import pdl_enabled, pdl_launch
from .triton_indexer import index_score_kernel, select_kernel

PAGE = 16            # AITER page (vLLM ASM_PAGE_SIZE)
SCORE_PROGRAMS_PER_SM = 4
SCORE_NUM_WARPS, SCORE_NUM_STAGES = 4, 2  # index_score_kernel (H200: traces/bench/kernel_probe_NVIDIA_H200.csv)
SELECT_MAX_CHUNK = 1024  # blocks sorted at once by the selector (1024 blocks = 128K tokens at block 128)
SELECT_WIDE = 512        # the selector runs 8 warps above this many blocks per chunk, 4 up to it,
SELECT_FEW = (4, 256, 16)  # and (<= 4 rows, >= 256 blocks) -> 16 warps: a lone row's sort is its latency


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def _maxima(cu_seqlens_q, seq_lens, max_q_len, max_seq_len) -> tuple[int, int]:
    if max_q_len is None:
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    return max_q_len, max_seq_len


def _check(iq, index_cache, block_tables, seq_lens, cu_seqlens_q):
    if iq.dim() != 3 or index_cache.dim() != 3 or iq.shape[-1] != index_cache.shape[-1]:
        raise ValueError(f"iq [T, Hi, D] and index_cache [NB, block, D] must share D: {tuple(iq.shape)}, "
                         f"{tuple(index_cache.shape)}")
    if block_tables.dim() != 2 or seq_lens.shape[0] != block_tables.shape[0] \
            or cu_seqlens_q.shape[0] != block_tables.shape[0] + 1:
        raise ValueError("block_tables [R, W], seq_lens [R] and cu_seqlens_q [R+1] must agree on R")
    bs, d = index_cache.shape[1], index_cache.shape[2]
    if bs & (bs - 1) or d & (d - 1) or bs < 16 or d < 16:
        raise ValueError(f"index block size {bs} and dim {d} must be powers of two >= 16")


def index_scores(iq: torch.Tensor, index_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, *, max_q_len: int | None = None, max_seq_len: int | None = None,
                 n_split: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Block-max scores: iq [T, Hi, D] (bf16/fp16/fp32), index_cache [NB, block, D] (same dtype or fp8)
    -> fp32 [Hi, T, W'] (W' >= blocks of the longest request; only each row's visible blocks are written)."""
    _check(iq, index_cache, block_tables, seq_lens, cu_seqlens_q)
    t, hi, d = iq.shape
    bs = index_cache.shape[1]
    r = block_tables.shape[0]
    max_q_len, max_seq_len = _maxima(cu_seqlens_q, seq_lens, max_q_len, max_seq_len)
    n_blocks = triton.cdiv(max_seq_len, bs)
    if out is None:
        out = torch.empty(hi, t, max(16, triton.cdiv(n_blocks, 16) * 16), dtype=torch.float32, device=iq.device)
    block_h = triton.next_power_of_2(hi)
    block_q = min(triton.next_power_of_2(max(max_q_len, 1)), max(1, 64 // block_h))
    block_q = max(block_q, max(1, 16 // block_h))
    q_tiles = triton.cdiv(max_q_len, block_q)
    if n_split is None:
        target = SCORE_PROGRAMS_PER_SM * _num_sms(iq.device) if iq.is_cuda else 2
        n_split = max(1, min(n_blocks, target // max(1, r * q_tiles)))
    launch(index_score_kernel, (q_tiles, r, n_split),
        iq, index_cache, out, block_tables, cu_seqlens_q, seq_lens,
        iq.stride(0), iq.stride(1), iq.stride(2), index_cache.stride(0), index_cache.stride(1),
        index_cache.stride(2), out.stride(0), out.stride(1), out.stride(2), block_tables.stride(0),
        hi, n_split, HEAD_DIM=d, BLOCK_SIZE=bs, BLOCK_Q=block_q, BLOCK_H=block_h,
        USE_PDL=pdl_enabled(iq.device), num_warps=SCORE_NUM_WARPS, num_stages=SCORE_NUM_STAGES,
        **pdl_launch(pdl_enabled(iq.device)))
    return out


@dataclass
class Selection:
    """The indexer's output: topk [Hi, T, K] int32 block ids (-1 unused); with the page adapter also
    table [Hi, T, K·block/16] int32 page ids and ctx [Hi, T] int32 context lengths (vLLM's shapes at Hi=1)."""
    topk: torch.Tensor
    table: torch.Tensor | None = None
    ctx: torch.Tensor | None = None


def _select_warps(block_n: int, rows: int) -> int:
    few_rows, min_blocks, warps = SELECT_FEW
    if rows <= few_rows and block_n >= min_blocks:
        return warps
    return 4 if block_n <= SELECT_WIDE else 8


def select_topk(scores: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                cu_seqlens_q: torch.Tensor, *, block_size: int, topk: int, local_blocks: int = 1,
                init_blocks: int = 0, max_q_len: int | None = None, max_seq_len: int | None = None,
                emit_page_table: bool = False, block_page_stride: int | None = None,
                out: Selection | None = None) -> Selection:
    """Top-k blocks per (index head, row) from ``scores`` [Hi, T, W] (fp32, as index_scores writes them).

    ``emit_page_table``: also write the page-16 table (pages ``block_tables[r, b]·block_page_stride + j``;
    block_page_stride defaults to 2·block/16: K and V pages sharing a block, vLLM's layout on ROCm).
    ``out``: preallocated buffers (stable addresses for CUDA graphs; also index sharing's shared top-k).
    """
    hi, t, _ = scores.shape
    max_q_len, max_seq_len = _maxima(cu_seqlens_q, seq_lens, max_q_len, max_seq_len)
    ppb = block_size // PAGE if emit_page_table else 1
    if emit_page_table and (block_size % PAGE):
        raise ValueError(f"block_size {block_size} must be a multiple of the {PAGE}-token page")
    block_page_stride = 2 * ppb if block_page_stride is None else block_page_stride
    if out is None:
        out = Selection(torch.empty(hi, t, topk, dtype=torch.int32, device=scores.device))
        if emit_page_table:
            out.table = torch.empty(hi, t, topk * ppb, dtype=torch.int32, device=scores.device)
            out.ctx = torch.empty(hi, t, dtype=torch.int32, device=scores.device)
    table = out.table if emit_page_table else out.topk
    ctx = out.ctx if emit_page_table else out.topk
    block_t = max(16, triton.next_power_of_2(topk))
    n_blocks = triton.cdiv(max_seq_len, block_size)
    block_n = max(block_t, min(SELECT_MAX_CHUNK, triton.next_power_of_2(n_blocks)))
    launch(select_kernel, (max_q_len, block_tables.shape[0], hi),
        scores, out.topk, cu_seqlens_q, seq_lens, block_tables, table, ctx,
        scores.stride(0), scores.stride(1), scores.stride(2),
        out.topk.stride(0), out.topk.stride(1), out.topk.stride(2), block_tables.stride(0),
        table.stride(0), table.stride(1), ctx.stride(0),
        topk, init_blocks, local_blocks, block_page_stride,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, BLOCK_T=block_t, PAGES_PER_BLOCK=ppb,
        EMIT_TABLE=emit_page_table, USE_PDL=pdl_enabled(scores.device), num_warps=_select_warps(block_n, hi * t),
        **pdl_launch(pdl_enabled(scores.device)))
    return out


def indexer_topk(iq: torch.Tensor, index_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, *, topk: int, local_blocks: int = 1, init_blocks: int = 0,
                 max_q_len: int | None = None, max_seq_len: int | None = None, emit_page_table: bool = False,
                 block_page_stride: int | None = None, shared: Selection | None = None,
                 reuse: bool = False) -> Selection:
    """Scores + top-k (+ page table) of one layer, with index sharing.

    ``reuse=True`` (a reuse layer under ``use_index_cache``): no kernel runs, ``shared`` (written by the most
    recent computing layer) is returned. A computing layer given ``shared`` writes its selection into it.
    """
    if reuse:
        if shared is None:
            raise ValueError("reuse=True needs the shared selection of a computing layer")
        return shared
    max_q_len, max_seq_len = _maxima(cu_seqlens_q, seq_lens, max_q_len, max_seq_len)
    scores = index_scores(iq, index_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len=max_q_len,
                          max_seq_len=max_seq_len)
    return select_topk(scores, block_tables, seq_lens, cu_seqlens_q, block_size=index_cache.shape[1], topk=topk,
                       local_blocks=local_blocks, init_blocks=init_blocks, max_q_len=max_q_len,
                       max_seq_len=max_seq_len, emit_page_table=emit_page_table,
                       block_page_stride=block_page_stride, out=shared)


# --- the reference model's fast paths (same arguments as m3lab/model/attention.py's references) -----------------
def indexer_varlen(iq: torch.Tensor, index_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                   cu_seqlens_q: torch.Tensor, *, tables: list[list[int]] | None = None,
                   starts: list[int] | None = None, counts: list[int] | None = None,
                   block_size: int | None = None) -> torch.Tensor:
    """Fast path of ``indexer_varlen``: iq [T, Hi, D], index_cache [NB, block, D] -> fp32 [Hi, T, NBmax],
    -inf where a block is not visible to the row (the reference's contract)."""
    width = max(len(t) for t in tables) if tables else block_tables.shape[1]
    max_q = max(counts) if counts else None
    max_s = max(s + n for s, n in zip(starts, counts)) if starts and counts else None
    out = torch.full((iq.shape[1], iq.shape[0], max(width, 1)), float("-inf"), dtype=torch.float32,
                     device=iq.device)
    return index_scores(iq, index_cache, block_tables.to(torch.int32), seq_lens.to(torch.int32),
                        cu_seqlens_q.to(torch.int32), max_q_len=max_q, max_seq_len=max_s, out=out)


def topk_blocks(scores: torch.Tensor, positions: torch.Tensor, *, block_size: int, topk: int, local_blocks: int,
                init_blocks: int) -> torch.Tensor:
    """Fast path of ``topk_blocks``: scores [Hi, T, NB], positions [T] -> int32 [Hi, T, topk].

    Rows are treated as independent one-row requests at their own position (the scores already carry the
    request structure), so the metadata is built from ``positions``.
    """
    t = positions.shape[0]
    dev = scores.device
    cu = torch.arange(t + 1, dtype=torch.int32, device=dev)
    seq_lens = (positions + 1).to(torch.int32)
    bt = torch.zeros(t, 1, dtype=torch.int32, device=dev)
    max_s = int(seq_lens.max()) if t else 1
    return select_topk(scores, bt, seq_lens, cu, block_size=block_size, topk=topk, local_blocks=local_blocks,
                       init_blocks=init_blocks, max_q_len=1, max_seq_len=max_s).topk
