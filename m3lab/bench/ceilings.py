"""The two ceilings every benchmark row is quoted against, measured on the device in the same run.

- copy bandwidth: a 256 MiB device-to-device copy, bytes read + written, graph-replayed;
- matmul peak: cuBLAS bf16 8192³.
Defaults (used when nothing was measured) are the ``measured`` ceilings of the H200 hardware profile
(m3lab/spec/profiles/h200.yaml: ``hbm_copy_bw``, ``bf16_gemm_flops``), their one owner.
"""
from dataclasses import dataclass, field

import torch

from ..spec.hardware import load_hardware
from .timing import graph_time

DEFAULT_HARDWARE = "h200"


def profile_ceiling(key: str, hardware: str = DEFAULT_HARDWARE) -> float:
    """A measured ceiling of a hardware profile in the tables' units: ``hbm_copy_bw`` in TB/s, ``bf16_gemm_flops``
    in TFLOP/s."""
    return load_hardware(hardware).measured[key] / 1e12


@dataclass(frozen=True)
class Ceilings:
    copy_tbps: float = field(default_factory=lambda: profile_ceiling("hbm_copy_bw"))        # d2d copy, TB/s
    mm_tflops: float = field(default_factory=lambda: profile_ceiling("bf16_gemm_flops"))    # cuBLAS bf16, TFLOP/s
    source: str = f"default: the {DEFAULT_HARDWARE} profile's measured ceilings"

    def limit(self, flops: float, nbytes: float) -> tuple[str, float, float]:
        """(ceiling name, its value, floor time in µs) of whichever resource bounds an op of this size:
        ``("copy_tbps", TB/s, µs)`` or ``("mm_tflops", TFLOP/s, µs)``."""
        t_bytes = nbytes / (self.copy_tbps * 1e12) * 1e6
        t_flops = flops / (self.mm_tflops * 1e12) * 1e6
        if t_bytes >= t_flops:
            return "copy_tbps", self.copy_tbps, t_bytes
        return "mm_tflops", self.mm_tflops, t_flops

    def bound(self, flops: float, nbytes: float) -> tuple[str, float]:
        """(label ``"name=value"``, floor time in µs) of :meth:`limit`, for rows that carry the label only."""
        name, value, floor_us = self.limit(flops, nbytes)
        return f"{name}={value:.3g}" if name == "copy_tbps" else f"{name}={value:.4g}", floor_us


def measure_ceilings(device: torch.device) -> Ceilings:
    """Measure both ceilings on ``device`` (takes ~1 s)."""
    n = 256 * 2**20 // 2
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t_copy = graph_time([lambda: dst.copy_(src)] * 4, rep_ms=50)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    t_mm = graph_time([lambda: a @ b] * 2, rep_ms=200)
    return Ceilings(copy_tbps=2 * src.numel() * 2 / (t_copy.us_p50 * 1e-6) / 1e12,
                    mm_tflops=2 * 8192**3 / (t_mm.us_p50 * 1e-6) / 1e12,
                    source=f"measured on {torch.cuda.get_device_name(device)}")
