"""GPU timing the way a serving step sees it: CUDA-graph replay, weights rotated past the L2.

Decode kernels last ~10–25 µs, so eager timing measures launches, and a single weight buffer
measures the L2 cache. :func:`graph_time` (the ``graph24`` harness, :data:`HARNESS`):

- one CUDA graph holds at least :data:`MIN_CALLS` calls, for every provider alike; the calls cycle
  round-robin over distinct operand copies whose bytes together exceed twice the L2
  (:func:`copies_needed`), so no call finds its weights in L2 from an earlier call;
- the graph is replayed back to back (no L2 flush, no synchronisation, nothing else in the timed region):
  events bracket batches of replays, and each batch gives one per-call sample (batch time / calls);
- quantiles (p20, p50, p80) over the batches.

A flush before each replay adds a fixed 9–13 µs per replay on the H200; spread over 3–17 calls it
inflates decode times by 10–21%. :func:`profile_check` verifies the harness: it
compares the per-call time with the kernel durations the profiler records for the same graph.
"""
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

L2_BYTES_DEFAULT = 60 * 2**20   # H200: 60 MB L2; the device's own figure is used when known
HARNESS = "graph24"             # label of this method in benchmark rows (``harness`` column)
MIN_CALLS = 24                  # calls per graph, every provider
BATCH_MS = 2.0                  # GPU time per timed batch of back-to-back replays
SELF_CHECK_US = 0.5             # profile_check: |per-call - profiled kernel time| allowed


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


def graph_calls(calls: list[Callable[[], object]], min_calls: int = MIN_CALLS) -> list[Callable[[], object]]:
    """The calls one graph holds: ``calls`` (one per operand copy) repeated round-robin to ``min_calls``."""
    return [calls[i % len(calls)] for i in range(max(min_calls, len(calls)))]


def capture(calls: list[Callable[[], object]]) -> "torch.cuda.CUDAGraph":
    """Run each distinct call once eagerly (compiles, allocations) on a side stream, then capture ``calls``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in dict.fromkeys(calls):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    torch.cuda.synchronize()
    return graph


def replay_time(graph, n_calls: int, rep_ms: float = 100.0, warmup_ms: float = 25.0) -> Timing:
    """Per-call quantiles of back-to-back replays of a captured graph of ``n_calls`` calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    once_ms = max(start.elapsed_time(end), 1e-3)
    for _ in range(max(1, int(warmup_ms / once_ms))):
        graph.replay()
    per_batch = max(1, math.ceil(BATCH_MS / once_ms))
    batches = max(5, min(1000, int(rep_ms / (per_batch * once_ms))))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(batches + 1)]
    events[0].record()
    for i in range(batches):                       # all enqueued before any wait: replays back to back
        for _ in range(per_batch):
            graph.replay()
        events[i + 1].record()
    events[-1].synchronize()
    us = sorted(1e3 * a.elapsed_time(b) / (per_batch * n_calls) for a, b in zip(events, events[1:]))
    q = lambda f: us[min(len(us) - 1, int(f * len(us)))]  # noqa: E731
    return Timing(q(0.2), q(0.5), q(0.8))


def graph_time(calls: list[Callable[[], object]], rep_ms: float = 100.0, warmup_ms: float = 25.0,
               min_calls: int = MIN_CALLS) -> Timing:
    """Per-call time of ``calls`` (each a closure on its own operand copy) in one graph of at least
    ``min_calls`` calls, replayed back to back (see the module docstring)."""
    seq = graph_calls(calls, min_calls)
    return replay_time(capture(seq), len(seq), rep_ms, warmup_ms)


def profile_check(calls: list[Callable[[], object]], rep_ms: float = 50.0, replays: int = 20,
                  min_calls: int = MIN_CALLS) -> dict:
    """The harness's self-check: its per-call time vs the profiler's kernel durations on the same graph.

    Returns ``harness_us`` (graph_time's p50), ``kernel_us`` (torch.profiler: sum of the durations of
    the kernels of ``replays`` replays, per call), ``span_us`` (first kernel start to last kernel end,
    per call: includes the gaps between kernels), ``kernels_per_call``, ``checked_against`` and ``diff_us``
    = harness − the checked figure, ``passed`` = |diff_us| <= SELF_CHECK_US. A call of one kernel is checked
    against its kernel duration; a call of several kernels (cuBLAS splits some decode GEMMs into a GEMM
    and a reduction) against its span, since the sum of its kernels leaves out the launch gaps between
    them, which the call pays in a serving step as much as here.
    """
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    seq = graph_calls(calls, min_calls)
    graph = capture(seq)
    t = replay_time(graph, len(seq), rep_ms)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    n = replays * len(seq)
    kernel_us = sum(float(e["dur"]) for e in kernels) / n if kernels else float("nan")
    span_us = ((max(float(e["ts"]) + float(e["dur"]) for e in kernels) - min(float(e["ts"]) for e in kernels)) / n
               if kernels else float("nan"))
    per_call = len(kernels) / n
    checked = "kernels" if per_call <= 1.0 else "span"
    diff = t.us_p50 - (kernel_us if checked == "kernels" else span_us)
    return {"harness_us": t.us_p50, "kernel_us": kernel_us, "span_us": span_us, "kernels_per_call": per_call,
            "checked_against": checked, "diff_us": diff, "passed": abs(diff) <= SELF_CHECK_US}


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
