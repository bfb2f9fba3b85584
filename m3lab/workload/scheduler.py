"""Workloads and the engine-step generator: what vLLM 0.33.0's V1 scheduler schedules, step for step.

:class:`Scheduler` runs :class:`~m3lab.workload.engine_core.EngineCore` (vLLM's scheduling rules on m3lab's
prefix cache, proven equal to vLLM's own ``Scheduler`` / ``AsyncScheduler`` in
``tests/test_scheduler_differential.py``) over a workload, for the limits of a :class:`SchedulerConfig`:
``max_num_seqs``, ``max_num_batched_tokens``, block size, KV blocks, chunked prefill, prefix caching,
speculative decoding (``ngram`` / ``mtp`` with k drafts) and async scheduling (vLLM 0.33.0's default).

- :meth:`Scheduler.records` — the exact step sequence as :class:`~m3lab.workload.requests.StepRecord` s, for
  request contents and an arrival rule (default: closed loop, ``vllm bench serve --max-concurrency``);
- :meth:`Scheduler.runs` / :meth:`Scheduler.steps` — the same schedule as :class:`EngineStep` s for a
  :class:`Workload` (lengths, closed loop at its concurrency);
- :meth:`Scheduler.engine` — a fresh engine to drive call by call (on a clock: :mod:`m3lab.serving.timed_engine`).

Time is not the generator's: :mod:`m3lab.serving.bench_load` times the records of vllm bench's closed loop, and
:mod:`m3lab.serving.timed_engine` drives engines whose arrivals depend on time. Extension points (override in a
subclass, do not copy): :meth:`Scheduler.arrivals` (who joins the queue), :meth:`Scheduler.can_admit`
(admission), :meth:`Scheduler.pick_victim` (preemption; vLLM's FCFS: the last running request),
:meth:`Scheduler.admit_order`, :meth:`Scheduler.contents` / :meth:`Scheduler.make_pool` (what is cached and
where).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import numpy as np

from m3lab.cache.pool import PrefixCache
from m3lab.errors import M3LabError
from m3lab.spec.traffic import VLLM_BENCH_NUM_PROMPTS
from m3lab.workload.engine_core import EngineCore
from m3lab.workload.requests import ClosedLoop, FakeOutputs, RequestContents, StepRecord, UniqueContents
from m3lab.workload.step import EngineStep

SPEC_METHODS = ("ngram", "mtp")
STUCK = ("the scheduler cannot make progress: a request does not fit the KV cache (num_kv_blocks) or the token "
         "budget")


def _positive(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1


@dataclass(frozen=True)
class Workload:
    """Requests of fixed (or given) lengths in a closed loop at a concurrency; ``num_requests`` defaults to
    vllm bench's ``--num-prompts``. ``prompt_lens``/``output_lens`` (per request) override ``isl``/``osl``."""

    isl: int
    osl: int
    concurrency: int
    num_requests: int = VLLM_BENCH_NUM_PROMPTS
    seed: int = 0
    prompt_lens: tuple | None = None
    output_lens: tuple | None = None

    def __post_init__(self):
        for name in ("isl", "osl", "concurrency"):
            v = getattr(self, name)
            if not _positive(v):
                raise M3LabError(f"{name} must be a positive integer, got {v!r}", field=name)
        if not _positive(self.num_requests):
            raise M3LabError(f"num_requests must be >= 1, got {self.num_requests}", field="num_requests")

    @property
    def n_requests(self) -> int:
        if self.prompt_lens is not None:
            return len(self.prompt_lens)
        return self.num_requests

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(prompt lengths, output lengths), int64 [n_requests]."""
        n = self.n_requests
        p = np.asarray(self.prompt_lens if self.prompt_lens is not None else np.full(n, self.isl), np.int64)
        o = np.asarray(self.output_lens if self.output_lens is not None else np.full(n, self.osl), np.int64)
        if p.shape != (n,) or o.shape != (n,) or (p < 1).any() or (o < 1).any():
            raise M3LabError("prompt_lens and output_lens need one positive entry per request", field="prompt_lens")
        return p, o


@dataclass(frozen=True)
class SchedulerConfig:
    """vLLM engine limits (``vllm serve`` flags of the same names).

    ``num_kv_blocks``: vLLM's ``num_gpu_blocks`` (the server log's "GPU KV cache size" / block size; block 0 is
    vLLM's null block, so ``num_kv_blocks - 1`` hold KV); None = unlimited. ``spec_method`` ``ngram`` or ``mtp``
    with ``spec_tokens`` drafts; ``max_model_len`` None = long enough for every request."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    block_size: int = 128
    num_kv_blocks: int | None = None
    prefix_caching: bool = False
    spec_method: str | None = None
    spec_tokens: int = 0
    async_scheduling: bool = True
    max_model_len: int | None = None

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            v = getattr(self, name)
            if not _positive(v):
                raise M3LabError(f"{name} must be a positive integer, got {v!r}", field=name)
        if self.num_kv_blocks is not None and (not _positive(self.num_kv_blocks) or self.num_kv_blocks < 2):
            raise M3LabError(f"num_kv_blocks={self.num_kv_blocks!r} must be an integer >= 2 (block 0 is vLLM's "
                             "null block) or None", field="num_kv_blocks")
        if self.spec_method not in (None, *SPEC_METHODS):
            raise M3LabError(f"unknown spec_method {self.spec_method!r}", field="spec_method",
                             hint=f"choose one of {', '.join(SPEC_METHODS)} (or None)")
        if self.spec_method and not _positive(self.spec_tokens):
            raise M3LabError(f"spec_method {self.spec_method} needs spec_tokens >= 1", field="spec_tokens")

    def replace(self, **changes) -> SchedulerConfig:
        return replace(self, **changes)

    @property
    def lookahead_tokens(self) -> int:
        """KV slots reserved past the scheduled tokens (vLLM's ``num_lookahead_tokens``: k for MTP/EAGLE)."""
        return self.spec_tokens if self.spec_method == "mtp" else 0

    @property
    def prefill_lookahead_tokens(self) -> int:
        """vLLM's ``num_prefill_lookahead_tokens``: 1 for single-module MTP (M3), 0 for ngram."""
        return 1 if self.spec_method == "mtp" else 0

    @property
    def hash_lookahead_tokens(self) -> int:
        """Tokens after each block its prefix-cache key covers (vLLM's ``num_hash_lookahead_tokens``)."""
        return self.prefill_lookahead_tokens if self.prefix_caching else 0


class SchedulerState:
    """What the hooks see: the engine (``core``), the workload and counters."""

    def __init__(self, core: EngineCore, workload):
        self.core, self.workload = core, workload
        self.step_index = 0
        self.next_request = 0          # requests added so far (in id order)
        self.finished = 0

    @property
    def running(self) -> list[int]:
        return [r.rid for r in self.core.running]

    @property
    def waiting(self) -> list[int]:
        return [r.rid for r in self.core.waiting]

    @property
    def in_system(self) -> int:
        return self.next_request - self.finished

    @property
    def preemptions(self) -> int:
        return self.core.preemptions

    @property
    def blocks_used(self) -> int:
        """KV blocks held by live requests (0 without a pool)."""
        return self.core.pool.num_used if self.core.pool is not None else 0

    def add(self, rid: int) -> None:
        self.core.add(rid)
        self.next_request = max(self.next_request, rid + 1)


class _Hooks:
    """Bridges :class:`EngineCore`'s hook calls to the :class:`Scheduler`'s methods (with the state)."""

    def __init__(self, sched: Scheduler, state: SchedulerState):
        self.sched, self.state = sched, state

    def pick_victim(self, running) -> int:
        return self.sched.pick_victim(self.state)

    def admit_order(self, waiting) -> None:
        self.sched.admit_order(self.state)

    def can_admit(self, req, chunk: int, admitted: int) -> bool:
        return self.sched.can_admit(self.state, req.rid, chunk, admitted)


@dataclass(frozen=True)
class StepRun:
    """``repeat`` consecutive steps: ``step`` first, then the same requests each one token further along
    (only pure-decode stretches have repeat > 1). ``finished``: request ids done after the last step."""

    step: EngineStep
    repeat: int
    finished: tuple = ()

    def expand(self) -> Iterator[EngineStep]:
        if self.repeat == 1:
            yield self.step
            return
        s = self.step
        for j in range(self.repeat):
            last = j == self.repeat - 1
            yield EngineStep(s.new_tokens, s.context_lens + j, s.req_ids, s.index + j, s.time_s,
                             finished=self.finished if last else (), decode_mask=s.decode_mask)


class Scheduler:
    """vLLM's scheduler over a workload (see the module docstring for its outputs and hooks).
    ``outputs``: the fake model's draft acceptance (spec decoding); ``collapse``: :meth:`runs` advances
    pure-decode stretches in one run (exactly; False: one call at a time)."""

    def __init__(self, config: SchedulerConfig | None = None, *, outputs: FakeOutputs | None = None,
                 collapse: bool = True):
        self.config = config or SchedulerConfig()
        self.outputs = outputs or FakeOutputs()
        self.collapse = collapse

    # ---- hooks -------------------------------------------------------------------------------------
    def arrivals(self, state: SchedulerState, workload: Workload) -> None:
        """Add requests before a call (closed loop: keep ``concurrency`` unfinished)."""
        n = workload.n_requests
        while state.next_request < n and state.in_system < workload.concurrency:
            state.add(state.next_request)

    def can_admit(self, state: SchedulerState, request: int, chunk: int, admitted: int) -> bool:
        """Admission policy for waiting ``request`` with a first chunk of ``chunk`` tokens, after ``admitted``
        others this step (default: always; KV capacity is checked separately)."""
        return True

    def pick_victim(self, state: SchedulerState) -> int:
        """Index into the running list to preempt when KV runs out (vLLM's FCFS: the last)."""
        return len(state.core.running) - 1

    def admit_order(self, state: SchedulerState) -> None:
        """Reorder ``state.core.waiting`` before admission (default FCFS: leave as is)."""

    def lookahead_tokens(self) -> int:
        """KV slots reserved past the scheduled tokens (default: the spec method's, as vLLM derives it)."""
        return self.config.lookahead_tokens

    def contents(self, workload: Workload) -> RequestContents:
        """The requests' token contents (default: lengths only, nothing shared)."""
        return UniqueContents(*workload.lengths())

    def make_pool(self):
        """The KV cache: m3lab's vLLM-exact pool, or None (unlimited and nothing cached: nothing to track)."""
        cfg = self.config
        if cfg.num_kv_blocks is None and not cfg.prefix_caching:
            return None
        return PrefixCache(cfg.num_kv_blocks, cfg.block_size, max_model_len=self._max_model_len)

    # ---- core --------------------------------------------------------------------------------------
    def _core(self, contents: RequestContents) -> EngineCore:
        cfg = self.config
        self._max_model_len = cfg.max_model_len or contents.max_model_len(cfg.spec_tokens)
        return EngineCore(cfg, contents, self.outputs, self.make_pool(), lookahead=self.lookahead_tokens(),
                          hash_lookahead=cfg.hash_lookahead_tokens, prefill_lookahead=cfg.prefill_lookahead_tokens,
                          max_model_len=self._max_model_len)

    def engine(self, contents: RequestContents) -> EngineCore:
        """A fresh engine (:class:`EngineCore`) for ``contents`` with this scheduler's config, pool and outputs, to
        drive call by call (engines on a clock: :mod:`m3lab.serving.timed_engine`)."""
        return self._core(contents)

    def records(self, contents: RequestContents, arrivals=None, *, concurrency: int | None = None,
                max_calls: int = 10**8, on_finish: Callable[[int], None] | None = None) -> list[StepRecord]:
        """The exact step sequence for ``contents``; ``arrivals(call, finished) -> request ids`` added before
        ``schedule()`` call ``call`` (default :class:`~m3lab.workload.requests.ClosedLoop` at ``concurrency``).
        With ``collapse`` and an arrival rule that says how many calls stay without arrivals (``quiet_calls``),
        pure-decode stretches are advanced at once and their records written directly (the same records:
        ``tests/test_scheduler_differential.py`` compares both paths with vLLM). ``on_finish(done)``: called with
        the number of finished requests whenever some finish (progress)."""
        core = self._core(contents)
        self.core = core
        arrivals = arrivals or ClosedLoop(len(contents), concurrency or len(contents))
        quiet = getattr(arrivals, "quiet_calls", None) if self.collapse else None
        records, done, n = [], 0, len(contents)
        while done < n:
            for rid in arrivals(core.calls, done):
                core.add(rid)
            if core.calls >= max_calls:
                raise M3LabError(f"the schedule did not finish in {max_calls} calls", field="max_calls")
            if quiet is not None and core.decode_stretch(min(quiet(core.calls), max_calls - core.calls),
                                                         records) is not None:
                continue
            out = core.call()
            if out is None:
                skip = getattr(arrivals, "next_call", None)
                if skip is None or skip() is None:
                    raise M3LabError("nothing to schedule and the workload is not done", field="arrivals")
                core.calls = max(core.calls, skip())
                continue
            batch, finished = out
            if core.stuck:
                raise M3LabError(STUCK, field="num_kv_blocks")
            if batch is not None and batch.record is not None:
                records.append(batch.record)
            done += len(finished)
            if finished and on_finish is not None:
                on_finish(done)
        return records

    def _engine_step(self, batch, state: SchedulerState) -> EngineStep:
        step = batch.record.engine_step(self._prompt, state.step_index)
        first = tuple(r.rid for (r, _, _), g in zip(batch.reqs, batch.counts) if g and r.first_step == state.step_index)
        return replace(step, first_token=first) if first else step

    def runs(self, workload: Workload) -> Iterator[StepRun]:
        """The schedule as :class:`StepRun` s (each step once; ``finished`` = requests whose last token the step
        produced). The final state stays readable as ``self.last_state`` (``preemptions``)."""
        contents = self.contents(workload)
        self._prompt = contents.prompt
        core = self._core(contents)
        state = self.last_state = SchedulerState(core, workload)
        core.hooks = _Hooks(self, state)
        self.core = core
        pending: deque = deque()     # (batch, EngineStep, repeat): outputs not applied yet (async)
        n = workload.n_requests
        while state.finished < n:
            self.arrivals(state, workload)
            done = core.decode_stretch() if self.collapse else None
            if done is not None:
                last, repeat = done
                pending.append((last, self._stretch_step(last, state, repeat), repeat))
                state.step_index += repeat
            else:
                out = core.call()
                if out is None:
                    raise M3LabError("nothing to schedule and the workload is not done", field="arrivals")
                batch, finished = out
                if core.stuck:
                    raise M3LabError(STUCK, field="num_kv_blocks")
                if batch is not None and batch.executed:
                    pending.append((batch, self._engine_step(batch, state), 1))
                    state.step_index += 1
            while pending and pending[0][0].done:     # a step's outputs come back at its end
                b, step, repeat = pending.popleft()
                fin = b.record.finished
                if fin:
                    step = replace(step, finished=fin)
                    state.finished += len(fin)
                yield StepRun(step, repeat, fin)

    @staticmethod
    def _stretch_step(last, state: SchedulerState, repeat: int) -> EngineStep:
        """The first step of a pure-decode stretch of ``repeat`` steps ending with batch ``last``."""
        reqs = last.reqs
        ctx = np.fromiter((r.C for r, _, _ in reqs), np.int64, len(reqs)) - (repeat - 1)
        ids = np.fromiter((r.rid for r, _, _ in reqs), np.int64, len(reqs))
        return EngineStep(np.ones(len(reqs), np.int64), ctx, req_ids=ids, index=state.step_index,
                          decode_mask=np.ones(len(reqs), bool))

    def steps(self, workload: Workload) -> Iterator[EngineStep]:
        """Every engine step in order."""
        for run in self.runs(workload):
            yield from run.expand()
