"""vLLM 0.33.0's V1 scheduling rules, restated on m3lab's prefix cache: the step generator's core.

Per request it keeps what vLLM's ``Request`` keeps for scheduling (``vllm/v1/request.py``): prompt and output
token counts, ``num_computed_tokens``, pending draft tokens (``spec_token_ids``), async output placeholders,
in-flight and stale tokens, status, preemption count. :meth:`EngineCore.schedule` and :meth:`EngineCore.update`
follow ``Scheduler.schedule`` / ``update_from_output`` (``vllm/v1/core/sched/scheduler.py``) and
``AsyncScheduler._update_after_schedule`` (``vllm/v1/core/sched/async_scheduler.py``) for what a plain FCFS
text-only engine does:

- running requests first, in order: ``num_tokens_with_spec + placeholders - computed`` tokens within the
  token budget (async: a request whose last token is already in flight is skipped); ``allocate_slots`` with the
  spec method's lookahead slots, preempting the last running request until it fits (the victim frees its
  blocks, restarts at 0 computed tokens and goes to the front of the waiting queue);
- then, only in a step that preempted nothing, waiting requests while ``max_num_seqs`` and the budget allow: a
  prefix-cache lookup, a 1-token admission padded to ``1 + k`` under spec decoding when no prefill runs,
  ``allocate_slots(full_sequence_must_fit=True)`` (``scheduler_reserve_full_isl``), the hit-rate record; the
  first that does not fit stops admission; a preempted request whose in-flight output has not come back waits;
- after scheduling: computed tokens advance; a request that samples gets ``1 + drafts`` placeholders and ``k``
  placeholder drafts (async);
- on output: rejected drafts roll back computed tokens (and placeholders), tokens are appended up to
  ``max_tokens`` (the request then finishes and frees its blocks), blocks of verified tokens are cached;
  output of a preempted request that was in flight is delivered but changes no counter (stale); sync: each
  request that sampled gets ``k`` drafts (``EngineCore.post_step``).

:meth:`EngineCore.call` is one call of ``EngineCore.step`` (sync) or ``step_with_batch_queue`` with a 2-deep
batch queue (async). The KV cache is m3lab's :class:`~m3lab.cache.pool.PrefixCache` (proven equal to vLLM's
``KVCacheManager`` in ``tests/test_cache_differential.py``), or none when the pool is unlimited and nothing is
cached. The whole loop is proven equal to vLLM's own scheduler in ``tests/test_scheduler_differential.py``.

Two additions for P/D instances follow vLLM's KV-connector path and are outside that proof (no connector is
driven there): a request added with ``external`` tokens is admitted with them computed (the connector loaded the
prompt's KV; vLLM's ``_update_waiting_for_remote_kv`` leaves the last prompt token to compute), and with
``hold_finished_kv`` a finished request keeps its blocks until :meth:`EngineCore.release` (the prefill side's
``delay_free_blocks``).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from m3lab.workload.engine_state import FINISHED, PREEMPTED, RUNNING, Batch, Req
from m3lab.workload.requests import FakeOutputs, RequestContents, StepRecord
from m3lab.workload.stretch import DecodeStretch

class EngineCore(DecodeStretch):
    """One engine: the scheduler state, its KV cache (``pool``, or None) and the batch queue (async).

    ``lookahead``: KV slots reserved past the scheduled tokens (vLLM's ``num_lookahead_tokens``: k for
    EAGLE/MTP, 0 for ngram); ``hash_lookahead``: tokens after a block its key covers
    (``num_hash_lookahead_tokens``); ``prefill_lookahead`` (``num_prefill_lookahead_tokens``)."""

    #: Admission reserves KV for the whole known sequence (vLLM's ``scheduler_reserve_full_isl``, default on).
    FULL_SEQUENCE_MUST_FIT = True
    #: A step that preempted admits nothing (``if not preempted_reqs`` before vLLM's waiting loop).
    ADMIT_IN_PREEMPTING_STEP = False
    batch_type = Batch                   # what a call (or a stretch's last step) schedules
    #: A finished request keeps its KV blocks until :meth:`release` (a P/D prefill instance: vLLM's KV connector
    #: frees them once the decode instance has read them, ``request_finished`` -> ``delay_free_blocks``).
    hold_finished_kv = False

    def __init__(self, cfg, contents: RequestContents, outputs: FakeOutputs | None, pool, *, lookahead: int,
                 hash_lookahead: int, prefill_lookahead: int, max_model_len: int, hooks=None):
        self.cfg, self.contents, self.outputs, self.pool = cfg, contents, outputs or FakeOutputs(), pool
        self.k = cfg.spec_tokens if cfg.spec_method else 0
        self.lookahead, self.hash_lookahead, self.prefill_lookahead = lookahead, hash_lookahead, prefill_lookahead
        self.max_model_len, self.hooks = max_model_len, hooks
        self.caching = pool is not None and cfg.prefix_caching
        self.requests: dict[int, Req] = {}
        self.running: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.finished_pending = False        # vLLM's finished_req_ids, cleared by each schedule()
        self.queue: list[Batch] = []
        self.calls = 0
        self.stuck = False
        self.steps = 0
        self.preemptions = 0

    # ---- requests --------------------------------------------------------------------------------------
    def add(self, rid: int, external: int = 0) -> None:
        """Queue request ``rid``; ``external``: prompt tokens whose KV a connector loaded from a prefill instance
        (P/D: vLLM's scheduler then computes the rest, the last prompt token, at admission)."""
        c = self.contents
        keys = c.block_keys(rid, self.cfg.block_size, self.hash_lookahead) if self.caching else []
        r = Req(rid, int(c.prompt[rid]), int(c.max_tokens[rid]), keys, min(int(external), int(c.prompt[rid]) - 1))
        self.requests[rid] = r
        self.waiting.append(r)

    def release(self, rid: int) -> None:
        """Free the KV blocks a finished request held (``hold_finished_kv``)."""
        if self.pool is not None:
            self.pool.free(rid)

    def has_requests(self) -> bool:
        return bool(self.running or self.waiting or self.finished_pending)

    def _hashed(self, r: Req) -> int:
        """Blocks of ``r`` vLLM has hashed so far (``request.block_hashes``)."""
        hashable = r.P + r.O - self.hash_lookahead
        return hashable // self.cfg.block_size if hashable > 0 else 0

    def _alloc(self, r: Req, n: int, hit=(), admit: bool = False, external: int = 0) -> bool:
        pool = self.pool
        if pool is None:
            return True
        if not hit and not admit and not external:
            return pool.allocate_running(r.rid, r.keys, r.P + r.O, r.C, n, self.lookahead, self._hashed(r))
        return pool.allocate_slots(r.rid, r.keys, r.P + r.O, r.C + external, n, hit, lookahead=self.lookahead,
                                   full_sequence_must_fit=admit, num_hashed=self._hashed(r))

    def _preempt(self, r: Req) -> None:
        if self.pool is not None:
            self.pool.free(r.rid)
        r.status, r.C, r.spec, r.ph = PREEMPTED, 0, 0, 0
        r.stale = r.inflight
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    def _victim(self, running: list) -> int:
        """Which running request to preempt (vLLM's FCFS policy: the last, ``self.running.pop()``)."""
        return self.hooks.pick_victim(running) if self.hooks else len(running) - 1

    # ---- schedule() --------------------------------------------------------------------------------------
    def _schedule_running(self, budget: int, sched: list, preempted: list) -> tuple[int, bool]:
        """The running loop; returns (budget left, whether a running prefill chunk was scheduled)."""
        asy, running, mml, pl = self.cfg.async_scheduling, self.running, self.max_model_len, self.prefill_lookahead
        pool, la, hl, bs = self.pool, self.lookahead, self.hash_lookahead, self.cfg.block_size
        prefill = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            C, PO = r.C, r.P + r.O
            if asy and r.ph > 0 and C + 2 - r.ph >= r.P + r.M:
                i += 1
                continue
            n = PO + r.spec + r.ph - C                  # min(that, budget, mml - C - 1)
            if budget < n:
                n = budget
            if mml - C - 1 < n:
                n = mml - C - 1
            rem = PO - C - n
            if 0 < rem < pl:
                n = max(n - (pl - rem), 0)
            if n == 0:
                i += 1
                continue
            if pool is not None and not pool.allocate_running(r.rid, r.keys, PO, C, n, la,       # _alloc, inline
                                                              (PO - hl) // bs if PO > hl else 0):
                i, budget, ok = self._make_room(r, n, i, budget, sched, preempted)
                if not ok:
                    break
            prefill |= r.prefill_chunk
            spec = 0
            if r.spec:
                spec = min(n + C - PO - r.ph, r.spec)
                r.spec = 0
            sched.append((r, n, spec if spec > 0 else 0))
            budget -= n
            i += 1
        return budget, prefill

    def _make_room(self, r: Req, n: int, i: int, budget: int, sched: list, preempted: list) -> tuple[int, int, bool]:
        """Preempt running requests until ``r`` (at ``running[i]``) gets ``n`` slots; returns (its new position,
        budget, whether it got them: False when ``r`` itself was preempted)."""
        running = self.running
        while True:
            victim = self._victim(running)
            v = running.pop(victim)
            if victim < i:                   # a custom victim already scheduled in this step: unschedule it
                i -= 1
                j = next(j for j, s in enumerate(sched) if s[0] is v)
                budget += sched.pop(j)[1]
            self._preempt(v)
            preempted.append(v)
            if v is r:
                return i, budget, False
            if self._alloc(r, n):
                return i, budget, True

    def _schedule_waiting(self, budget: int, sched: list, prefill: bool, admitted: list) -> None:
        cfg, pool, k, bs = self.cfg, self.pool, self.k, self.cfg.block_size
        hooks = self.hooks
        if hooks is not None:
            hooks.admit_order(self.waiting)
        skipped: list[Req] = []
        ran = bool(sched)
        while budget > 0 and self.waiting and len(self.running) < cfg.max_num_seqs:
            r = self.waiting[0]
            if r.stale:                      # its in-flight output is still to come back
                skipped.append(self.waiting.popleft())
                continue
            hit = []
            if self.caching:
                hit = pool.get_computed_blocks(r.keys, r.P + r.O, self._hashed(r))
            local = computed = len(hit) * bs
            if r.external > computed:        # loaded by a KV connector (P/D), never after a preemption
                computed = r.external
            n = r.P + r.O - computed
            pad = False
            if k and n == 1 and not prefill and (ran or computed > 0):
                if computed + 1 + k + 1 <= self.max_model_len:
                    if 1 + k > budget:
                        break
                    n, pad = 1 + k, True
            if not cfg.chunked_prefill and n > budget:
                break
            n = min(n, budget)
            rem = r.P + r.O - computed - n
            if 0 < rem < self.prefill_lookahead:
                n = max(n - (self.prefill_lookahead - rem), 0)
            if n == 0:
                skipped.append(self.waiting.popleft())
                continue
            if hooks is not None and not hooks.can_admit(r, n, len(admitted)):
                break
            if not self._alloc(r, n, hit, admit=self.FULL_SEQUENCE_MUST_FIT, external=computed - local):
                break
            if self.caching:                 # KVCacheManager.record_prefix_cache_stats
                pool.stats.record(r.P + r.O, local, r.preemptions > 0, bs)
            r.external = 0
            self.waiting.popleft()
            self.running.append(r)
            admitted.append((r.rid, computed, r.status == PREEMPTED))
            r.status, r.C = RUNNING, computed
            sched.append((r, n, k if pad else 0))
            budget -= n
        if skipped:
            self.waiting.extendleft(reversed(skipped))

    def _after_schedule(self, sched: list) -> tuple[list[int], tuple]:
        """Advance computed tokens; async placeholders; the fake model's token count per request; the step's rows
        (``StepRecord.rows``: request ids, new tokens, computed before, whether each decodes: past its prompt with
        ``1 + drafts`` tokens); the first step that samples each request."""
        asy, k, step = self.cfg.async_scheduling, self.k, self.steps
        counts, ids, new, comp, dec = [], [], [], [], []
        for r, n, spec in sched:
            c = r.C
            ids.append(r.rid)
            new.append(n)
            comp.append(c)
            dec.append(c >= r.P and n == 1 + spec)
            c = r.C = c + n
            r.inflight += n
            if c < r.P + r.O + r.ph:
                r.prefill_chunk = True
                counts.append(0)
                continue
            r.prefill_chunk = False
            if asy:
                r.ph += 1 + spec
                r.spec = k
            counts.append(1 + self._accepted(r, spec) if spec else 1)
            if r.first_step < 0:
                r.first_step = step
        return counts, (tuple(ids), tuple(new), tuple(comp), tuple(dec))   # tuples of ints: the collector skips them

    def _accepted(self, r: Req, spec: int) -> int:
        """Drafts accepted of ``spec`` in ``r``'s next verification (``FakeOutputs.accepted``, drawn ahead for
        the request's ``max_tokens`` verifications at a time)."""
        n, draws = r.verifies, r.draws
        r.verifies += 1
        if spec > self.k:
            return self.outputs.accepted(r.rid, n, spec)
        if n >= len(draws):
            draws.extend(self.outputs.accepted_run(r.rid, len(draws), r.M, self.k))
        a = draws[n]
        return a if a < spec else spec

    def schedule(self) -> Batch:
        """One ``schedule()`` call."""
        self.calls += 1
        budget = self.cfg.max_num_batched_tokens
        sched: list = []
        preempted: list[Req] = []
        admitted: list = []
        budget, prefill = self._schedule_running(budget, sched, preempted)
        if not preempted or self.ADMIT_IN_PREEMPTING_STEP:
            self._schedule_waiting(budget, sched, prefill, admitted)
        counts, rows = self._after_schedule(sched)
        self.finished_pending = False
        record = None
        if sched or preempted:
            pool = self.pool
            finite = pool is not None and pool.num_blocks is not None
            ids, new, comp, _ = rows
            record = StepRecord(call=self.calls - 1, scheduled=dict(zip(ids, new)), computed=dict(zip(ids, comp)),
                                spec={r.rid: s for r, n, s in sched if s}, admitted=tuple(sorted(admitted)),
                                preempted=tuple(sorted(v.rid for v in preempted)), running=len(self.running),
                                waiting=len(self.waiting), kv_usage=pool.usage if finite else None,
                                free_blocks=pool.num_free if finite else None, rows=rows)
        if sched:
            self.steps += 1
        return Batch(sched, counts, record)

    # ---- update_from_output() -------------------------------------------------------------------------
    def update(self, batch: Batch) -> list[int]:
        """Apply a batch's outputs; return the ids of the requests that finished (in vLLM's order)."""
        finished, emitted = [], {}
        k, mml, hl, bs = self.k, self.max_model_len, self.hash_lookahead, self.cfg.block_size
        cache = self.pool.cache_blocks if self.caching else None
        for (r, n, spec), g in zip(batch.reqs, batch.counts):
            r.inflight -= n
            stale = r.stale > 0
            if stale:
                r.stale -= n
            if not g or r.status == FINISHED:
                continue
            if spec and not stale:
                rejected = spec - (g - 1)
                if r.C > 0:
                    r.C -= rejected
                if r.ph > 0:
                    r.ph -= rejected
            had_ph = r.ph > 0
            running = r.status == RUNNING
            PO = r.P + r.O
            take = r.M - r.O                         # min(g, M - O, max(mml - P - O, 1))
            if g < take:
                take = g
            cap = mml - PO if mml - PO > 1 else 1
            if cap < take:
                take = cap
            r.O += take
            PO += take
            emitted[r.rid] = take
            stopped = r.O >= r.M or PO >= mml
            if not stale:
                if stopped:
                    r.C -= g - take
                if r.ph > 0:
                    r.ph -= g
                if cache is not None and running and (had_ph or k):
                    cache(r.rid, r.keys, r.C - r.inflight, (PO - hl) // bs if PO > hl else 0)   # _hashed(r)
            if stopped:
                self._finish(r, running, finished)
        rec = batch.record
        if rec is not None:
            rec.finished, rec.emitted, rec.applied = tuple(sorted(finished)), emitted, self.calls
        batch.done = True
        return finished

    def _finish(self, r: Req, running: bool, finished: list) -> None:
        """``r`` emitted its last token: it leaves the queues and frees its blocks (unless ``hold_finished_kv``)."""
        r.status = FINISHED
        finished.append(r.rid)
        if self.pool is not None and not self.hold_finished_kv:
            self.pool.free(r.rid)
        del self.requests[r.rid]
        self.finished_pending = True
        if running:
            self.running.remove(r)
        else:
            self.waiting.remove(r)

    def drafts(self, batch: Batch) -> None:
        """Sync scheduling, ``post_step``: every request that sampled and runs on gets ``k`` drafts."""
        if self.k:
            for (r, _, _), g in zip(batch.reqs, batch.counts):
                if g and r.status != FINISHED and not r.prefill_chunk:
                    r.spec = self.k

    # ---- one engine call ------------------------------------------------------------------------------
    def _check_stuck(self, batch: Batch) -> None:
        """An empty step with waiting requests and nothing running or in flight: no later call can differ."""
        self.stuck = (not batch.executed and bool(self.waiting) and not self.running
                      and not any(b.executed for b in self.queue))

    def call(self) -> tuple[Batch | None, list[int]] | None:
        """``EngineCore.step`` (sync) or ``step_with_batch_queue`` (async): (the batch scheduled or None, the
        requests finished), or None when the engine is idle (nothing to schedule, nothing in flight)."""
        if not self.cfg.async_scheduling:
            if not self.has_requests():
                return None
            batch = self.schedule()
            self._check_stuck(batch)
            finished = self.update(batch)
            if batch.executed:
                self.drafts(batch)
            return batch, finished
        batch = None
        if self.has_requests():
            batch = self.schedule()
            self._check_stuck(batch)
            self.queue.insert(0, batch)
            if len(self.queue) < 2 and (batch.executed or self.has_requests()):
                return batch, []
        elif not self.queue:
            return None
        return batch, self.update(self.queue.pop())
