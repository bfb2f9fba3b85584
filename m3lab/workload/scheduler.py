"""Workloads and the engine-step generator: vLLM v1 continuous batching, built to be extended.

Each step: requests that arrived join the waiting queue; running decodes are scheduled first (one token each),
then running partial prefills, then waiting requests are admitted (up to ``max_num_seqs``) while the token
budget ``max_num_batched_tokens`` lasts, their prompts chunked to fit (``chunked_prefill``). A request that
has computed all its known tokens emits one output token; after ``osl`` outputs it finishes and frees its KV.

Extension points (override in a subclass, do not copy): :meth:`Scheduler.arrivals` (queueing / open loop),
:meth:`Scheduler.can_admit` (admission), :meth:`Scheduler.can_allocate` and :meth:`Scheduler.blocks_needed`
(KV capacity), :meth:`Scheduler.pick_victim`
(preemption policy; victims restart by recomputation as in vLLM v1), :meth:`Scheduler.admit_order`, and the
``step_time`` callable (a cost model advancing the clock, for open-loop arrivals and latency estimates).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from m3lab.errors import M3LabError
from m3lab.workload.step import EngineStep


#: Requests simulated per concurrency slot when ``num_requests`` is not given (a closed loop needs several
#: waves of requests before the first burst of ``concurrency`` arrivals stops dominating the medians).
REQUESTS_PER_SLOT = 4
#: Below this many requests per slot the run never leaves its start-up burst: TTFT and throughput are wrong.
MIN_REQUESTS_PER_SLOT = 2


def default_num_requests(concurrency: int) -> int:
    """Requests simulated for a closed loop at ``concurrency`` when none is given."""
    return REQUESTS_PER_SLOT * concurrency


@dataclass(frozen=True)
class Workload:
    """Requests of fixed (or given) lengths at a concurrency. ``num_requests`` defaults to
    :func:`default_num_requests` (``REQUESTS_PER_SLOT`` x concurrency).

    ``request_rate`` (req/s, Poisson, seeded) makes arrivals open-loop; it needs a scheduler ``step_time``.
    ``prompt_lens``/``output_lens`` (per request) override ``isl``/``osl`` (e.g. from a trace).
    """

    isl: int
    osl: int
    concurrency: int
    num_requests: int | None = None
    request_rate: float | None = None
    seed: int = 0
    prompt_lens: tuple | None = None
    output_lens: tuple | None = None

    def __post_init__(self):
        for name in ("isl", "osl", "concurrency"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise M3LabError(f"{name} must be a positive integer, got {v!r}", field=name)
        if self.num_requests is not None and (not isinstance(self.num_requests, (int, np.integer))
                                              or isinstance(self.num_requests, bool) or self.num_requests < 1):
            raise M3LabError(f"num_requests must be >= 1, got {self.num_requests}", field="num_requests")
        if self.request_rate is not None and self.request_rate <= 0:
            raise M3LabError(f"request_rate must be > 0, got {self.request_rate}", field="request_rate")

    @property
    def n_requests(self) -> int:
        if self.prompt_lens is not None:
            return len(self.prompt_lens)
        return self.num_requests if self.num_requests is not None else default_num_requests(self.concurrency)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(prompt lengths, output lengths), int64 [n_requests]."""
        n = self.n_requests
        p = np.asarray(self.prompt_lens if self.prompt_lens is not None else np.full(n, self.isl), np.int64)
        o = np.asarray(self.output_lens if self.output_lens is not None else np.full(n, self.osl), np.int64)
        if p.shape != (n,) or o.shape != (n,) or (p < 1).any() or (o < 1).any():
            raise M3LabError("prompt_lens and output_lens need one positive entry per request", field="prompt_lens")
        return p, o

    def arrival_times(self) -> np.ndarray | None:
        """Seconds from start for each request (open loop), or None (closed loop)."""
        if self.request_rate is None:
            return None
        gaps = np.random.default_rng(self.seed).exponential(1.0 / self.request_rate, self.n_requests)
        return np.cumsum(gaps)


@dataclass(frozen=True)
class SchedulerConfig:
    """vLLM engine limits. ``num_kv_blocks`` None = unlimited KV cache."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    block_size: int = 128
    num_kv_blocks: int | None = None

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise M3LabError(f"{name} must be a positive integer, got {v!r}", field=name)


@dataclass
class SchedulerState:
    """Mutable state: running requests as arrays (in admission order), the waiting queue, counters."""

    prompt: np.ndarray                       # [N] all requests' prompt lengths
    output: np.ndarray                       # [N] output lengths
    arrival: np.ndarray | None               # [N] arrival times (open loop) or None
    running: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # request ids
    computed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # tokens in KV per running
    generated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # outputs per running
    waiting: deque = field(default_factory=deque)  # (request id, computed, generated) tuples
    next_request: int = 0
    finished: int = 0
    blocks_used: int = 0
    clock: float = 0.0
    step_index: int = 0
    preemptions: int = 0

    @property
    def in_system(self) -> int:
        return len(self.running) + len(self.waiting)


class Scheduler:
    """Generates :class:`EngineStep` s for a :class:`Workload` (see the module docstring for hooks)."""

    def __init__(self, config: SchedulerConfig | None = None, step_time: Callable[[EngineStep], float] | None = None):
        self.config = config or SchedulerConfig()
        self.step_time = step_time

    # ---- hooks -------------------------------------------------------------------------------------
    @property
    def tracks_kv(self) -> bool:
        """Whether KV blocks are accounted (override to True when a subclass limits capacity its own way)."""
        return self.config.num_kv_blocks is not None

    def arrivals(self, state: SchedulerState, workload: Workload) -> None:
        """Move arrived requests into the waiting queue (closed loop: keep ``concurrency`` in the system)."""
        n = len(state.prompt)
        if state.arrival is None:
            while state.next_request < n and state.in_system < workload.concurrency:
                state.waiting.append((state.next_request, 0, 0))
                state.next_request += 1
        else:
            while state.next_request < n and state.arrival[state.next_request] <= state.clock:
                state.waiting.append((state.next_request, 0, 0))
                state.next_request += 1

    def blocks_needed(self, context_after: np.ndarray, context_before: np.ndarray) -> int:
        """KV blocks newly allocated when requests grow from ``context_before`` to ``context_after`` tokens."""
        bs = self.config.block_size
        return int((-(-context_after // bs) - (-(-context_before // bs))).sum())

    def can_allocate(self, state: SchedulerState, blocks: int) -> bool:
        cap = self.config.num_kv_blocks
        return cap is None or state.blocks_used + blocks <= cap

    def can_admit(self, state: SchedulerState, request: int, chunk: int, admitted: int) -> bool:
        """Admission policy for waiting ``request`` with a first chunk of ``chunk`` tokens, after ``admitted``
        others this step (default: always; KV capacity is checked separately)."""
        return True

    def pick_victim(self, state: SchedulerState) -> int:
        """Index (into the running arrays) to preempt when KV runs out: the most recently admitted."""
        return len(state.running) - 1

    def admit_order(self, state: SchedulerState) -> None:
        """Reorder ``state.waiting`` before admission (default FCFS: leave as is)."""

    # ---- core --------------------------------------------------------------------------------------
    def _preempt(self, state: SchedulerState, i: int) -> None:
        rid, comp, gen = int(state.running[i]), int(state.computed[i]), int(state.generated[i])
        state.blocks_used -= -(-comp // self.config.block_size)  # only called when KV is tracked
        state.waiting.appendleft((rid, 0, gen))  # recompute prompt + generated tokens later
        keep = np.arange(len(state.running)) != i
        state.running, state.computed, state.generated = (state.running[keep], state.computed[keep],
                                                          state.generated[keep])
        state.preemptions += 1

    def _schedule(self, state: SchedulerState) -> np.ndarray:
        """Tokens per running request this step, admitting waiting ones: new [len(state.running)]."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        need = state.prompt[state.running] + state.generated - state.computed
        new = np.zeros(len(state.running), np.int64)
        dec = (need == 1) & (state.generated >= 1)
        dec_idx = np.flatnonzero(dec)[:budget]
        new[dec_idx] = 1
        budget -= len(dec_idx)
        while self.tracks_kv and not self.can_allocate(
                state, self.blocks_needed(state.computed + new, state.computed)) and len(state.running) > 1:
            victim = self.pick_victim(state)
            self._preempt(state, victim)
            new = np.delete(new, victim)
            need = np.delete(need, victim)
        for i in np.flatnonzero((need > 0) & (new == 0)):  # running partial prefills
            if budget <= 0:
                break
            chunk = min(int(need[i]), budget)
            if not cfg.chunked_prefill and chunk < need[i]:
                continue
            if self.tracks_kv and not self.can_allocate(
                    state, self.blocks_needed(state.computed[i:i + 1] + chunk, state.computed[i:i + 1])):
                break
            new[i] = chunk
            budget -= chunk
        self.admit_order(state)
        added = []
        while state.waiting and len(state.running) + len(added) < cfg.max_num_seqs and budget > 0:
            rid, comp, gen = state.waiting[0]
            remaining = int(state.prompt[rid]) + gen - comp
            chunk = min(remaining, budget)
            if not cfg.chunked_prefill and chunk < remaining:
                break
            blocks = -(-(comp + chunk) // cfg.block_size) - (-(-comp // cfg.block_size))
            if not self.can_admit(state, rid, chunk, len(added)) or (
                    self.tracks_kv and not self.can_allocate(state, blocks + sum(b for *_, b in added))):
                break
            state.waiting.popleft()
            added.append((rid, comp, gen, chunk, blocks))
            budget -= chunk
        if added:
            state.running = np.concatenate([state.running, [a[0] for a in added]]).astype(np.int64)
            state.computed = np.concatenate([state.computed, [a[1] for a in added]]).astype(np.int64)
            state.generated = np.concatenate([state.generated, [a[2] for a in added]]).astype(np.int64)
            new = np.concatenate([new, [a[3] for a in added]]).astype(np.int64)
        return new

    def _advance(self, state: SchedulerState, new: np.ndarray, repeat: int = 1) -> tuple[tuple, tuple]:
        """Apply ``repeat`` identical steps; return (finished ids, first-token ids) of the last one."""
        before = state.computed
        state.computed = state.computed + new * repeat
        if self.tracks_kv:
            state.blocks_used += self.blocks_needed(state.computed, before)
        done = state.computed == state.prompt[state.running] + state.generated + (repeat - 1) * (new > 0)
        produced = (new > 0) & done
        first = state.running[produced & (state.generated == 0)]
        state.generated = state.generated + produced * repeat
        fin = state.generated >= state.output[state.running]
        finished = state.running[fin]
        if fin.any():
            if self.tracks_kv:
                state.blocks_used -= int((-(-state.computed[fin] // self.config.block_size)).sum())
            keep = ~fin
            state.running, state.computed, state.generated = (state.running[keep], state.computed[keep],
                                                              state.generated[keep])
            state.finished += int(fin.sum())
        return tuple(finished.tolist()), tuple(first.tolist())

    def _pure_decode_run(self, state: SchedulerState, new: np.ndarray, workload: Workload) -> int:
        """How many identical pure-decode steps follow (1 if the next step could differ)."""
        if (self.step_time is not None or self.tracks_kv or not len(new)
                or (new != 1).any()):
            return 1
        can_admit = state.waiting and len(state.running) < self.config.max_num_seqs
        closed_loop_arrival = (state.arrival is None and state.next_request < len(state.prompt)
                               and state.in_system < workload.concurrency)
        if can_admit or closed_loop_arrival or len(new) > self.config.max_num_batched_tokens:
            return 1
        return max(1, int((state.output[state.running] - state.generated).min()))

    def runs(self, workload: Workload) -> Iterator[StepRun]:
        """The schedule as :class:`StepRun` s: pure-decode stretches collapse into one run each.
        The final state stays readable as ``self.last_state`` (e.g. ``preemptions``)."""
        if workload.request_rate is not None and self.step_time is None:
            raise M3LabError("an open-loop workload (request_rate) needs a step-time model", field="request_rate",
                             hint="pass Scheduler(config, step_time=callable) or drop request_rate")
        prompt, output = workload.lengths()
        state = SchedulerState(prompt=prompt, output=output, arrival=workload.arrival_times())
        n = len(prompt)
        while state.finished < n:
            self.arrivals(state, workload)
            if not len(state.running) and not state.waiting:
                if state.arrival is None or state.next_request >= n:
                    break
                state.clock = max(state.clock, float(state.arrival[state.next_request]))  # idle until next arrival
                continue
            new = self._schedule(state)
            sel = new > 0
            if not sel.any():
                raise M3LabError("the scheduler cannot make progress: a request does not fit the KV cache "
                                 "(num_kv_blocks) or the token budget", field="num_kv_blocks")
            ids, n_new, ctx = state.running[sel], new[sel], state.computed[sel] + new[sel]
            dec = (state.generated[sel] >= 1) & (state.computed[sel] + 1 == state.prompt[ids] + state.generated[sel])
            repeat = self._pure_decode_run(state, new, workload) if dec.all() else 1
            finished, first = self._advance(state, new, repeat)
            step = EngineStep(n_new, ctx, req_ids=ids, index=state.step_index, time_s=state.clock,
                              finished=finished if repeat == 1 else (), first_token=first,
                              decode_mask=dec & (n_new == 1))
            if self.step_time is not None:
                state.clock += float(self.step_time(step))
            state.step_index += repeat
            self.last_state = state
            yield StepRun(step, repeat, finished)

    def steps(self, workload: Workload) -> Iterator[EngineStep]:
        """Every engine step in order."""
        for run in self.runs(workload):
            yield from run.expand()


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
