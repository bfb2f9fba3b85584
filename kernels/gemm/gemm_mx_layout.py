"""Decode GEMMs on tensor cores for MX weights in the decode layout (kernels/mx/decode_layout), M 1 … 64.

``y[M, N] = x[M, K] @ W[N, K]ᵀ`` with the swapped accumulator ``acc[BLOCK_N, BLOCK_M]`` (tiles.py), split-K
(grid axis 2, epilogue tiles.splitk_store: one launch, CUDA-graph safe). Two kernels:

- ``gemm_mx_fold_kernel`` ("mxdec_fold", the launcher's default): each group's scale is folded into its decoded
  fp16 weights as a power of two against the row's largest scale (one packed fp16 multiply per two weights), so
  one MMA covers BLOCK_K = 32 x GROUPS columns; the row's base scale and x's factor multiply the accumulator once.
- ``gemm_mx_layout_kernel`` ("mxdec", "mxdec_fp8"): one K = 32 MMA per group, each group's scale on its partial
  product, ``acc += (W_g @ x_gᵀ) * sw_g[n] * sx_g[m]`` (exact for any scale spread; mxfp8 also on the fp8 MMA).
  H200: slower than the folded kernel at every M (the per-group MMA waits and barriers;
  traces/bench/gemm_mx_layout_sweep_NVIDIA_H200.csv, commit e2d9a2a).

Weights per group (no lookup, no int->float conversion), both kernels:

- mxfp4: the group's four int32 words (16 bytes per row) become eight fp16 pair-words by one shift pair and
  two masks each (decode_layout's pairs, the shifts folded), then fp16 halves -> W_g fp16 [BLOCK_N, 32]
  = value * 2**-14 (exact: E2M1 0.5 is an fp16 subnormal); the 2**14 is in the pre-biased scale.
- mxfp8, MMA "fp16": the e4m3 codes (32 bytes per row) converted to fp16 (exact; one conversion per two codes
  on GPUs with e4m3 support). MMA "fp8": the codes go to an fp8 x fp8 MMA as they are.

Activations: "fp16" multiplies x by a power of two per token (``_x_scale_fp16``: a first pass over the split's
columns puts the token's maximum in [2**14, 2**15)) and rounds to fp16, exact for bf16 inputs down to 2**-29 of
that maximum and never overflowing; ``sx`` undoes it once on the accumulator, so a group's partial product takes
only its weight scale. "fp8" quantises each x_g to MXFP8 per token as vLLM's activation quantiser does
(``_mxfp8_e4m3_quantize_torch``, vllm/model_executor/layers/quantization/utils/mxfp8_utils.py:38-71: E8M0
``ceil(log2(amax / 448)) + 127`` clamped to [0, 254], elements x / 2**e rounded to e4m3), ``sx = 2**e`` per group.
The CPU interpreter's fp32 -> e4m3 cast truncates and turns NaN into 384, so there (ROUND_X) the rounding is done in
fp32 arithmetic first (triton_mx.round_e4m3) and a group holding NaN sets its token's factor to NaN; the GPU's cast
rounds to nearest even and keeps NaN (cvt.rn.satfinite), so a NaN in x reaches its output row either way.

The mxfp8 layout keeps its bytes in the order the CUDA-core kernel's pairs need (e0, e2, e1, e3 per word), so x_g is
permuted the same way in registers (``_layout_order``); mxfp4 decodes in element order.
"""
import triton
import triton.language as tl

from ..mx.triton_mx import round_e4m3
from .tiles import splitk_store

SIGNS = tl.constexpr(0x80008000 - 2**32)     # both fp16 sign bits, as a signed int32 literal
MAGS = tl.constexpr(0x0E000E00)              # E2M1 (e, m) under both fp16 halves' exponent/mantissa


@triton.jit
def _layout_order(b_x, W_FORMAT: tl.constexpr, BLOCK_M: tl.constexpr):
    """x_g [BLOCK_M, 32] in element order -> the order of the decoded weight tile's columns: mxfp4 decodes in element
    order; mxfp8 codes stay in the layout's byte order (e0, e2, e1, e3 per word), so x is permuted to match."""
    if W_FORMAT == "mxfp8":
        b_x = tl.reshape(tl.permute(tl.reshape(b_x, (BLOCK_M, 8, 2, 2)), (0, 1, 3, 2)), (BLOCK_M, 32))
    return b_x


@triton.jit
def _lo(v):
    """int32 holding two fp16 bit patterns -> the low half as fp16."""
    return v.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _hi(v):
    """int32 holding two fp16 bit patterns -> the high half as fp16."""
    return (v >> 16).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _e2m1_group(b_w, BLOCK_N: tl.constexpr):  # BLOCK_N: rows of b_w
    """Words int32 [BLOCK_N, 4] of one mxfp4 group -> fp16 [BLOCK_N, 32] (value * 2**-14), columns in element order.

    Word w, pair p (elements 8w+2p, 8w+2p+1): the codes' nibbles sit at bits 4p (even) and 16+4p (odd); the
    magnitude (e, m) goes under fp16 bits 9-11, the sign to bit 15:
    ``((w << (9-4p)) & MAGS) | ((w << (12-4p)) & SIGNS)``.
    """
    v0 = ((b_w << 9) & MAGS) | ((b_w << 12) & SIGNS)
    v1 = ((b_w << 5) & MAGS) | ((b_w << 8) & SIGNS)
    v2 = ((b_w << 1) & MAGS) | ((b_w << 4) & SIGNS)
    v3 = ((b_w >> 3) & MAGS) | (b_w & SIGNS)
    # [BN, 4 words, a, b, h] with pair p = 2a + b, i.e. column 8w + 4a + 2b + h = element 8w + 2p + h
    lo = tl.join(tl.join(_lo(v0), _lo(v2)), tl.join(_lo(v1), _lo(v3)))
    hi = tl.join(tl.join(_hi(v0), _hi(v2)), tl.join(_hi(v1), _hi(v3)))
    return tl.reshape(tl.join(lo, hi), (BLOCK_N, 32))


@triton.jit
def _x_scale_fp16(p_xr, o_m, g_lo, g_hi, M, s_xk, BLOCK_M: tl.constexpr):
    """Per token, over the groups g_lo..g_hi of x (p_xr: x tile pointers of group 0, [BLOCK_M, 32]): (fx, sx) [BLOCK_M]
    fp32 powers of two, fx putting the maximum |x| in [2**14, 2**15) (fp16 holds x * fx exactly down to 2**-29 of
    that maximum, and never overflows), sx = 1 / fx. Read in the main loop's tile shape, so both share a layout."""
    amax = tl.zeros((BLOCK_M, 32), dtype=tl.float32)
    for g in range(g_lo, g_hi):
        b_x = tl.load(p_xr + g * 32 * s_xk, mask=o_m[:, None] < M, other=0.0)
        amax = tl.maximum(amax, tl.abs(b_x.to(tl.float32)))
    ex = (tl.max(amax, axis=1).to(tl.int32, bitcast=True) >> 23) & 0xFF    # biased exponent (NaN/inf: 255)
    fb = tl.minimum(tl.maximum(268 - ex, 1), 253)                         # 2**(14 - floor(log2 amax)), biased
    return (fb << 23).to(tl.float32, bitcast=True), ((254 - fb) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _x_fp8(b_x, ROUND_X: tl.constexpr):
    """x_g [BLOCK_M, 32] -> (e4m3 [BLOCK_M, 32], sx [BLOCK_M] fp32) as vLLM quantises activations (module docstring)."""
    b_x = b_x.to(tl.float32)
    amax = tl.max(tl.abs(b_x), axis=1)
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 - 8 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)   # 448 = 1.75 * 2**8
    e = tl.where(amax == 0, -127, e)
    e = tl.minimum(tl.maximum(e, -127), 127)
    v = b_x * ((127 - e) << 23).to(tl.float32, bitcast=True)[:, None]   # x / 2**e (2**-e is normal here)
    if ROUND_X:
        v = round_e4m3(v)
    sx = tl.where(e == -127, 5.877471754111438e-39, ((e + 127) << 23).to(tl.float32, bitcast=True))
    if ROUND_X:                                  # the interpreter's cast also turns NaN into 384: flag the row
        bad = tl.max((b_x != b_x).to(tl.int32), axis=1) > 0
        sx = tl.where(bad, float("nan"), sx)
    return v.to(tl.float8e4nv), sx


@triton.jit(do_not_specialize=["M"])
def gemm_mx_layout_kernel(
        # pointers: codes (mxfp4: int32 words [N, K/8]; mxfp8: e4m3 [N, K]), pre-biased scale bytes uint8 [K/32, N],
        # p_part/p_lock as gemm_splitk
        p_x, p_w, p_s, p_y, p_part, p_lock,
        # sizes (G_SPLIT: groups per split, a multiple of GROUPS)
        M, N, K, G_SPLIT,
        # strides (s_wn: words (mxfp4) or bytes (mxfp8) per row; s_sg: scale bytes per group row = N)
        s_xm, s_xk, s_wn, s_sg, s_ym, s_yn,
        W_FORMAT: tl.constexpr, MMA: tl.constexpr, C_SHIFT: tl.constexpr, ROUND_X: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, SPLIT_K: tl.constexpr,
        EVEN: tl.constexpr):
    """EVEN: N % BLOCK_N == 0 and every split holds G_SPLIT groups (no weight masks)."""
    i_n, i_m, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_x = tl.arange(0, 32)
    p_xr = p_x + o_m[:, None] * s_xm + o_x[None, :] * s_xk
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    g_lo = i_s * G_SPLIT
    g_hi = tl.minimum(K // 32, g_lo + G_SPLIT)
    if MMA == "fp16":
        fx, sx = _x_scale_fp16(p_xr, o_m, g_lo, g_hi, M, s_xk, BLOCK_M)
    # fp16 weights carry 2**-C (mxfp4 pairs); converted e4m3 codes carry no factor
    bias: tl.constexpr = 0 if W_FORMAT == "mxfp4" else C_SHIFT
    for g0 in range(g_lo, g_hi, GROUPS):
        for j in tl.static_range(GROUPS):
            g = g0 + j
            if EVEN:
                m_g = o_n >= 0
            else:
                m_g = (o_n < N) & (o_n * 0 + g < g_hi)           # rows of this group that exist
            b_s = tl.load(p_s + g * s_sg + o_n, mask=m_g, other=0).to(tl.int32)
            sw = ((b_s - bias) << 23).to(tl.float32, bitcast=True)
            if W_FORMAT == "mxfp8":
                sw = tl.where(b_s == bias, 5.877471754111438e-39, sw)      # E8M0 0: 2**-127
            if W_FORMAT == "mxfp4":
                b_w = tl.load(p_w + o_n[:, None] * s_wn + g * 4 + tl.arange(0, 4)[None, :], mask=m_g[:, None],
                              other=0)
                b_w = _e2m1_group(b_w, BLOCK_N)
            else:
                b_w = tl.load(p_w + o_n[:, None] * s_wn + g * 32 + tl.arange(0, 32)[None, :], mask=m_g[:, None],
                              other=0.0)
                if MMA == "fp16":
                    b_w = b_w.to(tl.float16)
            b_x = tl.load(p_xr + g * 32 * s_xk, mask=(o_m[:, None] < M) & (o_x[None, :] * 0 + g < g_hi), other=0.0)
            b_x = _layout_order(b_x, W_FORMAT, BLOCK_M)
            if MMA == "fp8":
                b_x, sx_g = _x_fp8(b_x, ROUND_X)
                acc += tl.dot(b_w, tl.trans(b_x)) * (sw[:, None] * sx_g[None, :])
            else:
                b_x = (b_x.to(tl.float32) * fx[:, None]).to(tl.float16)
                acc += tl.dot(b_w, tl.trans(b_x)) * sw[:, None]
    if MMA == "fp16":
        acc = acc * sx[None, :]
    splitk_store(acc, p_y, p_part, p_lock, o_n, o_m, M, N, s_ym, s_yn, BLOCK_N, BLOCK_M, SPLIT_K)


# long: one Triton program (scale fold, K loop, split-K store); its steps are already jit helpers
@triton.jit(do_not_specialize=["M"])
def gemm_mx_fold_kernel(
        # as gemm_mx_layout_kernel, plus p_r: uint8 [N], each row's largest E8M0 byte (DecodeWeights.row_exp)
        p_x, p_w, p_s, p_r, p_y, p_part, p_lock,
        M, N, K, G_SPLIT,
        s_xm, s_xk, s_wn, s_sg, s_ym, s_yn,
        W_FORMAT: tl.constexpr, C_SHIFT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, SPLIT_K: tl.constexpr,
        EVEN: tl.constexpr):
    """Folded scales: one fp16 MMA per BLOCK_K = 32 x GROUPS columns. Each decoded fp16 weight is multiplied by
    2**(s_g - r_n) (fp16, a power of two <= 1: the group's E8M0 byte against the row's largest, r_n), x by its
    per-token power of two (_x_scale_fp16); 2**(r_n - 127) and 1 / fx multiply the accumulator once. Exact while a
    group's scale is within 2**-15 (mxfp8) / 2**-23 (mxfp4) of its row's largest; a group further below loses bits
    as fp16 subnormals or vanishes, each weight then off by at most 2**-23 of its row's largest |w|
    (tests/test_kernels_gemm_mxdec.py::test_folded_scales_far_below_the_row_maximum)."""
    BLOCK_K: tl.constexpr = 32 * GROUPS
    i_n, i_m, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_x = tl.arange(0, 32)
    g_lo = i_s * G_SPLIT
    g_hi = tl.minimum(K // 32, g_lo + G_SPLIT)
    fx, sx = _x_scale_fp16(p_x + o_m[:, None] * s_xm + o_x[None, :] * s_xk, o_m, g_lo, g_hi, M, s_xk, BLOCK_M)
    r = tl.load(p_r + o_n, mask=o_n < N, other=0).to(tl.int32)
    # decoded mxfp4 pairs carry 2**-14, converted e4m3 codes nothing: f = 2**(s - C - r + CF)
    CF: tl.constexpr = 14 if W_FORMAT == "mxfp4" else 0
    o_k = tl.arange(0, BLOCK_K)
    o_g = tl.arange(0, GROUPS)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for g0 in range(g_lo, g_hi, GROUPS):
        p_g = p_s + (g0 + o_g)[None, :] * s_sg + o_n[:, None]
        if EVEN:
            b_s = tl.load(p_g).to(tl.int32)
        else:
            b_s = tl.load(p_g, mask=(o_n[:, None] < N) & (g0 + o_g[None, :] < g_hi), other=0).to(tl.int32)
        d = b_s - C_SHIFT - r[:, None] + CF + 127                                   # biased exponent of f
        f = tl.where(d > 0, d << 23, 0).to(tl.float32, bitcast=True).to(tl.float16)   # [BN, GROUPS]
        f = tl.reshape(f, (BLOCK_N * GROUPS, 1))
        if W_FORMAT == "mxfp4":
            o_c = g0 * 4 + tl.arange(0, 4 * GROUPS)
            p_c = p_w + o_n[:, None] * s_wn + o_c[None, :]
            if EVEN:
                b_w = tl.load(p_c)
            else:
                b_w = tl.load(p_c, mask=(o_n[:, None] < N) & (o_c[None, :] < g_hi * 4), other=0)
            b_w = _e2m1_group(tl.reshape(b_w, (BLOCK_N * GROUPS, 4)), BLOCK_N * GROUPS)
        else:
            o_c = g0 * 32 + o_k
            p_c = p_w + o_n[:, None] * s_wn + o_c[None, :]
            if EVEN:
                b_w = tl.load(p_c)
            else:
                b_w = tl.load(p_c, mask=(o_n[:, None] < N) & (o_c[None, :] < g_hi * 32), other=0.0)
            b_w = tl.reshape(b_w.to(tl.float16), (BLOCK_N * GROUPS, 32))
        b_w = tl.reshape(b_w * f, (BLOCK_N, BLOCK_K))
        k_x = g0 * 32 + o_k
        b_x = tl.load(p_x + o_m[:, None] * s_xm + k_x[None, :] * s_xk,
                      mask=(o_m[:, None] < M) & (k_x[None, :] < g_hi * 32), other=0.0)
        if W_FORMAT == "mxfp8":
            b_x = tl.reshape(b_x, (BLOCK_M, BLOCK_K // 4, 2, 2))                  # the layout's (e0, e2, e1, e3)
            b_x = tl.reshape(tl.permute(b_x, (0, 1, 3, 2)), (BLOCK_M, BLOCK_K))
        b_x = (b_x.to(tl.float32) * fx[:, None]).to(tl.float16)
        acc = tl.dot(b_w, tl.trans(b_x), acc)
    fr = tl.where(r > 0, r << 23, 0x00400000).to(tl.float32, bitcast=True)           # 2**(r - 127)
    acc = acc * fr[:, None] * sx[None, :]
    splitk_store(acc, p_y, p_part, p_lock, o_n, o_m, M, N, s_ym, s_yn, BLOCK_N, BLOCK_M, SPLIT_K)
