"""Roofline bounds: FLOPs over the peak for the op's dtype, bytes over HBM bandwidth, wire bytes over the link.

A hardware profile is anything with ``name``, ``peak_flops`` (dict dtype -> FLOP/s), ``hbm_bw`` (B/s)
and ``link_bw`` (B/s one way per GPU), i.e. :class:`m3lab.spec.hardware.Hardware`.

The bound of one op is ``max(flops / peak, bytes / hbm_bw, comm_bytes / link_bw)``; whichever term
is largest names the op's regime ("compute", "memory" or "comm").
"""
from __future__ import annotations

import numpy as np

# Bytes per element, MX scales included (one E8M0 byte per 32 elements, OCP MX v1.0).
DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "mxfp8": 1.0 + 1 / 32,
               "mxfp4": 0.5 + 1 / 32, "int32": 4.0, "int64": 8.0}
# Weight dtypes that are matrix-core native only where the hardware says so (Hardware.native_mx).
MX_DTYPES = ("mxfp8", "mxfp4")
BOUNDS = ("compute", "memory", "comm")


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype`` (MX scales included)."""
    from m3lab.errors import M3LabError

    try:
        return DTYPE_BYTES[str(dtype)]
    except KeyError:
        raise M3LabError(f"unknown dtype {dtype!r}", field="dtype",
                         hint=f"use one of {', '.join(DTYPE_BYTES)}") from None


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
        from m3lab.errors import M3LabError
        from m3lab.spec.hardware import FP32_NOTE

        raise M3LabError(f"hardware {getattr(hw, 'name', '?')!r} has no peak_flops.fp32", field="peak_flops.fp32",
                         hint=FP32_NOTE)
    return float(peaks.get(dtype) or peaks["bf16"])


def gemm_flops_bytes(m, n, k, w_dtype: str, act_dtype: str | None = None, out_dtype: str = "bf16"):
    """FLOPs and HBM bytes of ``y[M, N] = x[M, K] @ w[N, K]^T``: weights once, activations in, output out.
    ``act_dtype`` defaults to the weight's 1-byte format for fp8 tables (a8w8) and bf16 otherwise."""
    m, n, k = (np.asarray(v, dtype=float) for v in (m, n, k))
    a = act_dtype or ("fp8" if w_dtype in ("fp8", "mxfp8") else "bf16")
    flops = 2.0 * m * n * k
    nbytes = n * k * dtype_bytes(w_dtype) + m * k * dtype_bytes(a) + m * n * dtype_bytes(out_dtype)
    return flops, nbytes


def bound_times_us(flops, mem_bytes, comm_bytes, peak: float | np.ndarray, hbm_bw: float, link_bw: float):
    """Per-term times in µs and the limiting bound: returns ``(t_compute, t_memory, t_comm, t_bound, bound)``."""
    t_c = np.asarray(flops, dtype=float) / np.asarray(peak, dtype=float) * 1e6
    t_m = np.asarray(mem_bytes, dtype=float) / hbm_bw * 1e6
    t_x = np.asarray(comm_bytes, dtype=float) / link_bw * 1e6
    stack = np.stack(np.broadcast_arrays(np.nan_to_num(t_c), np.nan_to_num(t_m), np.nan_to_num(t_x)))
    t_bound = stack.max(axis=0)
    bound = np.asarray(BOUNDS, dtype=object)[stack.argmax(axis=0)]
    return t_c, t_m, t_x, t_bound, bound
