"""The engine-step scheduler over a trace with a prefix cache: sessions, think times, queues, preemption.

:class:`CachedScheduler` is :class:`m3lab.workload.scheduler.Scheduler` (vLLM's scheduling rules, proven equal
to vLLM's own ``Scheduler`` in ``tests/test_scheduler_differential.py``) with prefix caching on a given cache,
through its hooks:

- ``contents`` — the trace's block keys (:class:`~m3lab.workload.requests.KeyContents`): a request's prompt
  hits the blocks earlier requests (or its own preempted run) left cached;
- ``make_pool`` — the given :class:`~m3lab.cache.replay.M3LabKVCache` (vLLM's semantics, any eviction policy);
- ``arrivals`` / ``idle`` — sessions, closed loop: at most ``concurrency`` sessions are active; a session's next
  turn arrives ``think_s`` after the request it waits on (``Trace.after``) finished; when a session ends the
  next one starts. ``open_loop=True`` uses the trace's own arrival times instead;
- ``observe`` — each step appends a row to ``timeline``: clock, running, waiting, KV usage, cached blocks,
  cumulative evictions, preemptions and prefix-cache stats; ``hit_tokens`` keeps each request's prefix hit at
  its first admission.

A step's time comes from ``step_time`` (the cost model, :mod:`m3lab.cache.serving`). With speculative decoding
given as ``spec_tokens`` and ``output_steps`` (decode steps per request), a request emits one token per step
for ``output_steps`` steps and reserves ``spec_tokens`` lookahead KV slots (vLLM's ``num_lookahead_tokens``);
exact draft verification is :class:`~m3lab.workload.scheduler.SchedulerConfig`'s ``spec_method``.
"""
from __future__ import annotations

import heapq

import numpy as np

from m3lab.cache.trace import Trace
from m3lab.errors import M3LabError
from m3lab.workload.requests import KeyContents
from m3lab.workload.scheduler import Scheduler, SchedulerConfig, Workload


class CachedScheduler(Scheduler):
    """:class:`Scheduler` over a :class:`Trace` with a prefix cache (see module docstring)."""

    def __init__(self, trace: Trace, cache, config: SchedulerConfig | None = None, step_time=None, *,
                 concurrency: int = 1, output_steps: np.ndarray | None = None, spec_tokens: int = 0,
                 open_loop: bool = False):
        super().__init__((config or SchedulerConfig()).replace(prefix_caching=True), step_time)
        if cache.block_size != trace.block_size:
            raise M3LabError(f"cache block size {cache.block_size} != trace block size {trace.block_size}",
                             field="block_size")
        if not isinstance(concurrency, int) or concurrency < 1:
            raise M3LabError(f"concurrency={concurrency!r} must be a positive integer", field="concurrency")
        self.trace, self.cache, self.concurrency = trace, cache, concurrency
        self.spec_tokens, self.open_loop = spec_tokens, open_loop
        self.output_steps = np.asarray(trace.output if output_steps is None else output_steps, np.int64)
        n = len(trace)
        self.arrived = np.full(n, np.nan)        # when each request joined the waiting queue (s)
        self.hit_tokens = np.zeros(n, np.int64)  # prefix hit at its first admission
        self.timeline: list[dict] = []
        self._pending: list = []                 # heap of (arrival time, request)
        self._children: dict = {}
        for i in np.flatnonzero(trace.after >= 0):
            self._children.setdefault(int(trace.after[i]), []).append(int(i))
        sessions = trace.session
        self._left = np.bincount(sessions) if n else np.zeros(0, np.int64)   # unfinished requests per session
        firsts = {}
        for i in range(n):
            firsts.setdefault(int(sessions[i]), i)
        self._session_order = sorted(firsts, key=lambda s: (trace.arrival_s[firsts[s]], firsts[s]))
        self._next_session = 0
        self._active = 0
        self._started = False

    def workload(self) -> Workload:
        """The :class:`Workload` the base loop walks: the trace's prompts and output steps."""
        return Workload(isl=1, osl=1, concurrency=self.concurrency, prompt_lens=tuple(self.trace.prompt.tolist()),
                        output_lens=tuple(self.output_steps.tolist()))

    # ---- what is cached, and where ----------------------------------------------------------------------
    def contents(self, workload: Workload) -> KeyContents:
        tr = self.trace
        return KeyContents(tr.keys, tr.prompt, self.output_steps, tr.block_size)

    def make_pool(self):
        return self.cache

    def lookahead_tokens(self) -> int:
        return self.spec_tokens

    # ---- arrivals --------------------------------------------------------------------------------------
    def _start_sessions(self, clock: float) -> None:
        tr = self.trace
        while self._active < self.concurrency and self._next_session < len(self._session_order):
            s = self._session_order[self._next_session]
            self._next_session += 1
            self._active += 1
            roots = np.flatnonzero((tr.session == s) & (tr.after < 0))
            t0 = float(tr.arrival_s[roots].min())
            for i in roots.tolist():
                heapq.heappush(self._pending, (clock + float(tr.arrival_s[i]) - t0, i))

    def arrivals(self, state, workload) -> None:
        if not self._started:
            self._started = True
            if self.open_loop:
                for i in range(len(self.trace)):
                    heapq.heappush(self._pending, (float(self.trace.arrival_s[i]), i))
            else:
                self._start_sessions(state.clock)
        while self._pending and self._pending[0][0] <= state.clock:
            t, rid = heapq.heappop(self._pending)
            self.arrived[rid] = t
            state.add(rid)

    def finished(self, state, ids) -> None:
        tr = self.trace
        for rid in ids:
            for c in self._children.get(rid, ()):
                heapq.heappush(self._pending, (state.clock + float(tr.think_s[c]), c))
            s = int(tr.session[rid])
            self._left[s] -= 1
            if self._left[s] == 0 and not self.open_loop:
                self._active -= 1
        if not self.open_loop:
            self._start_sessions(state.clock)

    def idle(self, state, workload) -> bool:
        if not self._pending:
            return False
        state.clock = max(state.clock, self._pending[0][0])
        return True

    # ---- per step ----------------------------------------------------------------------------------------
    def observe(self, batch, state) -> None:
        for rid, hit, resumed in batch.record.admitted:
            if not resumed:
                self.hit_tokens[rid] = hit
        kv = self.cache
        self.timeline.append({"step": state.step_index, "time_s": state.clock, "running": batch.record.running,
                              "waiting": batch.record.waiting, "kv_usage": kv.usage, "cached_blocks": kv.num_cached,
                              "evicted_blocks": kv.evicted_blocks, "preemptions": state.preemptions,
                              "hit_tokens": kv.stats.hits, "query_tokens": kv.stats.queries})
