"""Tile helpers shared by the GEMM kernels: program order and one multiply-accumulate step per format.

Both kernels keep the accumulator *swapped*, ``acc[BLOCK_N, BLOCK_M] += W_tile @ x_tileᵀ``: the
weight tile is the MMA's first operand, so a tile dequantised in registers feeds the MMA without
a round trip through shared memory (Hopper wgmma takes A from registers), and a narrow M wastes no
MMA rows. bf16 weights are loaded as stored (no conversion, so they can stream through shared
memory); fp8 and MX weights are dequantised in registers, or passed to ``tl.dot_scaled`` where the
GPU has native MX (NATIVE_MX). MXFP4 never interleaves nibbles: the low nibbles (even k) and high
nibbles (odd k) each meet the matching even/odd columns of x in their own dot.
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
def _load_x(p_x, o_m, o_k, M, K, s_xm, s_xk):
    """Activation tile [BLOCK_M, len(o_k)] at columns o_k (zeros outside)."""
    m_x = (o_m[:, None] < M) & (o_k[None, :] < K)
    return tl.load(p_x + o_m[:, None] * s_xm + o_k[None, :] * s_xk, mask=m_x, other=0.0)


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

    fp8: scale element (n // SB_N, k // SB_K) (per channel: SB_N=1 and s_sk=0).
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
            b_x = _load_x(p_x, o_m, o_k, M, K, s_xm, s_xk)
            acc = tl.dot_scaled(b_q, b_s, "e2m1", tl.trans(b_x), None, X_FMT, acc)
        else:
            b_x_even = _load_x(p_x, o_m, 2 * o_p, M, K, s_xm, s_xk)        # k = 2j meets the low nibbles
            b_x_odd = _load_x(p_x, o_m, 2 * o_p + 1, M, K, s_xm, s_xk)
            b_q = b_q.to(tl.int32)
            b_lo = _mx_scaled(e2m1_to_f32(b_q & 15), b_s, BLOCK_N, BLOCK_K // 2, 16).to(b_x_even.dtype)
            b_hi = _mx_scaled(e2m1_to_f32(b_q >> 4), b_s, BLOCK_N, BLOCK_K // 2, 16).to(b_x_even.dtype)
            acc = tl.dot(b_lo, tl.trans(b_x_even), acc)
            acc = tl.dot(b_hi, tl.trans(b_x_odd), acc)
    else:
        b_x = _load_x(p_x, o_m, o_k, M, K, s_xm, s_xk)                    # [BM, BK]
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
        elif W_FORMAT == "fp8":
            b_s = tl.load(p_s + (o_n // SB_N)[:, None] * s_sn + (o_k // SB_K)[None, :] * s_sk, mask=m_w, other=0.0)
            acc = tl.dot((b_w.to(tl.float32) * b_s).to(b_x.dtype), tl.trans(b_x), acc)
        else:
            acc = tl.dot(b_w, tl.trans(b_x), acc)                         # bf16: as stored
    return acc
