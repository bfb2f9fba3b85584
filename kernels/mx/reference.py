"""OCP Microscaling (MX v1.0) quantisation in plain torch: the ground truth for the Triton kernels.

A block of 32 consecutive elements along the last axis shares one E8M0 scale byte ``s``
(value ``2**(s - 127)``; 0xFF is NaN). The scale exponent follows the spec's rule

    shared_exp = floor(log2(amax)) - emax_elem        (clamped to [-127, 127])

and the elements ``x / 2**shared_exp`` are rounded to nearest-even and *saturate* at the element
format's largest value (``amax / 2**shared_exp`` lies in ``[2**emax, 2**(emax+1))`` so the top of
a block can exceed the element maximum: E4M3 448, E2M1 6).

Element formats: MXFP8 = FP8 E4M3 (emax 8, max 448, stored as ``torch.float8_e4m3fn``);
MXFP4 = FP4 E2M1 (emax 2, values ±{0, .5, 1, 1.5, 2, 3, 4, 6}), two codes per byte with the
**first element in the low nibble**. A block holding a NaN or an infinity gets scale 0xFF.
"""
import torch

BLOCK = 32
E4M3_EMAX, E4M3_MAX = 8, 448.0
E2M1_EMAX, E2M1_MAX = 2, 6.0
SCALE_BIAS, SCALE_NAN = 127, 255
# E2M1 code (low 3 bits) -> magnitude; bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Round-to-nearest-even decision points between neighbouring E2M1 magnitudes: a value above the
# point (or equal, where the upper neighbour has the even code) moves up one code.
E2M1_UP = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def _check_k(x: torch.Tensor, name: str = "x", per_byte: int = 1) -> None:
    k = x.shape[-1] * per_byte
    if k % BLOCK:
        raise ValueError(f"{name}: last dimension {k} must be a multiple of the MX block size {BLOCK}")


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """x: [..., K] -> [..., K/32, 32] float32."""
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)


def shared_exponent(xb: torch.Tensor, emax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """xb: [..., nb, 32] -> (shared_exp int32 [..., nb], scale byte uint8 [..., nb])."""
    amax = xb.abs().amax(dim=-1)
    bad = ~torch.isfinite(amax)
    # frexp: amax = m * 2**e with m in [0.5, 1), so floor(log2(amax)) = e - 1 exactly (amax > 0).
    _, e = torch.frexp(torch.where(bad | (amax == 0), torch.ones_like(amax), amax))
    exp = torch.where(amax == 0, torch.full_like(e, -SCALE_BIAS), e - 1 - emax).clamp(-SCALE_BIAS, SCALE_BIAS)
    byte = torch.where(bad, torch.full_like(exp, SCALE_NAN), exp + SCALE_BIAS).to(torch.uint8)
    return exp, byte


def pow2(e: torch.Tensor) -> torch.Tensor:
    """Exact 2**e as float32 for integer e in [-127, 127], built from the bits (no exp2/ldexp rounding
    on any device; 2**-127 is the one subnormal)."""
    e = e.to(torch.int32)
    v = ((e.clamp(min=-126) + 127) << 23).view(torch.float32)
    return torch.where(e == -127, torch.full_like(v, 2.0**-127), v)


def scale_value(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes uint8 [...] -> float32 2**(s - 127) (NaN for 0xFF)."""
    v = pow2(scale.to(torch.int32).clamp(max=254) - SCALE_BIAS)
    return torch.where(scale == SCALE_NAN, torch.full_like(v, float("nan")), v)


def quantize_mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., K] float -> (q float8_e4m3fn [..., K], scale uint8 [..., K/32])."""
    _check_k(x)
    xb = _blocks(x)
    exp, byte = shared_exponent(xb, E4M3_EMAX)
    y = (xb * pow2(-exp)[..., None]).clamp(-E4M3_MAX, E4M3_MAX)  # exact scaling, then saturate
    q = y.to(torch.float8_e4m3fn).view(torch.uint8)  # round to nearest even
    # zero codes take the sign bit of the input explicitly: -tiny -> 0x80 on every device (H200, 2026-11-29:
    # 1-3 codes per million differed between the GPU reference and the Triton kernel, all near zero)
    sign = (torch.signbit(xb).to(torch.uint8) << 7)
    q = torch.where((q & 0x7F) == 0, sign, q).view(torch.float8_e4m3fn)
    return q.reshape(x.shape), byte


def dequantize_mxfp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q float8_e4m3fn [..., K], scale uint8 [..., K/32] -> [..., K] in dtype."""
    _check_k(q, "q")
    y = _blocks(q) * scale_value(scale)[..., None]
    return y.reshape(q.shape).to(dtype)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """float [...] (already scaled) -> E2M1 codes uint8 [...] (0..15), RNE, saturating at 6."""
    mag = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for point, up_on_tie in E2M1_UP:
        code += (mag >= point if up_on_tie else mag > point).to(torch.uint8)
    return code | ((v < 0).to(torch.uint8) << 3)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    """E2M1 codes uint8 [...] -> float32 [...]."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), device=code.device)
    return table[code.long() & 15]


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., K] float -> (packed uint8 [..., K/2] (element 2j low nibble, 2j+1 high), scale uint8 [..., K/32])."""
    _check_k(x)
    xb = _blocks(x)
    exp, byte = shared_exponent(xb, E2M1_EMAX)
    code = e2m1_encode(xb * pow2(-exp)[..., None]).reshape(*x.shape[:-1], -1, 2)
    return code[..., 0] | (code[..., 1] << 4), byte


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> codes uint8 [..., K] (low nibble first)."""
    return torch.stack([packed & 15, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1)


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """packed uint8 [..., K/2], scale uint8 [..., K/32] -> [..., K] in dtype."""
    _check_k(packed, "packed", per_byte=2)
    codes = unpack_e2m1(packed)
    y = _blocks(e2m1_decode(codes)) * scale_value(scale)[..., None]
    return y.reshape(codes.shape).to(dtype)


QUANTIZE = {"mxfp8": quantize_mxfp8, "mxfp4": quantize_mxfp4}
DEQUANTIZE = {"mxfp8": dequantize_mxfp8, "mxfp4": dequantize_mxfp4}
