"""Roofline bounds: FLOPs over the peak for the op's dtype, bytes over HBM bandwidth, wire bytes over the link.

A hardware profile is anything with ``name``, ``peak_flops`` (dict dtype -> FLOP/s), ``hbm_bw`` (B/s)
and ``link_bw`` (B/s one way per GPU), i.e. :class:`m3lab.spec.hardware.Hardware`.

FLOPs and bytes of GEMMs come from :mod:`m3lab.spec.gemm_cost`. The bound of one op is ``max(flops / peak, bytes / hbm_bw, comm_bytes / link_bw)``; whichever term
is largest names the op's regime ("compute", "memory" or "comm").
"""
from __future__ import annotations

import numpy as np

from m3lab.arith import finite
from m3lab.errors import M3LabError
from m3lab.spec.hardware import FP32_NOTE

# Weight dtypes that are matrix-core native only where the hardware says so (Hardware.native_mx).
MX_DTYPES = ("mxfp8", "mxfp4")
BOUNDS = ("compute", "memory", "comm")


def compute_dtype(w_dtype: str | None, act_dtype: str | None, hw) -> str:
    """The dtype whose peak bounds a matrix op: the weight's low-precision format when the hardware runs
    it natively (activations are quantised on the fly, as vLLM's a8w8/MX paths do), else bf16."""
    peaks = hw.peak_flops
    w = str(w_dtype) if w_dtype is not None and w_dtype == w_dtype else str(act_dtype or "bf16")
    if w in MX_DTYPES and not getattr(hw, "native_mx", True):
        return "bf16"
    if w == "fp32":  # the fp32 router: its own rate (Hardware.peak_flops["fp32"]), never bf16's
        return "fp32"
    if peaks.get(w):
        return w
    return "bf16"


def peak_flops(hw, dtype: str) -> float:
    """Dense peak FLOP/s of ``hw`` for ``dtype`` (bf16's when the profile lacks a low-precision format;
    fp32 must be in the profile: a missing ``peak_flops.fp32`` raises M3LabError instead of borrowing bf16's)."""
    peaks = hw.peak_flops
    if dtype == "fp32" and not peaks.get("fp32"):
        raise M3LabError(f"hardware {getattr(hw, 'name', '?')!r} has no peak_flops.fp32", field="peak_flops.fp32",
                         hint=FP32_NOTE)
    return float(peaks.get(dtype) or peaks["bf16"])


def bound_times_us(flops, mem_bytes, comm_bytes, peak: float | np.ndarray, hbm_bw: float, link_bw: float):
    """Per-term times in µs and the limiting bound: returns ``(t_compute, t_memory, t_comm, t_bound, bound)``."""
    t_c = np.asarray(flops, dtype=float) / np.asarray(peak, dtype=float) * 1e6
    t_m = np.asarray(mem_bytes, dtype=float) / hbm_bw * 1e6
    t_x = np.asarray(comm_bytes, dtype=float) / link_bw * 1e6
    stack = np.stack(np.broadcast_arrays(finite(t_c), finite(t_m), finite(t_x)))
    t_bound = stack.max(axis=0)
    bound = np.asarray(BOUNDS, dtype=object)[stack.argmax(axis=0)]
    return t_c, t_m, t_x, t_bound, bound
