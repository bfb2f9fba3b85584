"""GEMV-style decode kernel for the smallest M (tables.GEMV_MAX_M): CUDA-core FMAs, no tensor cores, split-K.

A program streams weight tiles ``[BLOCK_N, BLOCK_K/32, 32]`` straight into registers (no shared
memory; the next tile is requested before the current one is used, so two are in flight), multiplies it by each of its BLOCK_M activation rows in fp32 and sums every 32-element
group; MX scales multiply the group sums (once per 32 products, not per weight element). E2M1 and
the bf16 → fp32 widening are bit operations; E4M3 uses the fp8 cast. The split-K epilogue is the
one of the tensor-core decode kernel (tiles.splitk_store). Weight formats: bf16, mxfp8, mxfp4.
"""
import triton
import triton.language as tl

from ..mx.triton_mx import e2m1_value, e8m0_pow2
from .tiles import load_mx, splitk_store


@triton.jit
def _row_sums(b_w, b_q, b_s, p_x, m, k0, M, K, s_xm, s_xk, W_FORMAT: tl.constexpr, BLOCK_K: tl.constexpr):
    """Σ_k W[n, k] x[m, k] over the tile for one activation row m -> [BLOCK_N] fp32 (0 when m >= M)."""
    G: tl.constexpr = BLOCK_K // 32
    o_g = k0 + tl.arange(0, G)[:, None] * 32                      # [G, 1]: first column of each group
    p_g = p_x + m * s_xm + o_g * s_xk
    m_x = (o_g < K) & (o_g * 0 + m < M)
    if W_FORMAT == "mxfp4":                                     # low nibble: even k, high nibble: odd k
        o_e = tl.arange(0, 16)[None, :, None] * 2 + tl.arange(0, 2)[None, None, :]
        b_x = tl.load(p_g[:, :, None] + o_e * s_xk, mask=m_x[:, :, None], other=0.0).to(tl.float32)
        x_even, x_odd = tl.split(b_x)                           # [G, 16] each
        part = tl.sum(e2m1_value(b_q, tl.float32) * x_even[None, :, :], axis=2) \
            + tl.sum(e2m1_value(b_q >> 4, tl.float32) * x_odd[None, :, :], axis=2)
        part = part * e8m0_pow2(b_s, tl.float32)
    else:
        b_x = tl.load(p_g + tl.arange(0, 32)[None, :] * s_xk, mask=m_x, other=0.0).to(tl.float32)
        part = tl.sum(b_w * b_x[None, :, :], axis=2)            # [BLOCK_N, G]
        if W_FORMAT == "mxfp8":
            part = part * e8m0_pow2(b_s, tl.float32)
    return tl.sum(part, axis=1)


@triton.jit
def _load_w(p_w, p_s, o_n, k0, N, k_end, s_wn, s_wk, s_sn, s_sk, W_FORMAT: tl.constexpr, BLOCK_K: tl.constexpr):
    """Raw weight tile at k0 (zeros at and past k_end): bf16 [BLOCK_N, BLOCK_K/32, 32] (+ itself as dummy
    scales), or MX codes and scale bytes (tiles.load_mx)."""
    if W_FORMAT == "bf16":
        o_k = k0 + tl.arange(0, BLOCK_K // 32)[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
        b_q = tl.load(p_w + o_n[:, None, None] * s_wn + o_k * s_wk, mask=(o_n[:, None, None] < N) & (o_k < k_end),
                      other=0.0)
        b_s = b_q
    else:
        b_q, b_s = load_mx(p_w, p_s, o_n, k0, N, k_end, s_wn, s_wk, s_sn, s_sk, W_FORMAT, BLOCK_K)
    return b_q, b_s


@triton.jit(do_not_specialize=["M"])
def gemv_splitk_kernel(
        # pointers (as gemm_splitk_kernel; p_s: MX scales, or any valid pointer for bf16)
        p_x, p_w, p_s, p_y, p_part, p_lock,
        # sizes (K_SPLIT: K columns per split, a multiple of BLOCK_K)
        M, N, K, K_SPLIT,
        # strides
        s_xm, s_xk, s_wn, s_wk, s_sn, s_sk, s_ym, s_yn,
        W_FORMAT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    i_n, i_m, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_mm = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_lo = i_s * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)
    b_q, b_s = _load_w(p_w, p_s, o_n, k_lo, N, k_hi, s_wn, s_wk, s_sn, s_sk, W_FORMAT, BLOCK_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        # prefetch the next tile (masked off past the split) before using this one: two tiles in flight
        n_q, n_s = _load_w(p_w, p_s, o_n, k0 + BLOCK_K, N, k_hi, s_wn, s_wk, s_sn, s_sk, W_FORMAT, BLOCK_K)
        b_w = b_q.to(tl.float32) if W_FORMAT != "mxfp4" else b_q
        for j in tl.static_range(BLOCK_M):
            r = _row_sums(b_w, b_q, b_s, p_x, i_m * BLOCK_M + j, k0, M, K, s_xm, s_xk, W_FORMAT, BLOCK_K)
            acc += tl.where(o_mm[None, :] == j, r[:, None], 0.0)
        b_q, b_s = n_q, n_s
    splitk_store(acc, p_y, p_part, p_lock, o_n, i_m * BLOCK_M + o_mm, M, N, s_ym, s_yn, BLOCK_N, BLOCK_M, SPLIT_K)
