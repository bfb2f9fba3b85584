"""Prefill GEMM ``y[M, N] = x[M, K] @ W[N, K]ᵀ``: 2-D output tiles in grouped program order.

One program computes a ``[BLOCK_M, BLOCK_N]`` tile of y over the whole K (held transposed, see
tiles.py). Program order is a parameter: GROUP_M row tiles sweep the columns together, so
the weight tiles they share are read from L2 rather than HBM (GROUP_M = 1: row-major order).
"""
import triton
import triton.language as tl

from .tiles import grouped_tile, mac_step, row_scale


@triton.jit(do_not_specialize=["M"])
def gemm_tiled_kernel(
        # pointers (p_s: weight scales, or any valid pointer for bf16)
        p_x, p_w, p_s, p_y,
        # sizes
        M, N, K,
        # strides
        s_xm, s_xk, s_wn, s_wk, s_sn, s_sk, s_ym, s_yn,
        # weight format
        W_FORMAT: tl.constexpr, SB_N: tl.constexpr, SB_K: tl.constexpr, NATIVE_MX: tl.constexpr,
        X_FMT: tl.constexpr,
        # tiles
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    i_m, i_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)                           # yᵀ tile
    for k0 in range(0, K, BLOCK_K):
        acc = mac_step(acc, p_x, p_w, p_s, o_m, o_n, k0, M, N, K, s_xm, s_xk, s_wn, s_wk, s_sn, s_sk,
                       W_FORMAT, SB_N, SB_K, NATIVE_MX, X_FMT, BLOCK_N, BLOCK_K)
    acc = row_scale(acc, p_s, o_n, N, W_FORMAT, SB_K)
    m_y = (o_n[:, None] < N) & (o_m[None, :] < M)
    tl.store(p_y + o_n[:, None] * s_yn + o_m[None, :] * s_ym, acc.to(p_y.dtype.element_ty), mask=m_y)
