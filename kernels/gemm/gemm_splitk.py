"""Decode GEMM ``y[M, N] = x[M, K] @ W[N, K]ᵀ`` for small M: swapped operands and split-K.

The accumulator is swapped (``acc[BLOCK_N, BLOCK_M] = W_tile @ x_tileᵀ``, see tiles.py), so a
narrow M (1…128) wastes no MMA rows, and the splits (grid axis 2) share each output tile so that
enough programs stream weights to fill the GPU. Each split writes an fp32 partial to a workspace;
the last split of a tile to arrive (counted with an atomic per tile) sums the partials, writes y
and resets its counter, so one launch does the whole GEMM and stays CUDA-graph safe.
"""
import triton
import triton.language as tl

from .tiles import mac_step, row_scale, splitk_store


@triton.jit(do_not_specialize=["M"])
def gemm_splitk_kernel(
        # pointers (p_part: fp32 workspace [SPLIT_K, tiles, BLOCK_N*BLOCK_M]; p_lock: int32 [tiles], zeroed once)
        p_x, p_w, p_s, p_y, p_part, p_lock,
        # sizes (K_SPLIT: K columns per split, a multiple of BLOCK_K)
        M, N, K, K_SPLIT,
        # strides
        s_xm, s_xk, s_wn, s_wk, s_sn, s_sk, s_ym, s_yn,
        # weight format
        W_FORMAT: tl.constexpr, SB_N: tl.constexpr, SB_K: tl.constexpr, NATIVE_MX: tl.constexpr,
        X_FMT: tl.constexpr,
        # tiles (SPLIT_K: splits along K = grid axis 2)
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    i_n, i_m, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(i_s * K_SPLIT, tl.minimum(K, (i_s + 1) * K_SPLIT), BLOCK_K):
        acc = mac_step(acc, p_x, p_w, p_s, o_m, o_n, k0, M, N, K, s_xm, s_xk, s_wn, s_wk, s_sn, s_sk,
                       W_FORMAT, SB_N, SB_K, NATIVE_MX, X_FMT, BLOCK_N, BLOCK_K)
    acc = row_scale(acc, p_s, o_n, N, W_FORMAT, SB_K)
    splitk_store(acc, p_y, p_part, p_lock, o_n, o_m, M, N, s_ym, s_yn, BLOCK_N, BLOCK_M, SPLIT_K)
