"""How long the serving estimates take on this machine: a benchmark to print, not a test to time.

    m3lab bench estimate [--only fixed,agentic] [--vllm] [--json]

Runs, in one process after the imports, the fixed 8K/1K estimate at concurrency 128 of the default preset (twice:
the first call also builds the cost model's tables), the agentic estimate (MXFP4 TP4 with vLLM's defaults, EAGLE3 with
3 drafts, AgentX-like sessions at concurrency 28) and, with ``vllm``, the 8K/1K c=128 schedule through vLLM's own
Scheduler against m3lab's generator. Each line gives wall time and this process's CPU time (what the machine's
other work does not change) with the load average at the start: on a shared machine the wall time is the CPU time
stretched by the load. A run is within its target when its CPU time is (:data:`TARGETS_S`).
"""
from __future__ import annotations

import os
import time
from typing import Callable

from m3lab.serving.cached import estimate_workload
from m3lab.serving.estimate import estimate
from m3lab.spec.serving import make_deployment

#: seconds each estimate should take on a 2-core machine (CPU time of this process)
TARGETS_S = {"fixed 8K/1K c=128": 3.0, "agentic c=28": 30.0}
CASES = ("fixed", "agentic")


def _timed(label: str, fn: Callable, echo: Callable[[str], None]) -> dict:
    load = os.getloadavg()[0]
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    target = next((t for k, t in TARGETS_S.items() if label.startswith(k)), None)
    row = {"what": label, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_1min": round(load, 2),
           "cpus": os.cpu_count(), "target_s": target, "met": None if target is None else cpu < target}
    verdict = "" if target is None else f" (target < {target:g} s: wall {'met' if wall < target else 'missed'}, " \
                                        f"CPU {'met' if cpu < target else 'missed'})"
    echo(f"{label}: {wall:.2f} s wall, {cpu:.2f} s CPU at load {load:.2f} on {os.cpu_count()} cores{verdict}")
    return row


def fixed_deployment():
    """The default preset at 8K in / 1K out, concurrency 128."""
    return make_deployment(concurrency=128)


def agentic_deployment():
    """MXFP4 TP4 on MI355X with vLLM's defaults (AITER off: vLLM emulates the MXFP4 experts), EAGLE3 with 3 drafts,
    AgentX-like sessions at concurrency 28."""
    return make_deployment(model="minimax-m3", hardware="mi355x", tp=4, quant="mxfp4", spec_method="eagle3",
                           spec_tokens=3, workload="agentx", concurrency=28)


def measure(cases=CASES, vllm: bool = False, progress: bool = True, echo: Callable[[str], None] = print) -> list[dict]:
    """Time each of ``cases`` (see :data:`CASES`), one line each through ``echo``; returns the rows."""
    rows = []
    if "fixed" in cases:
        fixed = fixed_deployment()
        rows.append(_timed("fixed 8K/1K c=128, first call", lambda: estimate(fixed, progress=progress), echo))
        rows.append(_timed("fixed 8K/1K c=128, again", lambda: estimate(fixed, progress=progress), echo))
    if "agentic" in cases:
        agentic = agentic_deployment()
        rows.append(_timed("agentic c=28 (MXFP4 TP4, EAGLE3 k=3)",
                           lambda: estimate_workload(agentic, progress=progress), echo))
    if vllm:
        rows.append(_vllm_row(progress, echo))
    return rows


def _vllm_row(progress: bool, echo: Callable[[str], None]) -> dict:
    """vLLM's own Scheduler on the 8K/1K c=128 estimate: how much slower than m3lab's generator, same schedule?"""
    est = {}
    row = _timed("vLLM's own Scheduler on the 8K/1K c=128 estimate",
                 lambda: est.setdefault("e", estimate(fixed_deployment(), engine="vllm", progress=progress)), echo)
    chk = est["e"].engine_check
    echo(f"  vLLM's Scheduler {chk['vllm_s']:.1f} s vs m3lab's generator {chk['m3lab_s']:.2f} s: "
         f"{chk['vllm_over_m3lab']:.0f}x slower (plus {chk['vllm_import_s']:.1f} s to import and build vLLM); "
         f"same schedule: {chk['same_schedule']}")
    row["engine_check"] = {k: v for k, v in chk.items() if k != "first_divergence"}
    return row
