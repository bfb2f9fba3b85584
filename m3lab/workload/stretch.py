"""Pure-decode stretches of an engine, advanced at once: :class:`DecodeStretch`, a part of
:class:`~m3lab.workload.engine_core.EngineCore`.

When every running request would get exactly one decode token per call, with nothing admitted, preempted or
finished, R calls change nothing but counters: the stretch advances them in one go and, when asked, writes the R
:class:`~m3lab.workload.requests.StepRecord` s those calls would have written (``tests/test_scheduler_differential.py``
checks both paths against each other and against vLLM's own scheduler).
"""
from __future__ import annotations

import numpy as np

from m3lab.arith import ceil_div
from m3lab.workload.requests import StepRecord, StretchComputed


class DecodeStretch:
    """The stretch methods of :class:`~m3lab.workload.engine_core.EngineCore` (they read and advance its state)."""

    def stretch_plan(self, budget_steps: int = 1 << 62) -> tuple[int, object] | None:
        """(R, the batch in flight before it under async) of the stretch :meth:`decode_stretch` would take now
        with at most ``budget_steps`` calls, or None; changes nothing."""
        cfg, running = self.cfg, self.running
        if self.k or not running or len(running) > cfg.max_num_batched_tokens:
            return None
        if self.caching and (not self.contents.unique_outputs or self.pool.policy.tracks_tree):
            return None
        if self.waiting and len(running) < cfg.max_num_seqs:
            return None
        asy = cfg.async_scheduling
        ph = 1 if asy else 0
        for r in running:
            if r.prefill_chunk or r.spec or r.ph != ph or r.C != r.P + r.O + ph - 1 or r.stale:
                return None
        prev = None
        if asy:
            if len(self.queue) != 1:
                return None
            prev = self.queue[0]
            if len(prev.reqs) != len(running) or any(a[0] is not b or a[1] != 1 for a, b in zip(prev.reqs, running)):
                return None
        R = min(min(r.M - r.O for r in running) - 1, budget_steps, self.max_model_len)
        if R < 2:
            return None
        pool = self.pool
        if pool is not None:
            bs = cfg.block_size
            need = sum(max(ceil_div(r.C + R + self.lookahead, bs) - len(pool.req_blocks.get(r.rid, ())), 0)
                       for r in running)
            if need > pool.num_free:
                return None
        return R, prev

    def decode_stretch(self, budget_steps: int = 1 << 62, records: list | None = None) -> tuple | None:
        """Advance ``R`` >= 2 calls at once when each would schedule exactly one decode token for every running
        request, in order, with nothing admitted, preempted or finished (no spec decoding; waiting empty or
        ``max_num_seqs`` reached; no prefix caching; KV for all ``R`` tokens free now, so none of the steps can
        fail an allocation); at most ``budget_steps`` calls. Returns (the last step's batch, R) (async: that batch
        is left in flight, as the exact calls would leave it), or None (nothing done) when the next call could
        differ. ``records``: append the R steps' :class:`StepRecord` s exactly as the calls would have made them
        (and complete the record of the batch in flight before them, async). With prefix caching the blocks the
        R steps fill are cached at the end, as the last step would leave them; only when no other block can carry
        their keys (``contents.unique_outputs``) and the eviction policy ignores caching order."""
        plan = self.stretch_plan(budget_steps)
        if plan is None:
            return None
        R, prev = plan
        cfg, running, pool = self.cfg, self.running, self.pool
        ph = 1 if cfg.async_scheduling else 0
        free = None
        if pool is not None:
            bs = cfg.block_size
            if records is not None and pool.num_blocks is not None:
                have = np.fromiter((len(pool.req_blocks.get(r.rid, ())) for r in running), np.int64, len(running))
                c0 = np.fromiter((r.C for r in running), np.int64, len(running))
                free = self._stretch_free(c0, have, R, pool.num_free)
            for r in running:
                pool.allocate_slots(r.rid, (), r.P + r.O, r.C, R, lookahead=self.lookahead)
                if self.caching:        # what the last step's allocate_slots (and async: update) caches
                    tokens = r.P + r.O + R - 1
                    pool.cache_blocks(r.rid, r.keys, tokens, max(0, tokens + ph - self.hash_lookahead) // bs)
        recs = self._stretch_records(R, prev, free) if records is not None else None
        for r in running:
            r.C += R
            r.O += R
        last = self.batch_type([(r, 1, 0) for r in running], [1] * len(running), None)
        last.record = recs[-1] if recs else StepRecord(call=self.calls + R - 1, scheduled={}, computed={}, spec={})
        if recs:
            records.extend(recs)
        self.calls += R
        self.steps += R
        self.finished_pending = False
        if cfg.async_scheduling:
            prev.done = True
            self.queue = [last]
        else:
            last.done = True
        return last, R

    def _stretch_free(self, c0: np.ndarray, have: np.ndarray, R: int, free: int) -> np.ndarray:
        """Free blocks after scheduling each of the R steps of a stretch: step j gives each request the blocks
        for ``computed + j + 1 + lookahead`` tokens."""
        bs = self.cfg.block_size
        j = np.arange(R)
        need = np.maximum(ceil_div(c0[None, :] + j[:, None] + 1 + self.lookahead, bs) - have[None, :], 0)
        return free - need.sum(axis=1)

    def _stretch_records(self, R: int, prev, free: np.ndarray | None) -> list[StepRecord]:
        """The R :class:`StepRecord` s of a stretch (``scheduled`` / ``emitted`` share one read-only dict of ones,
        ``computed`` reads the stretch's arrays); async: completes ``prev``'s record (applied in the stretch's
        first call)."""
        running, calls = self.running, self.calls
        ones = {r.rid: 1 for r in running}
        ids = list(ones)
        c0 = [r.C for r in running]
        pos = {rid: i for i, rid in enumerate(ids)}
        ids_a, c0_a = np.asarray(ids, np.int64), np.asarray(c0, np.int64)
        nrun, nwait = len(running), len(self.waiting)
        blocks = None if free is None else self.pool.num_blocks - 1
        asy = self.cfg.async_scheduling
        lag = 2 if asy else 1
        out = []
        for j in range(R):
            f = None if free is None else int(free[j])
            rec = StepRecord(call=calls + j, scheduled=ones, computed=StretchComputed(ids, c0, pos, j), spec={},
                             running=nrun, waiting=nwait, kv_usage=None if f is None else 1.0 - f / blocks,
                             free_blocks=f, stretch=(ids_a, c0_a, j))
            if j + lag - 1 < R:                  # applied within the stretch (async: the last stays in flight)
                rec.emitted, rec.applied = ones, calls + j + lag
            out.append(rec)
        if prev is not None and prev.record is not None:
            prev.record.finished, prev.record.emitted, prev.record.applied = (), ones, calls + 1
        return out
