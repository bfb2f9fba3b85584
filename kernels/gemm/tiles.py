"""Tile helpers shared by the GEMM kernels: program order, weight decoding, one multiply-accumulate step
per format, and the split-K epilogue.

The tensor-core kernels keep the accumulator *swapped*, ``acc[BLOCK_N, BLOCK_M] += W_tile @ x_tileᵀ``:
the weight tile is the MMA's first operand, so a tile dequantised in registers feeds the MMA and a
narrow M wastes no MMA rows. bf16 weights are loaded as stored; fp8 and MX weights are dequantised in
registers in fp32 (``mac_step``), or passed to ``tl.dot_scaled`` where the GPU has native MX
(NATIVE_MX). MXFP4 never interleaves nibbles: the low nibbles (even k) and high nibbles (odd k) each
meet the matching even/odd columns of x in their own dot.

The gemv kernel decodes MX with kernels/mx's bit constructions (``e2m1_value``, ``e8m0_pow2``: no
int->float conversion) on 3-D tiles ``[BLOCK_N, BLOCK_K/32, 32]`` (``load_mx``), so a scale byte
broadcasts over its 32 elements without a reshape. (H200, 2026-11-29: the same bit decoding with the
scale multiply in bf16 inside ``mac_step`` ran 1.1-1.7x slower at M 8-128 than the fp32 arithmetic
kept here; bf16 arithmetic goes through fp32 on that GPU.)
"""

import triton
import triton.language as tl

from ..mx.triton_mx import e2m1_to_f32, e8m0_to_f32


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program id -> (i_m, i_n); GROUP_M row-tiles share each column sweep (L2 reuse of W); 1 = row-major."""
    n_m = tl.cdiv(M, BLOCK_M)
    n_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * n_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(n_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@triton.jit
def load_x(p_x, o_m, o_k, M, K, s_xm, s_xk):
    """Activation tile [BLOCK_M, len(o_k)] at columns o_k (zeros outside)."""
    m_x = (o_m[:, None] < M) & (o_k[None, :] < K)
    return tl.load(p_x + o_m[:, None] * s_xm + o_k[None, :] * s_xk, mask=m_x, other=0.0)


@triton.jit
def load_mx(p_w, p_s, o_n, k0, N, K, s_wn, s_wk, s_sn, s_sk, W_FORMAT: tl.constexpr, BLOCK_K: tl.constexpr):
    """Raw MX codes [BLOCK_N, BLOCK_K/32, 32] (mxfp4: packed bytes [.., 16]) and scale bytes [BLOCK_N, BLOCK_K/32]."""
    G: tl.constexpr = BLOCK_K // 32
    E: tl.constexpr = 16 if W_FORMAT == "mxfp4" else 32
    o_g = k0 // 32 + tl.arange(0, G)
    m_s = (o_n[:, None] < N) & (o_g[None, :] < K // 32)
    o_e = o_g[None, :, None] * E + tl.arange(0, E)[None, None, :]
    b_q = tl.load(p_w + o_n[:, None, None] * s_wn + o_e * s_wk, mask=m_s[:, :, None], other=0.0)
    b_s = tl.load(p_s + o_n[:, None] * s_sn + o_g[None, :] * s_sk, mask=m_s, other=127)
    return b_q, b_s


@triton.jit
def _mx_scaled(b_v, b_s, BLOCK_N: tl.constexpr, COLS: tl.constexpr, PER_SCALE: tl.constexpr):
    """b_v fp32 [BLOCK_N, COLS] * 2**(s-127), one E8M0 byte of b_s [BLOCK_N, COLS/PER_SCALE] per PER_SCALE columns."""
    b_v = tl.reshape(b_v, (BLOCK_N, COLS // PER_SCALE, PER_SCALE)) * e8m0_to_f32(b_s)[:, :, None]
    return tl.reshape(b_v, (BLOCK_N, COLS))


@triton.jit
def mac_step(acc, p_x, p_w, p_s, o_m, o_n, k0, M, N, K,
             s_xm, s_xk, s_wn, s_wk, s_sn, s_sk,
             W_FORMAT: tl.constexpr, SB_N: tl.constexpr, SB_K: tl.constexpr, NATIVE_MX: tl.constexpr,
             X_FMT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc[BLOCK_N, BLOCK_M] += W[o_n, k0:k0+BLOCK_K] @ x[o_m, k0:k0+BLOCK_K]ᵀ for any weight format.

    fp8 per block: scale element (n // SB_N, k // SB_K); per channel (SB_K == 0): the codes go to the MMA as
    they are (e4m3 is exact in bf16/fp16) and :func:`row_scale` applies the scale once per output row.
    mxfp8/mxfp4: one E8M0 byte per 32 elements along K (scales [N, K/32]).
    """
    o_k = k0 + tl.arange(0, BLOCK_K)
    o_b = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    m_n = o_n[:, None] < N
    if W_FORMAT == "mxfp4":
        o_p = k0 // 2 + tl.arange(0, BLOCK_K // 2)                       # packed byte columns
        b_q = tl.load(p_w + o_n[:, None] * s_wn + o_p[None, :] * s_wk, mask=m_n & (o_p[None, :] < K // 2), other=0.0)
        b_s = tl.load(p_s + o_n[:, None] * s_sn + o_b[None, :] * s_sk, mask=m_n & (o_b[None, :] < K // 32), other=127)
        if NATIVE_MX:
            b_x = load_x(p_x, o_m, o_k, M, K, s_xm, s_xk)
            acc = tl.dot_scaled(b_q, b_s, "e2m1", tl.trans(b_x), None, X_FMT, acc)
        else:
            b_x_even = load_x(p_x, o_m, 2 * o_p, M, K, s_xm, s_xk)        # k = 2j meets the low nibbles
            b_x_odd = load_x(p_x, o_m, 2 * o_p + 1, M, K, s_xm, s_xk)
            b_q = b_q.to(tl.int32)
            b_lo = _mx_scaled(e2m1_to_f32(b_q & 15), b_s, BLOCK_N, BLOCK_K // 2, 16).to(b_x_even.dtype)
            b_hi = _mx_scaled(e2m1_to_f32(b_q >> 4), b_s, BLOCK_N, BLOCK_K // 2, 16).to(b_x_even.dtype)
            acc = tl.dot(b_lo, tl.trans(b_x_even), acc)
            acc = tl.dot(b_hi, tl.trans(b_x_odd), acc)
    else:
        b_x = load_x(p_x, o_m, o_k, M, K, s_xm, s_xk)                    # [BM, BK]
        m_w = m_n & (o_k[None, :] < K)
        b_w = tl.load(p_w + o_n[:, None] * s_wn + o_k[None, :] * s_wk, mask=m_w, other=0.0)
        if W_FORMAT == "mxfp8":
            b_s = tl.load(p_s + o_n[:, None] * s_sn + o_b[None, :] * s_sk, mask=m_n & (o_b[None, :] < K // 32),
                          other=127)
            if NATIVE_MX:
                acc = tl.dot_scaled(b_w, b_s, "e4m3", tl.trans(b_x), None, X_FMT, acc)
            else:
                b_w = _mx_scaled(b_w.to(tl.float32), b_s, BLOCK_N, BLOCK_K, 32).to(b_x.dtype)
                acc = tl.dot(b_w, tl.trans(b_x), acc)
        elif W_FORMAT == "fp8" and SB_K == 0:                            # per channel: row_scale() after the loop
            acc = tl.dot(b_w.to(b_x.dtype), tl.trans(b_x), acc)
        elif W_FORMAT == "fp8":
            b_s = tl.load(p_s + (o_n // SB_N)[:, None] * s_sn + (o_k // SB_K)[None, :] * s_sk, mask=m_w, other=0.0)
            acc = tl.dot((b_w.to(tl.float32) * b_s).to(b_x.dtype), tl.trans(b_x), acc)
        else:
            acc = tl.dot(b_w, tl.trans(b_x), acc)                         # bf16: as stored
    return acc


@triton.jit
def row_scale(acc, p_s, o_n, N, W_FORMAT: tl.constexpr, SB_K: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] times the per-channel fp8 scale of each output row n (fp32 [N]); other formats as is."""
    if W_FORMAT == "fp8" and SB_K == 0:
        acc = acc * tl.load(p_s + o_n, mask=o_n < N, other=0.0)[:, None]
    return acc


@triton.jit
def splitk_store(acc, p_y, p_part, p_lock, o_n, o_m, M, N, s_ym, s_yn,
                 BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_K: tl.constexpr):
    """Write acc (yᵀ tile [BLOCK_N, BLOCK_M]); with SPLIT_K > 1, via fp32 partials reduced by the last split.

    Grid (n tiles, m tiles, SPLIT_K). p_part: fp32 [SPLIT_K, tiles, BLOCK_N*BLOCK_M]; p_lock: int32 [tiles],
    zero before the call and reset to zero by the reducing split (CUDA-graph replays need no memset).
    The reduction is unrolled (SPLIT_K is a compile-time constant) so all partial loads are in flight at
    once: H200 2026-11-29, a rolled loop over the splits cost ~2 us per call at SPLIT_K = 4.
    """
    p_out = p_y + o_n[:, None] * s_yn + o_m[None, :] * s_ym
    m_y = (o_n[:, None] < N) & (o_m[None, :] < M)
    if SPLIT_K == 1:
        tl.store(p_out, acc.to(p_y.dtype.element_ty), mask=m_y)
    else:
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        o_t = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        p_tile = p_part + tile * (BLOCK_N * BLOCK_M) + o_t
        stride_split = tl.num_programs(0) * tl.num_programs(1) * (BLOCK_N * BLOCK_M)
        tl.store(p_tile + tl.program_id(2) * stride_split, acc)
        tl.debug_barrier()                                   # all partial stores of this program first
        arrived = tl.atomic_add(p_lock + tile, 1)            # acq_rel: publishes the partial
        if arrived == SPLIT_K - 1:                           # the last split reduces
            tl.debug_barrier()
            total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                total += tl.load(p_tile + s * stride_split, cache_modifier=".cg")
            tl.store(p_out, total.to(p_y.dtype.element_ty), mask=m_y)
            tl.atomic_xchg(p_lock + tile, 0)                 # ready for the next call / graph replay
