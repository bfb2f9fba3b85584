"""GPU timing the way a serving step sees it: CUDA-graph replay, weights rotated past the L2.

Decode kernels last ~10–25 µs, so eager timing measures launches, and a single weight buffer
measures the L2 cache. :func:`graph_time` captures ``calls`` invocations into one CUDA graph, each
on a different copy of the operands (enough copies to exceed twice the L2), and reports quantiles
of the per-call time over many replays (``triton.testing.do_bench``, events around each replay).
"""
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

L2_BYTES_DEFAULT = 60 * 2**20   # H200: 60 MB L2; the device's own figure is used when known


@dataclass(frozen=True)
class Timing:
    """Per-call GPU time in microseconds (quantiles over replays)."""
    us_p20: float
    us_p50: float
    us_p80: float


def l2_bytes(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or L2_BYTES_DEFAULT)


def copies_needed(bytes_per_copy: int, device: torch.device, factor: float = 2.0) -> int:
    """Operand copies so that one pass over them is over ``factor`` × L2 (at least 1)."""
    return max(1, math.ceil(factor * l2_bytes(device) / max(bytes_per_copy, 1)) + 1)


def graph_time(calls: list[Callable[[], object]], rep_ms: float = 100.0, warmup_ms: float = 25.0) -> Timing:
    """Capture ``calls`` (each a closure on its own operand copy) in one graph; time replays.

    Every call is run once eagerly first (compiles, autotune, allocations), then captured.
    """
    import triton.testing

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    torch.cuda.synchronize()
    q = triton.testing.do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, quantiles=[0.2, 0.5, 0.8])
    n = len(calls)
    return Timing(*(1e3 * t / n for t in q))


def cpu_time(call: Callable[[], object], reps: int = 3) -> Timing:
    """Wall-clock quantiles for CPU runs (interpreter smoke tests; never a baseline)."""
    import time

    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        ts.append(1e6 * (time.perf_counter() - t0))
    ts.sort()
    return Timing(ts[0], ts[len(ts) // 2], ts[-1])
