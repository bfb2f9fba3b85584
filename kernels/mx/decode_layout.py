"""The MX decode layout: MX weights rearranged once at load so that a GPU without MX units unpacks them
into fp16 pairs with a few bit operations per 32-bit word (no lookup, no int->float conversion).

Input: OCP MX weights as kernels/mx/reference makes them, ``q`` [N, K] (mxfp8: float8_e4m3fn; mxfp4:
uint8 [N, K/2], first element in the low nibble) and E8M0 scales uint8 ``s`` [N, K/32]; K % 32 == 0.

Output (:func:`pack`): ``DecodeWeights(codes, scales, w_format, k)``

- ``codes`` uint8 [N, K] (mxfp8) or [N, K/2] (mxfp4): each row is a run of 32-element groups, one group
  per 32 (mxfp8) or 16 (mxfp4) contiguous bytes, so a thread that loads 16 bytes gets a whole group
  (mxfp4) or half of one (mxfp8). Within a group the bytes are viewed as little-endian 32-bit words:

  * mxfp4, word w (elements 8w … 8w+7): element 8w+2p sits in bits 4p…4p+3, element 8w+2p+1 in bits
    16+4p…16+4p+3 (p = 0…3): the low half holds the even elements, the high half the odd ones. Pair p
    (elements 8w+2p, 8w+2p+1) as two fp16 is ``t = w >> 4p; ((t << 9) & 0x0E000E00) | ((t << 12) & 0x80008000)``.
  * mxfp8, word w (elements 4w … 4w+3) holds bytes (e0, e2, e1, e3): pair (4w, 4w+1) as two fp16 is
    ``((w << 7) & 0x3F803F80) | ((w << 8) & 0x80008000)``, pair (4w+2, 4w+3) is
    ``((w >> 1) & 0x3F803F80) | (w & 0x80008000)``.

  The fp16 values so built are the element values times 2**-C: E2M1 magnitude bits (e, m) land on the
  fp16 exponent's two low bits and the mantissa's top bit (C = 14), E4M3's (eeee, mmm) on the fp16
  exponent's four low bits and the mantissa's top three (C = 8); E2M1 0.5 and the E4M3 subnormals become
  fp16 subnormals, exactly. E4M3 NaN codes (0x7F, 0xFF; the quantiser never writes them) decode as 480.
- ``row_exp`` uint8 [N]: each row's largest E8M0 byte, the base the folded-scale kernel (gemm_mx_layout,
  "mxdec_fold") measures its group scales from.
- ``scales`` uint8 [K/32, N]: per 32-group, the E8M0 byte plus C, so the fp32 factor that undoes both the
  scale and 2**-C is the bit pattern ``scales << 23`` (one shift); transposed so that the scales of one
  group of neighbouring rows are contiguous. Scale bytes above 254 - C (2**113 and beyond for mxfp4) and
  the NaN scale 0xFF are refused at pack time.

:func:`unpack` inverts :func:`pack` exactly; :func:`dequantize` computes W from the layout with the same
bit operations a kernel uses (plain torch: the reference for a kernel reading this layout).
"""
from dataclasses import dataclass

import torch

BLOCK = 32
C_SHIFT = {"mxfp4": 14, "mxfp8": 8}          # fp16 built from the codes = value * 2**-C
FORMATS = tuple(C_SHIFT)
# byte order of one 32-element group: position i of the layout holds element ORDER[fmt][i] of the group
_MXFP8_WORD = (0, 2, 1, 3)                    # bytes of a word: elements (4w, 4w+2, 4w+1, 4w+3)
SIGNS = 0x80008000 - 2**32                    # the sign bits of both fp16 halves, as a signed int32


@dataclass(frozen=True)
class DecodeWeights:
    """MX weights in the decode layout (see the module docstring)."""
    codes: torch.Tensor          # uint8 [N, K] (mxfp8) | [N, K/2] (mxfp4)
    scales: torch.Tensor         # uint8 [K/32, N]: E8M0 + C_SHIFT[w_format]
    w_format: str                # "mxfp8" | "mxfp4"
    k: int
    row_exp: torch.Tensor | None = None   # uint8 [N]: each row's largest E8M0 byte (the folded-scale kernel's base)


def _check(w_format: str) -> None:
    if w_format not in FORMATS:
        raise ValueError(f"w_format: {w_format!r} is not one of {FORMATS}")


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """mxfp4 bytes [N, K/2] -> codes [N, K] (int32, element order)."""
    q = q.to(torch.int32)
    return torch.stack((q & 15, q >> 4), dim=-1).reshape(q.shape[0], -1)


def pack(q: torch.Tensor, s: torch.Tensor, w_format: str) -> DecodeWeights:
    """OCP MX weights (q, s) -> the decode layout."""
    _check(w_format)
    n = q.shape[0]
    k = q.shape[1] * (2 if w_format == "mxfp4" else 1)
    if k % BLOCK:
        raise ValueError(f"q: K={k} must be a multiple of {BLOCK}")
    if list(s.shape) != [n, k // BLOCK] or s.dtype != torch.uint8:
        raise ValueError(f"s: expected uint8 [N={n}, K/32={k // BLOCK}], got {s.dtype} {list(s.shape)}")
    c = C_SHIFT[w_format]
    if (s.to(torch.int32) > 254 - c).any():
        raise ValueError(f"s: scale bytes above {254 - c} (2**{127 - c} or NaN) do not fit the decode layout")
    if w_format == "mxfp8":
        b = q.view(torch.uint8).reshape(n, k // 4, 4)[:, :, list(_MXFP8_WORD)]
        codes = b.reshape(n, k).contiguous()
    else:
        e = _nibbles(q).reshape(n, k // 8, 4, 2)                 # [N, words, p, (even, odd)]
        lo = (e[..., 0] << (4 * torch.arange(4, device=q.device))).sum(-1)
        hi = (e[..., 1] << (4 * torch.arange(4, device=q.device))).sum(-1)
        word = lo | (hi << 16)                                   # int32 (bit 31 may be set: wraps, bits kept)
        codes = torch.stack([(word >> (8 * i)) & 255 for i in range(4)], dim=-1).to(torch.uint8).reshape(n, k // 2)
    scales = (s.to(torch.int32) + c).to(torch.uint8).t().contiguous()
    return DecodeWeights(codes, scales, w_format, k, s.amax(dim=1).contiguous())


def _words(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [N, B] (B % 4 == 0) -> little-endian int32 words [N, B/4]."""
    b = codes.to(torch.int32).reshape(codes.shape[0], -1, 4)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def unpack(dw: DecodeWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode layout -> the OCP MX weights (q, s) it was packed from (exact inverse of :func:`pack`)."""
    _check(dw.w_format)
    n, k = dw.codes.shape[0], dw.k
    s = (dw.scales.t().to(torch.int32) - C_SHIFT[dw.w_format]).to(torch.uint8).contiguous()
    if dw.w_format == "mxfp8":
        inv = [_MXFP8_WORD.index(i) for i in range(4)]
        q = dw.codes.reshape(n, k // 4, 4)[:, :, inv].reshape(n, k).contiguous().view(torch.float8_e4m3fn)
        return q, s
    w = _words(dw.codes)                                         # [N, K/8]
    sh = 4 * torch.arange(4, device=w.device)
    even = (w[..., None] >> sh) & 15                             # [N, K/8, 4]
    odd = (w[..., None] >> (sh + 16)) & 15
    e = torch.stack((even, odd), dim=-1).reshape(n, k)           # element order
    q = (e[:, 0::2] | (e[:, 1::2] << 4)).to(torch.uint8)
    return q, s


def _fp16(bits: torch.Tensor) -> torch.Tensor:
    """int32 holding an fp16 bit pattern in its low 16 bits -> float32 value."""
    return (bits & 0xFFFF).to(torch.int16).view(torch.float16).float()


def dequantize(dw: DecodeWeights, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W [N, K] from the layout with the kernel's bit operations: fp16 pairs per word, then the per-group
    fp32 factor ``scales << 23`` (2**(E8M0 - 127 + C))."""
    _check(dw.w_format)
    n, k = dw.codes.shape[0], dw.k
    w = _words(dw.codes)
    if dw.w_format == "mxfp4":
        pairs = []
        for p in range(4):
            t = w >> (4 * p)
            pairs.append(((t << 9) & 0x0E000E00) | ((t << 12) & SIGNS))
        v = torch.stack(pairs, dim=-1)                          # [N, K/8, 4]: pair p of word w
    else:
        a = ((w << 7) & 0x3F803F80) | ((w << 8) & SIGNS)    # elements (4w, 4w+1)
        b = ((w >> 1) & 0x3F803F80) | (w & SIGNS)           # elements (4w+2, 4w+3)
        v = torch.stack((a, b), dim=-1)                          # [N, K/4, 2]
    vals = torch.stack((_fp16(v), _fp16(v >> 16)), dim=-1).reshape(n, k)   # (lo, hi) = consecutive elements
    factor = (dw.scales.t().to(torch.int32) << 23).view(torch.float32)     # [N, K/32]
    return (vals.reshape(n, k // BLOCK, BLOCK) * factor[..., None]).reshape(n, k).to(dtype)


def quantize_x_mxfp8(x: torch.Tensor) -> torch.Tensor:
    """Activations x [M, K] (K % 32 == 0) quantised to MXFP8 per token and 32-group and dequantised again, fp32 [M, K]:
    the x that the fp8-MMA decode kernel (kernels/gemm/gemm_mx_layout, MMA "fp8") multiplies.

    The rule is vLLM's activation quantiser for its MXFP8 linear (``_mxfp8_e4m3_quantize_torch``,
    vllm/model_executor/layers/quantization/utils/mxfp8_utils.py:38-71): E8M0 byte
    ``ceil(log2(amax / 448)) + 127`` clamped to [0, 254], elements ``x / 2**(byte - 127)`` rounded to e4m3
    (no saturation needed: the block maximum lands at or under 448). An all-zero block gets byte 0.
    """
    xb = x.float().reshape(x.shape[0], -1, BLOCK)
    amax = xb.abs().amax(-1)
    f, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))      # amax = f * 2**e, f in [0.5, 1)
    ex = (e - 1 - 8 + (f > 0.875).to(e.dtype)).clamp(-127, 127)                 # 448 = 1.75 * 2**8
    ex = torch.where(amax > 0, ex, torch.full_like(ex, -127))
    step = torch.pow(2.0, ex.double()).float()[..., None]                         # exact powers of two
    q = (xb / step).to(torch.float8_e4m3fn).float()
    return (q * step).reshape(x.shape)
