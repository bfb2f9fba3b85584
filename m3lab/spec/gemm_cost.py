"""FLOPs and HBM bytes of a GEMM or a MoE grouped GEMM, with an explicit activation dtype.

``y[m, n] = x[m, k] @ w[n, k]^T``: 2mnk FLOPs; the weights are read once (``weights_read`` copies of
them for a grouped GEMM: the experts it touches), x once in ``act_dtype`` (block scales included), y
written once in ``out_dtype``. The OpTable rows, the roofline calibration, the GEMM benchmark and the
tuner all count bytes here; they differ only in the activation dtype they pass.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from m3lab.spec.dtypes import dtype_bytes, element_bytes, weight_bytes


@dataclass(frozen=True)
class GemmCost:
    """FLOPs and bytes of one GEMM (scalars, or arrays of one shape)."""

    flops: float | np.ndarray
    bytes_act: float | np.ndarray      # x [m, k] read, scales included
    bytes_out: float | np.ndarray      # y [m, n] written
    bytes_weight: float | np.ndarray   # w [n, k] read (times the experts touched), scales included

    @property
    def bytes_compute(self):
        """Activation bytes: x read + y written (the OpTable's ``bytes_compute`` plane)."""
        return self.bytes_act + self.bytes_out

    @property
    def bytes(self):
        """Every byte the GEMM moves to or from HBM."""
        return self.bytes_weight + self.bytes_act + self.bytes_out


def gemm_cost(m, n, k, w_dtype: str, act_dtype: str, out_dtype: str = "bf16", weights_read=1.0) -> GemmCost:
    """A GEMM (``weights_read`` 1) or a grouped GEMM over ``m`` routed rows whose ``weights_read`` experts'
    weights are read: FLOPs and bytes (see the module docstring). Scalars or numpy arrays."""
    return GemmCost(flops=2.0 * m * n * k, bytes_act=m * k * element_bytes(act_dtype),
                    bytes_out=m * n * dtype_bytes(out_dtype),
                    bytes_weight=weight_bytes(n * k, w_dtype) * weights_read)


def dense_equivalent(routed, active, n, k):
    """The dense GEMM a grouped GEMM is costed as: ``m`` = mean rows per touched expert, over a square
    weight of the same bytes, ``n = k = sqrt(active × n × k)`` (one streaming problem, not many small
    launches). -> (m, side). A fused MoE (gate_up + down) is ``n = 3 × inter``, ``k = hidden``."""
    active = np.maximum(np.asarray(active, float), 1.0)
    side = np.sqrt(active * np.asarray(n, float) * np.asarray(k, float))
    return np.maximum(np.asarray(routed, float) / active, 1.0), side
