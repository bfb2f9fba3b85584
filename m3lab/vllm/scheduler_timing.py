"""How long vLLM 0.33.0's own scheduler takes per engine step on this CPU (``python -m m3lab.vllm.scheduler_timing``).

:func:`measure` builds vLLM's ``AsyncScheduler`` (:mod:`m3lab.vllm.scheduler_judge`), drives it with fake outputs
and times, per step, ``schedule()`` and ``update_from_output()`` in steady decode at several running counts, and
per request ``add_request`` (the request object and its prompt's block hashes; EngineCore's input thread) and the
extra ``schedule()`` time of a step that admits one more request. :func:`m3lab.cost.host_time.fit` turns the
rows into host-time constants (µs per step + µs per running request). Medians of repeated steps; the machine
and date go into the written CSV (``m3lab/cost/data/host_time_vllm_scheduler.csv``).
"""
from __future__ import annotations

import os
import platform
import time

import numpy as np
import pandas as pd

from m3lab.cost.host_time import fit
from m3lab.vllm.scheduler_judge import Judge, _Vllm
from m3lab.workload.requests import AtCalls, FakeOutputs, UniqueContents
from m3lab.workload.scheduler import SchedulerConfig

RUNNING = (1, 8, 32, 128, 256)
CFG = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192, block_size=128, num_kv_blocks=20_000,
                      prefix_caching=True)


def _timed_judge(cfg: SchedulerConfig, contents, arrivals):
    """A :class:`Judge` whose scheduler's ``schedule`` / ``update_from_output`` record their wall time (µs)."""
    judge = Judge(cfg, contents, FakeOutputs(), arrivals=arrivals)
    times: dict = {"schedule": [], "update": [], "tokens": [], "running": []}
    sched = judge.sched
    schedule, update = sched.schedule, sched.update_from_output

    def timed_schedule(*args, **kwargs):
        t = time.perf_counter()
        out = schedule(*args, **kwargs)
        times["schedule"].append((time.perf_counter() - t) * 1e6)
        times["tokens"].append(out.total_num_scheduled_tokens)
        times["running"].append(len(out.num_scheduled_tokens))
        return out

    def timed_update(*args, **kwargs):
        t = time.perf_counter()
        out = update(*args, **kwargs)
        times["update"].append((time.perf_counter() - t) * 1e6)
        return out

    sched.schedule, sched.update_from_output = timed_schedule, timed_update
    return judge, times


def _decode_rows(running: int, steps: int) -> list[dict]:
    prompt = 256
    contents = UniqueContents(np.full(running, prompt), np.full(running, steps + 8))
    judge, t = _timed_judge(CFG, contents, AtCalls(np.zeros(running, np.int64)))
    judge.run()
    s, u, n = (np.asarray(t[k], float) for k in ("schedule", "update", "running"))
    k = min(len(s), len(u))
    decode = (n[:k] == running) & (np.asarray(t["tokens"][:k]) == running)
    return [{"what": "decode_step", "running": running, "new": 0, "schedule_us": float(np.median(s[:k][decode])),
             "update_us": float(np.median(u[:k][decode])), "samples": int(decode.sum())}]


def _admission_rows(prompt: int = 2048, running: int = 32, n_new: int = 64) -> list[dict]:
    """add_request per request (hashing a ``prompt``-token prompt) and the schedule() time a one-request
    admission adds to a step of ``running`` decodes (``n_new`` admissions, 4 calls apart)."""
    contents = UniqueContents(np.r_[np.full(running, 256), np.full(n_new, prompt)],
                              np.r_[np.full(running, 400), np.full(n_new, 2)])
    calls = np.r_[np.zeros(running, np.int64), 20 + 4 * np.arange(n_new)]
    judge, t = _timed_judge(CFG, contents, AtCalls(calls))
    add = judge._add
    add_us: list[float] = []

    def timed_add(rid):
        t0 = time.perf_counter()
        add(rid)
        if rid >= running:
            add_us.append((time.perf_counter() - t0) * 1e6)
    judge._add = timed_add
    judge.run()
    s, n = np.asarray(t["schedule"], float), np.asarray(t["tokens"])
    admit = n >= prompt                 # the steps that scheduled a new prompt
    plain = (n > 0) & (n < prompt) & (np.asarray(t["running"]) <= running + 1)
    return [{"what": "add_request", "running": 0, "new": 1, "schedule_us": float(np.median(add_us)),
             "update_us": 0.0, "samples": len(add_us), "prompt_tokens": prompt},
            {"what": "admission_step", "running": running, "new": 1,
             "schedule_us": float(np.median(s[admit]) - np.median(s[plain])), "update_us": 0.0,
             "samples": int(admit.sum()), "prompt_tokens": prompt}]


def measure(running=RUNNING, steps: int = 300, admissions: int = 64) -> pd.DataFrame:
    """The rows of the shipped CSV (µs, medians), measured now on this machine."""
    _Vllm.get()
    rows = [r for n in running for r in _decode_rows(int(n), steps)] + _admission_rows(n_new=admissions)
    out = pd.DataFrame(rows)
    out["machine"] = f"{platform.machine()} {_cpu_name()}, {os.cpu_count()} cores"
    out["load_1min"] = round(os.getloadavg()[0], 2)     # other work on the machine slows the figures
    out["date"] = time.strftime("%Y-%m-%d")
    return out


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    import sys

    table = measure()
    print(table.to_string(index=False))
    print(fit(table))                                        # the constants m3lab.cost.host_time derives
    if len(sys.argv) > 1:
        table.to_csv(sys.argv[1], index=False)
