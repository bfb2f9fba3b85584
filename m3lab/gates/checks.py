"""Scoring helpers: relative RMS error with per-dtype tolerances, NaN never passing, poisoning.

Tolerances (relative RMS error ‖out − ref‖ / ‖ref‖ against an fp32-accumulated reference):
fp32 1e-4 (CPU interpreter; exact up to summation order), fp16 2e-3 (output rounding ~3e-4 plus
fp16 weight rounding), bf16 1e-2 (output rounding ~2e-3; bf16 operands land at 1e-3…1e-2).
"""
import math

import torch

TOLERANCES = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1e-2}
POISON_BYTE = 0xFF      # uint8 outputs (E8M0 0xFF = NaN scale, E2M1 pair -6,-6)
POISON_FP8 = 0x7F       # float8_e4m3fn NaN


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output with a value a correct kernel never leaves behind (NaN where the dtype has one)."""
    if t.dtype == torch.float8_e4m3fn:
        t.view(torch.uint8).fill_(POISON_FP8)
    elif t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(POISON_BYTE)
    return t


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in fp64; NaN if either holds a NaN (so NaN never passes)."""
    o, r = out.double(), ref.double()
    if torch.isnan(o).any() or torch.isnan(r).any():
        return math.nan
    denom = r.norm().item()
    return (o - r).norm().item() / (denom if denom > 0 else 1.0)


def mismatch_fraction(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Fraction of elements whose bytes differ (codes must match exactly)."""
    a = out.view(torch.uint8) if out.element_size() == 1 else out
    b = ref.view(torch.uint8) if ref.element_size() == 1 else ref
    return (a != b).double().mean().item()


def passes(err: float, limit: float) -> bool:
    """err <= limit, with NaN failing."""
    return not math.isnan(err) and err <= limit
