"""Decode kernel for MX weights in the decode layout (kernels/mx/decode_layout): CUDA-core FMAs, split-K.

A program takes BLOCK_N weight rows and a K slice; each row's 32-element groups arrive as 32-bit words
(4 per group for mxfp4, 8 for mxfp8; a group's words are contiguous, so a thread's 16-byte load holds a
whole mxfp4 group or half an mxfp8 one). Every word becomes fp16 pairs by the layout's shifts and masks
(no lookup table, no int->float conversion), widened to fp32 and multiplied by the activations; each
group's sum is multiplied once by its factor ``scales << 23`` (E8M0 with the layout's 2**C folded in).
The next tile's words are requested before the current one is used. Grid (N tiles, M tiles, splits);
the split-K epilogue is tiles.splitk_store.
"""
import triton
import triton.language as tl

from .tiles import splitk_store

SIGNS = tl.constexpr(0x80008000 - 2**32)     # both fp16 sign bits, as a signed int32 literal


@triton.jit
def _fp16_pair(v):
    """int32 holding two fp16 bit patterns -> (low half, high half) as fp32."""
    lo = v.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (v >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _load_words(p_w, p_s, o_n, g0, N, G_END, s_wn, s_sg, WORDS: tl.constexpr, G: tl.constexpr):
    """Words [BLOCK_N, G, WORDS] (int32) of groups g0..g0+G (zeros at and past G_END) and their scale bytes [BLOCK_N, G]."""
    o_g = g0 + tl.arange(0, G)
    m = (o_n[:, None] < N) & (o_g[None, :] < G_END)
    o_w = o_g[None, :, None] * WORDS + tl.arange(0, WORDS)[None, None, :]
    b_w = tl.load(p_w + o_n[:, None, None] * s_wn + o_w, mask=m[:, :, None], other=0)
    b_s = tl.load(p_s + o_g[None, :] * s_sg + o_n[:, None], mask=m, other=0)
    return b_w, b_s


@triton.jit
def _row_dot(b_w, b_f, p_x, m, g0, M, K, s_xm, s_xk, W_FORMAT: tl.constexpr, G: tl.constexpr,
             WORDS: tl.constexpr):
    """Σ_k W[n, k] x[m, k] over the tile's groups -> [BLOCK_N] fp32 (0 when m >= M)."""
    o_j = ((g0 + tl.arange(0, G)) * 32)[:, None] + tl.arange(0, WORDS)[None, :] * (32 // WORDS)   # [G, WORDS]
    ok = (o_j < K) & (o_j * 0 + m < M)
    p_r = p_x + m * s_xm
    part = tl.zeros(b_f.shape, dtype=tl.float32)
    if W_FORMAT == "mxfp4":                                  # word j: elements 8j..8j+7, pair p = (8j+2p, 8j+2p+1)
        for p in tl.static_range(4):
            t = b_w >> (4 * p)
            lo, hi = _fp16_pair(((t << 9) & 0x0E000E00) | ((t << 12) & SIGNS))
            x_lo = tl.load(p_r + (o_j + 2 * p) * s_xk, mask=ok, other=0.0).to(tl.float32)
            x_hi = tl.load(p_r + (o_j + 2 * p + 1) * s_xk, mask=ok, other=0.0).to(tl.float32)
            part += tl.sum(lo * x_lo[None, :, :] + hi * x_hi[None, :, :], axis=2)
    else:                                                    # word j: elements 4j..4j+3 stored (e0, e2, e1, e3)
        a_lo, a_hi = _fp16_pair(((b_w << 7) & 0x3F803F80) | ((b_w << 8) & SIGNS))
        c_lo, c_hi = _fp16_pair(((b_w >> 1) & 0x3F803F80) | (b_w & SIGNS))
        x0 = tl.load(p_r + o_j * s_xk, mask=ok, other=0.0).to(tl.float32)
        x1 = tl.load(p_r + (o_j + 1) * s_xk, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(p_r + (o_j + 2) * s_xk, mask=ok, other=0.0).to(tl.float32)
        x3 = tl.load(p_r + (o_j + 3) * s_xk, mask=ok, other=0.0).to(tl.float32)
        part += tl.sum(a_lo * x0[None, :, :] + a_hi * x1[None, :, :] + c_lo * x2[None, :, :]
                       + c_hi * x3[None, :, :], axis=2)
    return tl.sum(part * b_f, axis=1)


@triton.jit(do_not_specialize=["M"])
def gemv_mx_layout_kernel(
        # pointers: words int32 [N, K/32 * WORDS], pre-biased scale bytes uint8 [K/32, N], p_part/p_lock as gemm_splitk
        p_x, p_w, p_s, p_y, p_part, p_lock,
        # sizes (G_SPLIT: groups per split, a multiple of BLOCK_K/32)
        M, N, K, G_SPLIT,
        # strides (s_wn: words per row; s_sg: scale bytes per group row = N)
        s_xm, s_xk, s_wn, s_sg, s_ym, s_yn,
        W_FORMAT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    WORDS: tl.constexpr = 4 if W_FORMAT == "mxfp4" else 8
    G: tl.constexpr = BLOCK_K // 32
    i_n, i_m, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_mm = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    g_lo = i_s * G_SPLIT
    g_hi = tl.minimum(K // 32, g_lo + G_SPLIT)
    b_w, b_s = _load_words(p_w, p_s, o_n, g_lo, N, g_hi, s_wn, s_sg, WORDS, G)
    for g0 in range(g_lo, g_hi, G):
        n_w, n_s = _load_words(p_w, p_s, o_n, g0 + G, N, g_hi, s_wn, s_sg, WORDS, G)   # next tile in flight
        b_f = (b_s.to(tl.int32) << 23).to(tl.float32, bitcast=True)                     # 2**(E8M0 - 127 + C)
        for j in tl.static_range(BLOCK_M):
            r = _row_dot(b_w, b_f, p_x, i_m * BLOCK_M + j, g0, M, K, s_xm, s_xk, W_FORMAT, G, WORDS)
            acc += tl.where(o_mm[None, :] == j, r[:, None], 0.0)
        b_w, b_s = n_w, n_s
    splitk_store(acc, p_y, p_part, p_lock, o_n, i_m * BLOCK_M + o_mm, M, N, s_ym, s_yn, BLOCK_N, BLOCK_M, SPLIT_K)
