"""When each engine step runs: the device and the host CPU of one vLLM engine, step by step.

Each executed step costs ``device_us`` of device time and three kinds of host (CPU) time, in µs:

- ``ready_us`` — ``schedule()`` and the worker's input preparation: the device cannot start the step before it;
- ``issue_us`` — launching the step's work (graph pieces, eager attention, logits): the device runs what was
  launched while the CPU launches the rest, so the step cannot end before its last launch;
- ``after_us`` — ``update_from_output()``: after the step ended, before its tokens reach the client.

:class:`Timeline` walks the engine's calls in order (``EngineCore.step`` for sync scheduling,
``EngineCore.step_with_batch_queue`` for async: vLLM 0.33.0's default): a call that schedules a step spends
``ready_us``, the device starts it when both are free, the CPU then spends ``issue_us``; a call that applies a
step's outputs waits for that step to end, then spends ``after_us``. Sync and async differ only in where the
outputs are applied (the same call in sync, the next call in async); in sync the device therefore waits for
the CPU between steps, in async the CPU prepares step n+1 while step n runs. This is the one place where host
time and its overlap with the device are modelled: :func:`step_timeline` for a finished list of step records,
:class:`Timeline` itself for engines driven on a clock (:mod:`m3lab.serving.timed_engine`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd


class Timeline:
    """The CPU and device clocks (s) of one engine; see the module docstring."""

    __slots__ = ("cpu", "gpu")

    def __init__(self, start_s: float = 0.0):
        self.cpu = self.gpu = float(start_s)

    def step(self, device_us: float, ready_us: float = 0.0, issue_us: float = 0.0) -> tuple[float, float]:
        """A call schedules a step: returns its (start, end) in s."""
        self.cpu += ready_us * 1e-6
        start = max(self.gpu, self.cpu)
        self.cpu += issue_us * 1e-6
        self.gpu = max(start + device_us * 1e-6, self.cpu)
        return start, self.gpu

    def output(self, end_s: float, after_us: float = 0.0) -> float:
        """A call applies the outputs of a step that ends at ``end_s``: returns when they reach the client."""
        self.cpu = max(self.cpu, end_s) + after_us * 1e-6
        return self.cpu

    def wait_until(self, t_s: float) -> None:
        """An idle engine: its next call happens no earlier than ``t_s``."""
        self.cpu = max(self.cpu, float(t_s))


def host_columns(host_us: np.ndarray) -> np.ndarray:
    """Host times [R, 2] (before, after) or [R, 3] (ready, issue, after) as [R, 3] (a 2-column "before" is all
    ready time: nothing of it overlaps the device)."""
    h = np.asarray(host_us, float)
    if h.ndim != 2 or h.shape[1] not in (2, 3):
        raise ValueError(f"host times must have 2 or 3 columns per step, got shape {h.shape}")
    if h.shape[1] == 2:
        h = np.column_stack([h[:, 0], np.zeros(len(h)), h[:, 1]])
    return h


def call_order(records: list) -> tuple[list[int], list[int]]:
    """The records' indices in call order, and those whose outputs were applied in (applied, call) order: what
    :func:`step_timeline` walks (computed once per schedule, kept for re-timing it)."""
    n = len(records)
    by_call = sorted(range(n), key=lambda i: records[i].call)
    applied = [i for i in range(n) if records[i].applied is not None]
    return by_call, sorted(applied, key=lambda i: (records[i].applied, records[i].call))


def step_timeline(records: list, device_us: np.ndarray, host_us: np.ndarray,
                  order: tuple[list[int], list[int]] | None = None) -> pd.DataFrame:
    """Start, end and output time (s) of each record (:class:`~m3lab.workload.requests.StepRecord`) from its
    device time [R] and host times [R, 3] (ready, issue, after) or [R, 2] (before, after) in µs; ``order``:
    :func:`call_order` of the records, when at hand.

    Outputs applied after call c (``record.applied == c + 1``) are processed before call c + 1 schedules. A step
    whose outputs were never applied (in flight when the last request finished) has ``output_s`` NaN."""
    host = host_columns(host_us)
    start, end, out = timeline_arrays(records, device_us, host, order)
    return pd.DataFrame({"call": [r.call for r in records], "start_s": start, "end_s": end, "output_s": out,
                         "device_us": np.asarray(device_us, float), "host_ready_us": host[:, 0],
                         "host_issue_us": host[:, 1], "host_after_us": host[:, 2]})


def timeline_arrays(records: list, device_us: np.ndarray, host: np.ndarray,
                    order: tuple[list[int], list[int]] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`step_timeline`'s ``start_s``, ``end_s`` and ``output_s`` [R] from host times already [R, 3]."""
    n = len(records)
    by_call, by_applied = order if order is not None else call_order(records)
    dev, (ready, issue, after) = np.asarray(device_us, float).tolist(), np.asarray(host, float).T.tolist()
    calls = [r.call for r in records]
    applied_at = [records[k].applied for k in by_applied]
    start, end, out = [0.0] * n, [0.0] * n, [np.nan] * n
    tl = Timeline()
    j, m = 0, len(by_applied)
    for i in by_call + [None]:
        c = calls[i] if i is not None else None
        while j < m and (c is None or applied_at[j] <= c):
            k = by_applied[j]
            out[k] = tl.output(end[k], after[k])
            j += 1
        if i is None:
            break
        start[i], end[i] = tl.step(dev[i], ready[i], issue[i])
    return np.array(start), np.array(end), np.array(out, float)
