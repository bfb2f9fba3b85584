"""The two ceilings every benchmark row is quoted against, measured on the device in the same run.

- copy bandwidth: a 256 MiB device-to-device copy, bytes read + written, graph-replayed;
- matmul peak: cuBLAS bf16 8192³.
Defaults (used when nothing was measured) are the H200 figures measured on 2026-11-29 (graph-replayed
copy, cuBLAS eager): copy 4.25 TB/s, cuBLAS bf16 8192³ 684–798 TFLOP/s.
"""
from dataclasses import dataclass

import torch

from .timing import graph_time


@dataclass(frozen=True)
class Ceilings:
    copy_tbps: float = 4.25      # H200 256 MiB d2d copy, graph-replayed (2026-11-29)
    mm_tflops: float = 760.0     # H200 cuBLAS bf16 8192^3 (684 eager one day, 769–798 another)
    source: str = "default (H200 2026-11-29)"

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
