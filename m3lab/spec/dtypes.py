"""Bytes per element of every dtype m3lab counts, and the activation dtype a GEMM consumes.

Two parts make a stored element: its payload (:func:`dtype_bytes`) and, for block-scaled formats, its
share of a scale (:func:`scale_bytes`): OCP MX v1.0 (mxfp8, mxfp4) one E8M0 byte per 32 elements along K,
NVFP4 one fp8 byte per 16. Per-tensor and per-channel fp8 scales are counted as zero (one fp32 per row
is K times smaller than the row). :func:`weight_bytes` is the whole tensor, payload and scales.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from m3lab.errors import M3LabError

# Payload bytes per element (scales excluded).
DTYPE_BYTES: Mapping[str, float] = MappingProxyType({
    "fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp8_e5m2": 1, "mxfp8": 1, "mxfp4": 0.5, "nvfp4": 0.5, "int32": 4, "int64": 8,
})
MX_BLOCK = 32      # elements per E8M0 scale byte (OCP MX)
NVFP4_BLOCK = 16   # elements per fp8 scale byte (NVFP4)
SCALE_BLOCK: Mapping[str, int] = MappingProxyType({"mxfp8": MX_BLOCK, "mxfp4": MX_BLOCK, "nvfp4": NVFP4_BLOCK})
QUANTIZED = frozenset({"fp8", "mxfp8", "mxfp4", "nvfp4"})


def dtype_bytes(dtype: str) -> float:
    """Payload bytes per element of ``dtype`` (block scales excluded: see :func:`scale_bytes`)."""
    try:
        return DTYPE_BYTES[str(dtype)]
    except KeyError:
        raise M3LabError(f"unknown dtype {dtype!r}", field="dtype",
                         hint=f"use one of {', '.join(DTYPE_BYTES)}") from None


def scale_bytes(dtype: str) -> float:
    """Block-scale bytes per element (MX: 1/32, NVFP4: 1/16, every other dtype 0)."""
    block = SCALE_BLOCK.get(str(dtype))
    return 1 / block if block else 0.0


def element_bytes(dtype: str) -> float:
    """Bytes per stored element: payload plus its share of the block scales."""
    return dtype_bytes(dtype) + scale_bytes(dtype)


def weight_bytes(elements, dtype: str):
    """Bytes of ``elements`` values stored as ``dtype``, block scales included."""
    return elements * element_bytes(dtype)


def gemm_act_dtype(w_dtype: str) -> str:
    """Activation dtype vLLM's GEMM with weights ``w_dtype`` consumes: quantised weights take a dynamically
    quantised activation of the same format, an fp32 GEMM (the router) fp32, everything else bf16."""
    return w_dtype if w_dtype in QUANTIZED else ("fp32" if w_dtype == "fp32" else "bf16")
