"""The engine-step scheduler with a prefix cache: KV capacity, prefix hits that shorten prefills, preemption.

:class:`CachedScheduler` extends :class:`m3lab.workload.scheduler.Scheduler` (its ``runs`` loop, step
records, ``_advance`` and ``pick_victim``) through its hooks:

- ``arrivals`` — sessions, closed loop: at most ``concurrency`` sessions are active; a session's next turn
  arrives ``think_s`` after the request it waits on (``Trace.after``) finished; when a session ends the next
  one starts. ``open_loop=True`` uses the trace's own arrival times instead;
- ``_schedule`` — vLLM's order (``Scheduler.schedule``, vllm/v1/core/sched/scheduler.py:699-1050): running
  requests first, each taking its chunk and ``allocate_slots`` (with ``spec_tokens`` lookahead slots, as
  vLLM's ``num_lookahead_tokens``), preempting the most recently admitted request (``pick_victim``) until it fits; then, only in
  a step without preemptions (or one left empty by them), waiting requests in order: a prefix lookup (the hit shortens the prefill),
  ``allocate_slots(full_sequence_must_fit=True)``, and the stats record, stopping at the first that does
  not fit;
- ``_preempt`` / ``_advance`` — a preempted or finished request frees its blocks in the cache (a
  preempted one recomputes later, usually from its own cached blocks).

The KV cache is a :class:`~m3lab.cache.replay.M3LabKVCache` (vLLM's semantics, any policy). A step's
time comes from ``step_time`` (the cost model, :mod:`m3lab.cache.serving`). Each step appends a row to
``timeline``: clock, running, waiting, KV usage, cached blocks, cumulative evictions and preemptions.
With speculative decoding a request's ``output`` counts decode steps (each verifying ``1 + spec_tokens``
tokens): its KV grows one slot per step plus the lookahead slots.
"""
from __future__ import annotations

import heapq

import numpy as np

from m3lab.cache.trace import Trace
from m3lab.errors import M3LabError
from m3lab.workload.scheduler import Scheduler, SchedulerConfig, Workload


class CachedScheduler(Scheduler):
    """:class:`Scheduler` over a :class:`Trace` with a prefix cache (see module docstring)."""

    def __init__(self, trace: Trace, cache, config: SchedulerConfig | None = None, step_time=None, *,
                 concurrency: int = 1, output_steps: np.ndarray | None = None, spec_tokens: int = 0,
                 open_loop: bool = False):
        super().__init__(config, step_time)
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
        self._session_start: dict = {}
        self._preempted: set = set()
        self._finished_last: list = []
        self._started = False

    @property
    def tracks_kv(self) -> bool:
        return True

    def workload(self) -> Workload:
        """The :class:`Workload` the base loop walks: the trace's prompts and output steps."""
        return Workload(isl=1, osl=1, concurrency=self.concurrency, prompt_lens=tuple(self.trace.prompt.tolist()),
                        output_lens=tuple(self.output_steps.tolist()))

    # ---- arrivals ------------------------------------------------------------------------------------
    def _start_sessions(self, clock: float) -> None:
        tr = self.trace
        while self._active < self.concurrency and self._next_session < len(self._session_order):
            s = self._session_order[self._next_session]
            self._next_session += 1
            self._active += 1
            roots = np.flatnonzero((tr.session == s) & (tr.after < 0))
            t0 = float(tr.arrival_s[roots].min())
            self._session_start[s] = clock
            for i in roots.tolist():
                heapq.heappush(self._pending, (clock + float(tr.arrival_s[i]) - t0, i))

    def arrivals(self, state, workload) -> None:
        tr = self.trace
        if not self._started:
            self._started = True
            state.arrival = np.full(len(tr), np.inf)
            if self.open_loop:
                for i in range(len(tr)):
                    heapq.heappush(self._pending, (float(tr.arrival_s[i]), i))
            else:
                self._start_sessions(state.clock)
        for rid in self._finished_last:
            for c in self._children.get(rid, ()):
                heapq.heappush(self._pending, (state.clock + float(tr.think_s[c]), c))
            s = int(tr.session[rid])
            self._left[s] -= 1
            if self._left[s] == 0 and not self.open_loop:
                self._active -= 1
        self._finished_last = []
        if not self.open_loop:
            self._start_sessions(state.clock)
        while self._pending and self._pending[0][0] <= state.clock:
            t, rid = heapq.heappop(self._pending)
            self.arrived[rid] = t
            p = int(tr.prompt[rid])
            self.cache.add(rid, tr.keys(rid), p, p + int(self.output_steps[rid]))
            state.waiting.append((rid, 0, 0))
        if self._pending:
            t, rid = self._pending[0]
            state.arrival[rid] = t
            state.next_request = rid                # the base loop idles the clock up to this arrival
        else:
            state.next_request = len(tr)

    # ---- scheduling ----------------------------------------------------------------------------------
    def _preempt(self, state, i: int) -> None:
        rid = int(state.running[i])
        super()._preempt(state, i)
        self.cache.free(rid)
        self._preempted.add(rid)

    def _schedule(self, state) -> np.ndarray:
        cfg, kv, bs = self.config, self.cache, self.cache.block_size
        budget = cfg.max_num_batched_tokens
        new = np.zeros(len(state.running), np.int64)
        preempted = False
        i = 0
        while i < len(state.running) and budget > 0:
            rid = int(state.running[i])
            total = int(state.prompt[rid] + state.generated[i])
            need = total - int(state.computed[i])
            n = min(need, budget)
            if not cfg.chunked_prefill and n < need:
                i += 1
                continue
            ok = True
            while not kv.allocate(rid, total, int(state.computed[i]), n, [], lookahead=self.spec_tokens):
                victim = self.pick_victim(state)
                self._preempt(state, victim)
                new = np.delete(new, victim)
                preempted = True
                if victim == i:
                    ok = False
                    break
                if victim < i:
                    i -= 1
            if not ok:
                break
            new[i] = n
            budget -= n
            i += 1
        if not preempted or not new.any():        # vLLM admits nothing in a step that preempted; a step that
            self.admit_order(state)                 # ran nothing would be an empty one: admit in it at once
            added = []
            while state.waiting and len(state.running) + len(added) < cfg.max_num_seqs and budget > 0:
                rid, _, gen = state.waiting[0]
                total = int(state.prompt[rid]) + gen
                hit = kv.lookup(rid, total)
                n = min(total - len(hit) * bs, budget)
                if not cfg.chunked_prefill and n < total - len(hit) * bs:
                    break
                if not self.can_admit(state, rid, n, len(added)):
                    break
                if not kv.allocate(rid, total, 0, n, hit, full_sequence_must_fit=True, lookahead=self.spec_tokens):
                    break
                again = rid in self._preempted
                kv.record(rid, total, len(hit), again)
                if not again:
                    self.hit_tokens[rid] = len(hit) * bs
                state.waiting.popleft()
                added.append((rid, len(hit) * bs, gen, n))
                budget -= n
            if added:
                a = np.asarray(added, np.int64)
                state.running = np.concatenate([state.running, a[:, 0]])
                state.computed = np.concatenate([state.computed, a[:, 1]])
                state.generated = np.concatenate([state.generated, a[:, 2]])
                new = np.concatenate([new, a[:, 3]])
        self._record(state)
        return new

    def _advance(self, state, new: np.ndarray, repeat: int = 1):
        finished, first = super()._advance(state, new, repeat)
        for rid in finished:
            self.cache.free(rid)
            self.cache.remove(rid)
        self._finished_last = list(finished)
        return finished, first

    def _record(self, state) -> None:
        kv = self.cache
        self.timeline.append({"step": state.step_index, "time_s": state.clock, "running": len(state.running),
                              "waiting": len(state.waiting), "kv_usage": kv.usage, "cached_blocks": kv.num_cached,
                              "evicted_blocks": kv.evicted_blocks, "preemptions": state.preemptions,
                              "hit_tokens": kv.stats.hits, "query_tokens": kv.stats.queries})
