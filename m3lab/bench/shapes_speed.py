"""Time the shape histograms of a long workload (8K in / 1K out at concurrency 128: ~10k steps; the command's
limit defaults to 2 s on a 2-core CPU). Imports are excluded; each repetition schedules the workload from scratch.

    m3lab bench shapes [--isl 8192 --osl 1024 --concurrency 128 --tp 4 --limit 2.0]
"""
from __future__ import annotations

import os
import time

from m3lab.analysis.shapes import shape_histograms
from m3lab.spec.serving import make_deployment


def measure(model: str = "minimax-m3", tp: int = 4, isl: int = 8192, osl: int = 1024, concurrency: int = 128,
            repeats: int = 3) -> dict:
    """Seconds to build every histogram (schedule included), per repetition."""
    dep = make_deployment(None, model=model, tp=tp, quant="bf16", isl=isl, osl=osl, concurrency=concurrency)
    times, report = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        report = shape_histograms(dep)
        times.append(time.perf_counter() - t0)
    return {"model": model, "tp": tp, "isl": isl, "osl": osl, "concurrency": concurrency,
            "steps": report.num_steps, "runs": report.meta["num_runs"], "seconds": times,
            "first_s": times[0], "median_s": sorted(times)[len(times) // 2], "cpus": os.cpu_count()}
