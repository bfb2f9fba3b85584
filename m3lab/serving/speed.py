"""How long the estimates take on this machine: a benchmark to print, not a test to time.

    python -m m3lab.serving.speed [--vllm]

Runs, in one process after the imports, the fixed 8K/1K estimate at concurrency 128 of the default preset (twice:
the first call also builds the cost model's tables), the agentic estimate (MXFP4 TP4 with AITER, EAGLE3 with 3 drafts,
AgentX-like sessions at concurrency 28) and, with ``--vllm``, the 8K/1K c=128 schedule through vLLM's own
Scheduler against m3lab's generator. Each line gives wall time and this process's CPU time (what the machine's
other work does not change) with the load average at the start: on a shared machine the wall time is the CPU time
stretched by the load.
"""
from __future__ import annotations

import json
import os
import sys
import time

from m3lab.spec.serving import make_deployment

TARGETS_S = {"fixed 8K/1K c=128": 3.0, "agentic c=28": 30.0}


def _timed(label: str, fn) -> dict:
    load = os.getloadavg()[0]
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    target = next((t for k, t in TARGETS_S.items() if label.startswith(k)), None)
    row = {"what": label, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_1min": round(load, 2),
           "cpus": os.cpu_count(), "target_s": target}
    verdict = "" if target is None else f" (target < {target:g} s: wall {'met' if wall < target else 'missed'}, " \
                                        f"CPU {'met' if cpu < target else 'missed'})"
    print(f"{label}: {wall:.2f} s wall, {cpu:.2f} s CPU at load {load:.2f} on {os.cpu_count()} cores{verdict}",
          flush=True)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the benchmarks and print one line each, then the rows as JSON."""
    argv = sys.argv[1:] if argv is None else argv
    from m3lab.serving.cached import estimate_workload  # local: pulls in pandas
    from m3lab.serving.estimate import estimate  # local: pulls in pandas

    fixed = make_deployment(concurrency=128)
    # vLLM serves MXFP4 experts on MI355X only through AITER (its other backends refuse the device or need amd-quark)
    agentic = make_deployment(model="minimax-m3", hardware="mi355x", tp=4, quant="mxfp4", spec_method="eagle3",
                              spec_tokens=3, workload="agentx", concurrency=28).with_settings({"aiter": "1"})
    rows = [_timed("fixed 8K/1K c=128, first call", lambda: estimate(fixed, progress=True)),
            _timed("fixed 8K/1K c=128, again", lambda: estimate(fixed, progress=True)),
            _timed("agentic c=28 (MXFP4 TP4, EAGLE3 k=3)", lambda: estimate_workload(agentic, progress=True))]
    if "--vllm" in argv:
        est = {}
        rows.append(_timed("vLLM's own Scheduler on the 8K/1K c=128 estimate",
                           lambda: est.setdefault("e", estimate(fixed, engine="vllm", progress=True))))
        chk = est["e"].engine_check
        print(f"  vLLM's Scheduler {chk['vllm_s']:.1f} s vs m3lab's generator {chk['m3lab_s']:.2f} s: "
              f"{chk['vllm_over_m3lab']:.0f}x slower (plus {chk['vllm_import_s']:.1f} s to import and build vLLM); "
              f"same schedule: {chk['same_schedule']}")
        rows[-1]["engine_check"] = {k: v for k, v in chk.items() if k != "first_divergence"}
    print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
