"""Launchers of the sparse-attention kernels and the fast-path entry the reference model calls.

Metadata as in ``kernels/indexer/launcher.py``: ``cu_seqlens_q [R+1]``, ``seq_lens [R]`` (each request's query
rows are its last q_len positions), ``block_tables [R, W]``. ``split`` (how many ways a row's blocks are
split) is chosen so that rows × KV heads × split ≈ ``PROGRAMS_PER_SM`` × SMs, capped by top-k; pass it
to pin the grid. With a split, ``merge_kernel`` (one program per row and query head) combines the
partials; on Hopper and later both launches use programmatic dependent launch (``kernels/pdl.py``), so the
merge's launch overlaps the attention kernel's tail.
"""
import torch
import triton

from ..launches import launch
from ..pdl import pdl_enabled, pdl_launch
from .triton_sparse import merge_kernel, page16_attn_kernel, sparse_attn_kernel

PAGE = 16
PROGRAMS_PER_SM = 2
# sparse_attn_kernel's launch, measured against vLLM's decode kernel on the H200
# (traces/bench/kernel_probe_NVIDIA_H200.csv): 4 warps, 2 stages (3 stages ran 6-13% slower with the block ids loaded
# before the loop); 8 warps where a program reads 2 blocks (B = 32 at TP4: 8 splits of 16)
NUM_WARPS, NUM_STAGES = 4, 2
WARPS_BY_BLOCKS = {2: 8}          # blocks per program -> num_warps
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _split(rows: int, kv_heads: int, max_parts: int, device: torch.device, split: int | None) -> int:
    if split is not None:
        if split < 1 or split & (split - 1):
            raise ValueError(f"split {split} must be a power of two")
        return split
    if device.type != "cuda":
        return min(2, max_parts)
    target = PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    s = max(1, min(max_parts, target // max(1, rows * kv_heads)))
    return 1 << (s.bit_length() - 1)


def _scales(kv_dtype, k_scale, v_scale, out):
    if kv_dtype in FP8_DTYPES:
        if k_scale is None or v_scale is None or k_scale.numel() != 1 or v_scale.numel() != 1:
            raise ValueError("fp8 KV needs scalar k_scale and v_scale tensors (one element each)")
        return k_scale, v_scale, True
    return out, out, False


def _partials(split, rows, hq, d, dtype, device):
    """Normalised partials in q's dtype (as vLLM keeps them) and their log2-sum-exp in fp32."""
    if split == 1:
        dummy = torch.empty(1, 1, 1, 1, device=device)
        return dummy[0], dummy[0, 0]
    return (torch.empty(split, rows, hq, d, dtype=dtype, device=device),
            torch.empty(split, rows, hq, dtype=torch.float32, device=device))


def _merge(po, pl, out, split, pdl: bool):
    if split > 1:
        launch(merge_kernel, (out.shape[0], out.shape[1]),
            po, pl, out, po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
            out.stride(0), out.stride(1), HEAD_DIM=out.shape[-1], SPLIT=split, USE_PDL=pdl, num_warps=4,
            **pdl_launch(pdl))


def sparse_attention(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, topk: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, *,
                     scale: float, max_q_len: int | None = None, k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None, split: int | None = None,
                     out: torch.Tensor | None = None, uniform_rows: bool = False) -> torch.Tensor:
    """Block-sparse GQA: q [T, Hq, D]; k_blocks, v_blocks [NB, block, Hkv, D] strided views (e.g.
    ``reference.triton_planes`` of vLLM's ``[NB, Hkv, block, 2 D]``); topk [Hkv, T, K] int32 (-1 unused)
    -> o [T, Hq, D] in q's dtype. fp8 K/V need scalar ``k_scale``/``v_scale`` tensors.
    ``uniform_rows=True``: the caller guarantees every request has exactly ``max_q_len`` rows (T = R ·
    max_q_len, vLLM's decode contract), so the kernel maps rows without reading ``cu_seqlens_q``; the default
    reads it (padded batches, an upper-bound ``max_q_len``)."""
    t, hq, d = q.shape
    nb, bs, hkv, dk = k_blocks.shape
    if dk != d or v_blocks.shape != k_blocks.shape or topk.shape[:2] != (hkv, t) or hq % hkv:
        raise ValueError(f"shapes: q {tuple(q.shape)}, k/v blocks {tuple(k_blocks.shape)}, topk {tuple(topk.shape)}")
    if q.stride(-1) != 1 or bs & (bs - 1) or d & (d - 1) or bs < 16:
        raise ValueError("q needs a contiguous last dim; block and head dim must be powers of two (block >= 16)")
    if max_q_len is None:
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    if uniform_rows and t != block_tables.shape[0] * max_q_len:
        raise ValueError(f"uniform_rows needs T = R * max_q_len: T {t}, R {block_tables.shape[0]}, "
                         f"max_q_len {max_q_len}")
    out = torch.empty_like(q) if out is None else out
    group = hq // hkv
    split = _split(t, hkv, topk.shape[-1], q.device, split)
    po, pl = _partials(split, t, hq, d, q.dtype, q.device)
    ks, vs, has_scale = _scales(k_blocks.dtype, k_scale, v_scale, out)
    pdl = pdl_enabled(q.device)
    per = triton.cdiv(topk.shape[-1], split)
    launch(sparse_attn_kernel, (max_q_len, block_tables.shape[0], hkv * split),
        q, k_blocks, v_blocks, topk, block_tables, cu_seqlens_q, seq_lens, out, po, pl, ks, vs, scale,
        q.stride(0), q.stride(1), *k_blocks.stride(), *v_blocks.stride(), *topk.stride(), block_tables.stride(0),
        out.stride(0), out.stride(1), po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
        group, topk.shape[-1], t,
        HEAD_DIM=d, BLOCK_SIZE=bs, BLOCK_H=max(16, triton.next_power_of_2(group)), SPLIT=split,
        HAS_SCALE=has_scale, USE_PDL=pdl, UNIFORM_Q=uniform_rows,
        BLOCK_J=triton.next_power_of_2(per), num_warps=WARPS_BY_BLOCKS.get(per, NUM_WARPS), num_stages=NUM_STAGES,
        **pdl_launch(pdl))
    _merge(po, pl, out, split, pdl)
    return out


def page16_attention(q: torch.Tensor, k_view: torch.Tensor, v_view: torch.Tensor, table: torch.Tensor,
                     ctx: torch.Tensor, *, scale: float, block_size: int = 128, k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None, split: int | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """Sparse attention through the page adapter on AITER's page-16 views.

    q [T, Hq, D]; k_view [P, Hkv, D/x, 16, x]; v_view [P', Hkv, 16/x, D, x] (``reference.aiter_page16_cache``);
    table [Hkv, T, W] (or [T, W] at Hkv = 1) page ids; ctx [Hkv, T] (or [T]) -> o [T, Hq, D].
    Context is read in chunks of ``block_size`` tokens (block/16 pages).
    """
    t, hq, d = q.shape
    hkv, x = k_view.shape[1], k_view.shape[-1]
    table = table.view(1, *table.shape) if table.dim() == 2 else table
    ctx = ctx.view(1, -1) if ctx.dim() == 1 else ctx
    if k_view.shape[2] * x != d or v_view.shape[3] != d or table.shape[:2] != (hkv, t):
        raise ValueError(f"shapes: q {tuple(q.shape)}, k_view {tuple(k_view.shape)}, v_view {tuple(v_view.shape)}, "
                         f"table {tuple(table.shape)}")
    if k_view.stride(1) != d * PAGE or v_view.stride(1) != d * PAGE or k_view[0, 0].is_contiguous() is False \
            or table.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("page views need contiguous [H, 16·D] pages; table and q contiguous rows")
    chunk = block_size
    n_chunks = triton.cdiv(table.shape[-1] * PAGE, chunk)
    out = torch.empty_like(q) if out is None else out
    group = hq // hkv
    split = _split(t, hkv, n_chunks, q.device, split)
    po, pl = _partials(split, t, hq, d, q.dtype, q.device)
    ks, vs, has_scale = _scales(k_view.dtype, k_scale, v_scale, out)
    pdl = pdl_enabled(q.device)
    launch(page16_attn_kernel, (t, hkv * split),
        q, k_view, v_view, table, ctx, out, po, pl, ks, vs, scale,
        q.stride(0), q.stride(1), k_view.stride(0), k_view.stride(1), v_view.stride(0), v_view.stride(1),
        table.stride(0), table.stride(1), ctx.stride(0),
        out.stride(0), out.stride(1), po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
        group, n_chunks, t,
        HEAD_DIM=d, CHUNK=chunk, X=x, BLOCK_H=max(16, triton.next_power_of_2(group)), SPLIT=split,
        HAS_SCALE=has_scale, USE_PDL=pdl, num_warps=4, num_stages=2, **pdl_launch(pdl))
    _merge(po, pl, out, split, pdl)
    return out


# --- the reference model's fast path (same arguments as m3lab/model/attention.py's attention_varlen) ----------
def attention_varlen(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, blocks: torch.Tensor | None = None, *,
                     tables: list[list[int]] | None = None, starts: list[int] | None = None,
                     counts: list[int] | None = None, scale: float) -> torch.Tensor:
    """Fast path of ``attention_varlen`` for sparse layers: k_cache, v_cache [NB, block, Hkv, D] cache planes
    (any layout's views), blocks [Hkv, T, K] -> o [T, Hq, D]. Dense layers (blocks None) are not served."""
    if blocks is None:
        raise ValueError("the sparse-attention fast path needs the selected blocks (dense layers use another path)")
    return sparse_attention(q, k_cache, v_cache, blocks.to(torch.int32), block_tables.to(torch.int32),
                            seq_lens.to(torch.int32), cu_seqlens_q.to(torch.int32), scale=scale,
                            max_q_len=max(counts) if counts else None,
                            uniform_rows=bool(counts) and len(set(counts)) == 1 and sum(counts) == q.shape[0])
