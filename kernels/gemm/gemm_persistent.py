"""Persistent prefill GEMM ``y[M, N] = x[M, K] @ W[N, K]ᵀ``: one program per SM, bulk tensor copies,
the last partial wave split along K.

- **Persistent order.** The grid is ``programs`` (the SM count, ``launcher.persistent_plan``); program p computes output
  tiles p, p + programs, ... in grouped order (``tiles.grouped_tile``: GROUP_M row tiles sweep the columns
  together, so the weight tiles they share come from L2). With ``FLATTEN`` the tile loop and the K loop are
  one software-pipelined loop: the loads of the next tile are issued while the current tile's epilogue
  (convert, bulk store) runs.
- **Bulk tensor copies.** With ``USE_TMA`` the operands are read (and whole tiles of y written) through
  tensor descriptors built on the host (``triton.tools.tensor_descriptor.TensorDescriptor``): Hopper's
  TMA unit moves the tiles into shared memory, out-of-range rows and columns read as zeros and are
  clipped on store, so no masks. Without (GPUs or backends without TMA, or operands that are not 16-byte
  aligned) the same loop runs on masked pointer loads (H200, M 2048-4096 x the M3 shapes, 128 x 128 tiles:
  0.31-0.76x cuBLAS with pointers, 0.75-0.88x with TMA).
- **Tail split.** ``tiles = n_whole + n_tail``: the first ``n_whole`` tiles (whole waves of ``programs``)
  are computed over the whole K; each of the last ``n_tail`` tiles (the partial wave that would leave
  SMs idle) is cut into ``tail_split`` ranges of K, one per otherwise idle program. Each range stores an
  fp32 partial; an atomic counter per tail tile finds the range that arrives last, which sums the
  partials, writes y and resets the counter (the protocol of ``tiles.splitk_store``; here the split count
  is a run-time value, so one binary serves every M). One launch, CUDA-graph safe. (H200, M 2048 N 2304
  K 6144, 128 x 256 tiles: 126 us without the split, 98 us with it; stream-K over the partial wave plus one
  whole wave ran 99-126 us at N 2304-2560: nearly every one of its tiles is shared, and the fp32 partials
  cost more than the balance gains.)

Accumulator ``acc[BLOCK_M, BLOCK_N] = x_tile @ W_tileᵀ`` (not swapped: x and W both arrive in shared
memory, and y is stored as laid out). Weight formats: floating weights of x's dtype (``"bf16"``) and fp8
with per-channel scales (``SB_K == 0``: codes converted to x's dtype before the MMA, the scale applied once
per output column) or per ``SB_N × SB_K`` block (each weight tile times its block scales in fp32, rounded to
x's dtype, before the MMA: the tiled kernel's rule, ``tiles.mac_step``); the launcher dequantises MX weights
first (``launcher.DEQUANT_PREFILL``).
"""
import triton
import triton.language as tl

from .tiles import grouped_tile


@triton.jit
def _mma_k_range(acc, x_desc, w_desc, p_x, p_w, p_s, off_m, off_n, k_lo, k_hi, M, N, K, s_xm, s_xk, s_wn, s_wk,
                 s_sn, s_sk, W_FORMAT: tl.constexpr, SB_N: tl.constexpr, SB_K: tl.constexpr, USE_TMA: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] += x[off_m:+BLOCK_M, k_lo:k_hi] @ W[off_n:+BLOCK_N, k_lo:k_hi]ᵀ (k_lo a multiple
    of BLOCK_K; rows, columns and K beyond the operands read as zeros)."""
    o_m = off_m + tl.arange(0, BLOCK_M)
    o_n = off_n + tl.arange(0, BLOCK_N)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if USE_TMA:
            a = x_desc.load([off_m, k0])                                             # [BM, BK]
            b = w_desc.load([off_n, k0])                                             # [BN, BK]
        else:
            o_k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(p_x + o_m[:, None] * s_xm + o_k[None, :] * s_xk,
                        mask=(o_m[:, None] < M) & (o_k[None, :] < K), other=0.0)
            b = tl.load(p_w + o_n[:, None] * s_wn + o_k[None, :] * s_wk,
                        mask=(o_n[:, None] < N) & (o_k[None, :] < K), other=0.0)
        if W_FORMAT == "fp8" and SB_K == 0:
            b = b.to(a.dtype)                                                        # e4m3 is exact in bf16/fp16
        elif W_FORMAT == "fp8":                                                      # block scales [N/SB_N, K/SB_K]
            o_kb = k0 + tl.arange(0, BLOCK_K)
            b_s = tl.load(p_s + (o_n // SB_N)[:, None] * s_sn + (o_kb // SB_K)[None, :] * s_sk,
                          mask=(o_n[:, None] < N) & (o_kb[None, :] < K), other=0.0)
            b = (b.to(tl.float32) * b_s).to(a.dtype)
        acc = tl.dot(a, tl.trans(b), acc)
    return acc


@triton.jit
def _col_scale(acc, p_s, o_n, N, W_FORMAT: tl.constexpr, SB_K: tl.constexpr):
    """fp8 per channel: acc [BLOCK_M, BLOCK_N] times the scale of each output column (fp32 [N])."""
    if W_FORMAT == "fp8" and SB_K == 0:
        acc = acc * tl.load(p_s + o_n, mask=o_n < N, other=0.0)[None, :]
    return acc


@triton.jit
def _reduce_tail(acc, p_out, m_out, p_part, p_lock, slot, split, n_split, n_slots,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store this K range's fp32 partial of tail tile ``slot``; the range that arrives last sums the
    ``n_split`` partials into y and resets the counter. p_part: fp32 [n_split, n_slots, BLOCK_M*BLOCK_N];
    p_lock: int32 [n_slots], zero before the call."""
    o_t = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    p_tile = p_part + slot * (BLOCK_M * BLOCK_N) + o_t
    stride = n_slots * (BLOCK_M * BLOCK_N)
    tl.store(p_tile + split * stride, acc)
    tl.debug_barrier()                                       # all partial stores of this program first
    arrived = tl.atomic_add(p_lock + slot, 1)                # acq_rel: publishes the partial
    if arrived == n_split - 1:
        tl.debug_barrier()
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(n_split):
            total += tl.load(p_tile + s * stride, cache_modifier=".cg")
        tl.store(p_out, total.to(p_out.dtype.element_ty), mask=m_out)
        tl.atomic_xchg(p_lock + slot, 0)                     # ready for the next call / graph replay


@triton.jit(do_not_specialize=["M", "n_whole", "n_tail", "tail_split", "k_split"])
def gemm_persistent_kernel(
        # tensor descriptors of x [M, K], W [N, K], y [M, N] (USE_TMA; else any tensors) and the raw pointers
        # (p_s: fp32 fp8 scales, [N] per channel or [N/SB_N, K/SB_K] per block, else any pointer;
        # p_part/p_lock: the tail's workspace)
        x_desc, w_desc, y_desc, p_x, p_w, p_s, p_y, p_part, p_lock,
        # sizes; programs = grid size; tiles [0, n_whole) whole, then n_tail tiles in tail_split K ranges
        M, N, K, programs, n_whole, n_tail, tail_split, k_split,
        # strides
        s_xm, s_xk, s_wn, s_wk, s_sn, s_sk, s_ym, s_yn,
        W_FORMAT: tl.constexpr, SB_N: tl.constexpr, SB_K: tl.constexpr, USE_TMA: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    for t in tl.range(pid, n_whole, programs, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        i_m, i_n = grouped_tile(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _mma_k_range(acc, x_desc, w_desc, p_x, p_w, p_s, i_m * BLOCK_M, i_n * BLOCK_N, 0, K, M, N, K,
                           s_xm, s_xk, s_wn, s_wk, s_sn, s_sk, W_FORMAT, SB_N, SB_K, USE_TMA, BLOCK_M, BLOCK_N, BLOCK_K)
        o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _col_scale(acc, p_s, o_n, N, W_FORMAT, SB_K)
        if USE_TMA:
            y_desc.store([i_m * BLOCK_M, i_n * BLOCK_N], acc.to(p_y.dtype.element_ty))
        else:
            tl.store(p_y + o_m[:, None] * s_ym + o_n[None, :] * s_yn, acc.to(p_y.dtype.element_ty),
                     mask=(o_m[:, None] < M) & (o_n[None, :] < N))
    for u in range(pid, n_tail * tail_split, programs):      # the tail: at most one K range per program
        slot = u // tail_split
        split = u % tail_split
        i_m, i_n = grouped_tile(n_whole + slot, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        k_lo = split * k_split
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _mma_k_range(acc, x_desc, w_desc, p_x, p_w, p_s, i_m * BLOCK_M, i_n * BLOCK_N, k_lo,
                           tl.minimum(K, k_lo + k_split), M, N, K, s_xm, s_xk, s_wn, s_wk, s_sn, s_sk,
                           W_FORMAT, SB_N, SB_K, USE_TMA, BLOCK_M, BLOCK_N, BLOCK_K)
        o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _col_scale(acc, p_s, o_n, N, W_FORMAT, SB_K)
        _reduce_tail(acc, p_y + o_m[:, None] * s_ym + o_n[None, :] * s_yn,
                     (o_m[:, None] < M) & (o_n[None, :] < N), p_part, p_lock, slot, split, tail_split, n_tail,
                     BLOCK_M, BLOCK_N)
