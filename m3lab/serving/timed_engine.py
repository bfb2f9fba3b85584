"""One vLLM engine driven on a clock: the step generator's calls at the times its host CPU makes them.

Where requests arrive at times that depend on the run itself (a P/D decode instance receiving hand-offs, agentic
sessions thinking between turns), the schedule cannot be computed first and timed after, as
:mod:`m3lab.serving.bench_load` does for vllm bench's closed loop. :class:`TimedEngine` interleaves the two:
each call of the engine (:class:`~m3lab.workload.engine_core.EngineCore`, the generator proven equal to vLLM's
scheduler) happens at the CPU time of its :class:`~m3lab.serving.timeline.Timeline`; requests whose arrival time
has passed are added before it; the step it schedules is timed at once (device µs from the cost model, host µs
from :mod:`m3lab.cost.host_time`), and outputs carry the time they reach the client. Several engines share one
clock through :func:`run_engines`, which always advances the engine whose next call is earliest, so every event
an engine could receive from another is known before its call.

A pure-decode stretch (:meth:`EngineCore.decode_stretch`) is taken in one go when no request can arrive during
it (``horizon_s``: the earliest time another engine could send one), with the same records as call by call.
"""
from __future__ import annotations

import gc
import heapq
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from m3lab.errors import M3LabError
from m3lab.serving.timeline import Timeline
from m3lab.workload.engine_core import EngineCore
from m3lab.workload.step import EngineStep

#: Steps a stretch may cover at most (longer stretches are cut: their device times are costed step by step).
MAX_STRETCH = 4096


@dataclass
class Output:
    """What one call of a :class:`TimedEngine` produced: admissions (request, step start s), streamed chunks
    (request, tokens, time s) and finished requests (request, time s)."""

    admitted: list = field(default_factory=list)
    chunks: list = field(default_factory=list)
    finished: list = field(default_factory=list)


class TimedEngine:
    """``core`` driven on a clock; ``step_us(step)`` device µs, ``host_us(step)`` (ready, issue, after) µs or None;
    ``observe(engine, record, start_s)`` after each executed step (e.g. cache statistics)."""

    def __init__(self, core: EngineCore, step_us: Callable, host_us: Callable | None = None, *, name: str = "",
                 observe: Callable | None = None, tag=None):
        self.core, self.step_us, self.host_us, self.name, self.observe = core, step_us, host_us, name, observe
        self.tag = tag                     # the caller's label (e.g. a P/D role and instance number)
        self.tl = Timeline()
        self.pending: list = []            # heap of (time s, sequence, request, external tokens)
        self._seq = 0
        self.inflight: deque = deque()     # (batch, end s, host after µs) of executed steps, oldest first
        self.blocked = False               # nothing can run until KV is released elsewhere
        self.was_blocked = False
        self.records: list = []            # StepRecords of executed steps, in call order
        self.rows: list = []               # per record: (start_s, end_s, device_us, output_s (set when applied))
        self.first_scheduled: dict = {}    # request -> start s of the first step that scheduled it

    # ---- arrivals and release ------------------------------------------------------------------------
    def push(self, t_s: float, rid: int, external: int = 0) -> None:
        """Request ``rid`` arrives at ``t_s`` (``external``: prompt tokens already loaded, P/D)."""
        heapq.heappush(self.pending, (float(t_s), self._seq, int(rid), int(external)))
        self._seq += 1

    def release(self, t_s: float, rid: int) -> None:
        """A held request's KV blocks are freed at ``t_s`` (P/D prefill: the decode side has read them)."""
        self.core.release(rid)
        if self.blocked:
            self.blocked = False
            self.tl.wait_until(t_s)

    def steps_table(self):
        """One row per executed step: ``start_s, end_s, device_us, output_s, tokens, running, waiting, kv_usage``."""
        df = pd.DataFrame(self.rows, columns=["start_s", "end_s", "device_us", "output_s"])
        df["tokens"] = [r.num_tokens for r in self.records]
        df["running"], df["waiting"] = [r.running for r in self.records], [r.waiting for r in self.records]
        df["kv_usage"] = [r.kv_usage for r in self.records]
        return df

    def _busy(self) -> bool:
        c = self.core
        return bool(c.running or c.waiting or self.inflight or c.finished_pending)

    def next_time(self) -> float | None:
        """When this engine's next call happens (None: it waits for something another engine sends)."""
        if self.blocked:
            return None
        if self._busy():
            return self.tl.cpu
        return max(self.tl.cpu, self.pending[0][0]) if self.pending else None

    # ---- one call ----------------------------------------------------------------------------------------
    def call(self, horizon_s: float = float("inf")) -> Output:
        """One engine call (or a decode stretch whose calls all start before ``horizon_s``) at :meth:`next_time`."""
        out = Output()
        if not self._busy() and self.pending:
            self.tl.wait_until(self.pending[0][0])
        while self.pending and self.pending[0][0] <= self.tl.cpu:
            _, _, rid, ext = heapq.heappop(self.pending)
            self.core.add(rid, ext)
        if self._stretch(horizon_s, out):
            return out
        res = self.core.call()
        if res is None:
            return out
        batch, _ = res
        if batch is not None and batch.executed:
            self._schedule(batch.record, out)
        elif not self.inflight and self.core.waiting and not self.core.running:
            self.blocked = self.was_blocked = True   # the queue's head needs KV only a release can free
        self._apply(self.core.calls - 1, out)
        return out

    def _times(self, step) -> tuple[float, tuple]:
        dev = float(self.step_us(step))
        return dev, (self.host_us(step) if self.host_us is not None else (0.0, 0.0, 0.0))

    def _schedule(self, rec, out: Output, times: tuple | None = None) -> None:
        """Time an executed step (``times``: its (device µs, host µs) when already known)."""
        if times is None:
            times = self._times(rec.engine_step(self.core.contents.prompt, len(self.records)))
        dev, (ready, issue, after) = times
        start, end = self.tl.step(dev, ready, issue)
        self.inflight.append((rec, end, after, len(self.records)))
        self.records.append(rec)
        self.rows.append((start, end, dev, np.nan))
        for rid in rec.scheduled:
            if rid not in self.first_scheduled:
                self.first_scheduled[rid] = start
                out.admitted.append((rid, start))
        if self.observe is not None:
            self.observe(self, rec, start)

    def _apply(self, call: int, out: Output) -> None:
        """Outputs of the steps whose updates ran in call ``call`` (``record.applied == call + 1``), in order."""
        while self.inflight and self.inflight[0][0].applied is not None and self.inflight[0][0].applied <= call + 1:
            rec, end, after, row = self.inflight.popleft()
            t = self.tl.output(end, after)
            self.rows[row] = (*self.rows[row][:3], t)
            out.chunks += [(rid, n, t) for rid, n in rec.emitted.items()]
            out.finished += [(rid, t) for rid in rec.finished]

    def _stretch(self, horizon_s: float, out: Output) -> bool:
        """A pure-decode stretch whose calls all start before the horizon and the next pending arrival; its steps
        are timed first on a copy of the clock, so it covers exactly the calls that start in time."""
        core = self.core
        limit = min(horizon_s, self.pending[0][0] if self.pending else float("inf"))
        plan = core.stretch_plan(MAX_STRETCH) if limit > self.tl.cpu else None
        if plan is None:
            return False
        R_max = plan[0]
        base = np.fromiter((r.C for r in core.running), np.int64, len(core.running))
        tl = Timeline()
        tl.cpu, tl.gpu = self.tl.cpu, self.tl.gpu
        ends = [(e, a) for _, e, a, _ in self.inflight]        # async: the batch in flight before the stretch
        times, R = [], 0
        while R < R_max and tl.cpu < limit:
            n = len(base)
            step = EngineStep(np.ones(n, np.int64), base + R + 1, decode_mask=np.ones(n, bool))
            times.append(self._times(step))
            dev, (ready, issue, after) = times[-1]
            ends.append((tl.step(dev, ready, issue)[1], after))
            tl.output(*ends.pop(0))      # async: the step before; sync: this one
            R += 1
        if R < 2:
            return False
        recs: list = []
        core.decode_stretch(R, recs)
        for rec, t in zip(recs, times):
            self._schedule(rec, out, t)
            self._apply(rec.call, out)
        return True


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector off inside (on again after, if it was): a run allocates millions of
    short-lived containers and keeps one record per step, so the collector's full passes over the whole heap,
    triggered by that growth, cost seconds and find no cycles (reference counting frees the rest)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def run_engines(engines: list, on_output: Callable, done: Callable[[], bool], *, progress=None) -> float:
    """Advance ``engines`` (:class:`TimedEngine`) in time order until ``done()``: each call's :class:`Output`
    goes to ``on_output(engine, output)``, which may push requests or release KV on any engine (at times no
    earlier than the call's). Returns the last call's time. Raises when every engine waits on the others."""
    with collector_paused():
        return _run(engines, on_output, done, progress)


def _run(engines: list, on_output: Callable, done: Callable[[], bool], progress) -> float:
    now = 0.0
    while not done():
        times = [(e.next_time(), i) for i, e in enumerate(engines)]
        ready = [(t, i) for t, i in times if t is not None]
        if not ready:
            raise M3LabError("the engines cannot make progress: a request does not fit an instance's KV cache, "
                             "or every instance waits for KV another holds", field="num_kv_blocks")
        now, i = min(ready)
        others = [t for t, j in ready if j != i]
        engine = engines[i]
        on_output(engine, engine.call(min(others) if others else float("inf")))
        if progress is not None:
            progress()
    return now
