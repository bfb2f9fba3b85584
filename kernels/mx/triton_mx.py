"""MX quantise / dequantise in Triton (MXFP8 E4M3 and MXFP4 E2M1; the math is in reference.py).

One program handles a tile of ``BLOCK_R`` rows × ``BLOCKS`` MX blocks (32 elements each) of a
``[R, K]`` view. Rounding is done in fp32 arithmetic (not by the fp8 cast, whose rounding differs
between the GPU and the CPU interpreter), so the codes are bit-identical to the reference.
MXFP4 reads the even and odd elements of each block separately, which packs two codes per byte
(first element in the low nibble) without any reshape.

Decoding (``e2m1_value``, ``e8m0_pow2``; ``e2m1_to_f32``, ``e8m0_to_f32`` in fp32) builds the values from
their bits: no int->float conversion, no arithmetic. Every MX kernel of kernels/ decodes through these. (H200,
2026-12-01, ``m3lab.bench.kernel_probe``: on the MoE kernel's weight-tile path, MXFP4 [N, K] dequantised then
``tl.dot``, the bit construction ran 1.02-1.26x faster than the arithmetic decode at M 16-64, N 1536/6144.)
"""
import torch
import triton
import triton.language as tl

from ..launches import launch
from .reference import BLOCK

# Inside @triton.jit the format constants of reference.py appear as literals: E4M3 emax 8 and max 448,
# E2M1 emax 2 and max 6, E8M0 bias 127 (0xFF = NaN).

BLOCK_R = 16   # rows per program; quantisation is off the GEMM hot path, so 16 x 4 blocks (2048 elements)
BLOCKS = 4     # per program is a plain default, not tuned


@triton.jit
def f32_exponent(v):
    """floor(log2|v|) from the fp32 bits (-127 for 0 and subnormals)."""
    return ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def pow2(e):
    """2**e as fp32 for integer e in [-126, 127] (exact, built from bits)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def e8m0_pow2(b_s, CT: tl.constexpr):
    """E8M0 bytes -> 2**(s-127) in CT (bf16 or fp32), built from bits (0 -> 2**-127, 0xFF -> NaN)."""
    if CT == tl.bfloat16:
        s = b_s.to(tl.int16)
        v = tl.where(s == 0, 64, s << 7)                       # 2**-127 is the bf16 subnormal 0x0040
        out = tl.where(s == 255, 0x7FC0, v).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        s = b_s.to(tl.int32)
        v = tl.where(s == 0, 0x00400000, s << 23)
        out = tl.where(s == 255, 0x7FC00000, v).to(tl.float32, bitcast=True)
    return out


@triton.jit
def e2m1_value(c, CT: tl.constexpr):
    """E2M1 codes (low 4 bits of an int) -> values in CT (bf16 or fp32), by bit construction.

    Magnitude t = c & 7 = (e, m): t >= 2 is (1 + m/2) 2**(e-1), i.e. t's bits shifted under the exponent
    field plus the exponent of 0.5; t in {0, 1} is t * 0.5. No int->float conversion, no arithmetic.
    """
    if CT == tl.bfloat16:
        c = c.to(tl.int16)
        t = c & 7
        bits = tl.where(t < 2, t * 0x3F00, (t << 6) + 0x3F00) | ((c & 8) << 12)
        out = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        c = c.to(tl.int32)
        t = c & 7
        bits = tl.where(t < 2, t * 0x3F000000, (t << 22) + 0x3F000000) | ((c & 8) << 28)
        out = bits.to(tl.float32, bitcast=True)
    return out


@triton.jit
def e8m0_to_f32(b_s):
    """E8M0 scale bytes -> 2**(s-127) in fp32 (0 -> 2**-127, 0xFF -> NaN)."""
    return e8m0_pow2(b_s, tl.float32)


@triton.jit
def e2m1_to_f32(b_c):
    """E2M1 codes (low 4 bits of an int) -> fp32 value."""
    return e2m1_value(b_c, tl.float32)


@triton.jit
def round_e4m3(v):
    """Round fp32 v (|v| <= 448) to the nearest-even E4M3 value, kept in fp32 (sign kept: -tiny -> -0.0)."""
    a = tl.abs(v)
    e = tl.maximum(f32_exponent(a), -6)                        # subnormals share the quantum 2**-9
    r = (a * pow2(3 - e) + 12582912.0) - 12582912.0            # 3 mantissa bits; 1.5 * 2**23: nearest-even
    r = r * pow2(e - 3)
    return tl.where(v.to(tl.int32, bitcast=True) < 0, -r, r)     # sign bit: -0.0 stays -0.0, as torch casts


@triton.jit
def f32_to_e2m1(v):
    """fp32 (already scaled) -> E2M1 code 0..15: nearest-even, saturating at 6."""
    a = tl.abs(v)
    c = (a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32) \
        + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32)
    return c | ((v < 0).to(tl.int32) << 3)


@triton.jit
def block_scale(amax, EMAX: tl.constexpr):
    """Per-block amax -> (shared exponent int32, E8M0 byte int32); non-finite amax -> 0xFF."""
    exp = tl.where(amax == 0, -127, f32_exponent(amax) - EMAX)
    exp = tl.minimum(tl.maximum(exp, -127), 127)
    bad = amax != amax
    bad = bad | (amax == float("inf"))
    return exp, tl.where(bad, 255, exp + 127)


@triton.jit
def _offsets(pid_r, pid_b, R, NB, ELEMS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCKS: tl.constexpr):
    """Row, block and element offsets of a [BLOCK_R, BLOCKS, ELEMS] tile; mask [BLOCK_R, BLOCKS]."""
    o_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    o_b = pid_b * BLOCKS + tl.arange(0, BLOCKS)
    o_e = tl.arange(0, ELEMS)
    m_rb = (o_r[:, None] < R) & (o_b[None, :] < NB)
    return o_r, o_b, o_e, m_rb


@triton.jit
def quant_mxfp8_kernel(p_x, p_q, p_s, R, K, s_x, s_q, s_s,
                       BLOCK_R: tl.constexpr, BLOCKS: tl.constexpr):
    o_r, o_b, o_e, m_rb = _offsets(tl.program_id(0), tl.program_id(1), R, K // 32, 32, BLOCK_R, BLOCKS)
    o_k = o_b[None, :, None] * 32 + o_e[None, None, :]
    m = m_rb[:, :, None]
    b_x = tl.load(p_x + o_r[:, None, None] * s_x + o_k, mask=m, other=0.0).to(tl.float32)
    exp, byte = block_scale(tl.max(tl.abs(b_x), axis=2), 8)
    v = b_x * pow2(-exp)[:, :, None]
    v = tl.minimum(tl.maximum(v, -448.0), 448.0)
    code = round_e4m3(v).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    # a zero code takes the input's sign bit explicitly (reference.py does the same), so -0.0 (0x80) does not
    # depend on how a device's fp32 -> fp8 conversion treats negative values that round to zero
    code = tl.where((code & 0x7F) == 0, ((b_x.to(tl.int32, bitcast=True) >> 24) & 0x80).to(tl.uint8), code)
    tl.store(p_q + o_r[:, None, None] * s_q + o_k, code.to(tl.float8e4nv, bitcast=True), mask=m)
    tl.store(p_s + o_r[:, None] * s_s + o_b[None, :], byte.to(tl.uint8), mask=m_rb)


@triton.jit
def quant_mxfp4_kernel(p_x, p_q, p_s, R, K, s_x, s_q, s_s,
                       BLOCK_R: tl.constexpr, BLOCKS: tl.constexpr):
    o_r, o_b, o_e, m_rb = _offsets(tl.program_id(0), tl.program_id(1), R, K // 32, 16, BLOCK_R, BLOCKS)
    o_p = o_b[None, :, None] * 16 + o_e[None, None, :]          # byte index in the row
    m = m_rb[:, :, None]
    p_row = p_x + o_r[:, None, None] * s_x
    b_lo = tl.load(p_row + 2 * o_p, mask=m, other=0.0).to(tl.float32)
    b_hi = tl.load(p_row + 2 * o_p + 1, mask=m, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(b_lo), axis=2), tl.max(tl.abs(b_hi), axis=2))
    exp, byte = block_scale(amax, 2)
    inv = pow2(-exp)[:, :, None]
    code = f32_to_e2m1(b_lo * inv) | (f32_to_e2m1(b_hi * inv) << 4)
    tl.store(p_q + o_r[:, None, None] * s_q + o_p, code.to(tl.uint8), mask=m)
    tl.store(p_s + o_r[:, None] * s_s + o_b[None, :], byte.to(tl.uint8), mask=m_rb)


@triton.jit
def dequant_mx_kernel(p_q, p_s, p_y, R, K, s_q, s_s, s_y,
                      FP4: tl.constexpr, BLOCK_R: tl.constexpr, BLOCKS: tl.constexpr):
    o_r, o_b, o_e, m_rb = _offsets(tl.program_id(0), tl.program_id(1), R, K // 32, 32, BLOCK_R, BLOCKS)
    o_k = o_b[None, :, None] * 32 + o_e[None, None, :]
    m = m_rb[:, :, None]
    if FP4:
        b_c = tl.load(p_q + o_r[:, None, None] * s_q + o_k // 2, mask=m, other=0).to(tl.int32)
        b_v = e2m1_to_f32(b_c >> ((o_k % 2) * 4))
    else:
        b_v = tl.load(p_q + o_r[:, None, None] * s_q + o_k, mask=m, other=0.0).to(tl.float32)
    b_s = e8m0_to_f32(tl.load(p_s + o_r[:, None] * s_s + o_b[None, :], mask=m_rb, other=127))
    tl.store(p_y + o_r[:, None, None] * s_y + o_k, (b_v * b_s[:, :, None]).to(p_y.dtype.element_ty), mask=m)


def _rows(x: torch.Tensor, k: int, name: str) -> torch.Tensor:
    if k % BLOCK:
        raise ValueError(f"{name}: last dimension {k} must be a multiple of the MX block size {BLOCK}")
    return x.reshape(-1, x.shape[-1])


def _grid(r: int, k: int) -> tuple[int, int]:
    return triton.cdiv(r, BLOCK_R), triton.cdiv(k // BLOCK, BLOCKS)


def quantize(x: torch.Tensor, fmt: str, out: tuple[torch.Tensor, torch.Tensor] | None = None):
    """x: [..., K] -> (q, scale uint8 [..., K/32]); q is float8_e4m3fn [..., K] (mxfp8) or uint8 [..., K/2] (mxfp4).

    ``out`` (optional, contiguous) receives the result, so callers (the gates) can poison it first.
    """
    k = x.shape[-1]
    x2 = _rows(x.contiguous(), k, "x")
    lead = x.shape[:-1]
    if out is None:
        q = torch.empty(*lead, k if fmt == "mxfp8" else k // 2, device=x.device,
                        dtype=torch.float8_e4m3fn if fmt == "mxfp8" else torch.uint8)
        out = (q, torch.empty(*lead, k // BLOCK, device=x.device, dtype=torch.uint8))
    q2, s2 = out[0].view(-1, out[0].shape[-1]), out[1].view(-1, out[1].shape[-1])
    kernel = {"mxfp8": quant_mxfp8_kernel, "mxfp4": quant_mxfp4_kernel}[fmt]
    launch(kernel, _grid(x2.shape[0], k), x2, q2, s2, x2.shape[0], k, x2.stride(0), q2.stride(0), s2.stride(0),
                                  BLOCK_R=BLOCK_R, BLOCKS=BLOCKS)
    return out


def dequantize(q: torch.Tensor, scale: torch.Tensor, fmt: str, dtype: torch.dtype = torch.float32,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """(q, scale) as made by :func:`quantize` -> [..., K] in dtype."""
    k = q.shape[-1] * (2 if fmt == "mxfp4" else 1)
    q2 = _rows(q.contiguous(), k, "q")
    s2 = scale.contiguous().view(-1, scale.shape[-1])
    if out is None:
        out = torch.empty(*q.shape[:-1], k, device=q.device, dtype=dtype)
    y2 = out.view(-1, k)
    launch(dequant_mx_kernel, _grid(q2.shape[0], k), q2, s2, y2, q2.shape[0], k, q2.stride(0), s2.stride(0), y2.stride(0),
                                             FP4=fmt == "mxfp4", BLOCK_R=BLOCK_R, BLOCKS=BLOCKS)
    return out

