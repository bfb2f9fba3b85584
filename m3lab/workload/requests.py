"""What a schedule is made of and recorded as, shared by m3lab's step generator and vLLM's scheduler (the judge).

- :class:`RequestContents` — the token ids of N requests (prompt, then the outputs the fake model emits), and
  the chained block keys m3lab's prefix cache looks up. Implementations: :class:`TokenContents` (explicit
  ids: shared prefixes are shared ids), :class:`UniqueContents` (lengths only, nothing shared) and
  :class:`KeyContents` (one key per block, as traces give them; every token of block i is key i).
- :class:`FakeOutputs` — the fake model: a request that samples emits ``1 + accepted`` tokens, ``accepted``
  drafts out of ``k`` by a keyed chain (each draft accepted with probability ``p`` until the first rejection),
  a pure function of (seed, request, verify index), so both schedulers draw the same acceptances in any order.
- :class:`StepRecord` — one non-empty engine step: tokens scheduled per request (prefill chunk or decode, spec
  tokens), admissions with prefix-hit tokens, preemptions, finishes, running / waiting counts, KV usage.
  :func:`first_divergence` compares two record lists step by step.
- Arrival rules, as "added before ``schedule()`` call n": :class:`ClosedLoop` (``vllm bench serve
  --max-concurrency C --request-rate inf``: C at once, each finish admits the next) and :class:`AtCalls`.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from m3lab.errors import M3LabError
from m3lab.workload.chains import ChainedKeys
from m3lab.workload.step import EngineStep

_M64 = (1 << 64) - 1
#: Output token ids start here (prompt ids of the shipped generators stay below it).
OUTPUT_TOKEN_BASE = 1 << 40


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix_array(x: np.ndarray) -> np.ndarray:
    """:func:`_mix` of each element of a uint64 array (numpy's uint64 arithmetic wraps modulo 2^64)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class RequestContents:
    """N requests: ``prompt`` [N] and ``max_tokens`` [N] (int64), token ids on demand, block keys.
    ``unique_outputs``: every block holding an output token is the request's own (no other block has its key)."""

    prompt: np.ndarray
    max_tokens: np.ndarray
    unique_outputs = False

    def __len__(self) -> int:
        return len(self.prompt)

    def tokens(self, rid: int, start: int, end: int) -> list[int]:
        """Token ids at positions ``start .. end - 1`` of request ``rid`` (prompt, then its outputs)."""
        raise NotImplementedError

    def prompt_tokens(self, rid: int) -> list[int]:
        return self.tokens(rid, 0, int(self.prompt[rid]))

    def block_keys(self, rid: int, block_size: int, lookahead: int = 0) -> list:
        """Chained keys of the full blocks of prompt + outputs: key i stands for tokens ``0 .. (i+1)B + L - 1``
        (vLLM's block hash with ``num_hash_lookahead_tokens`` L); equal keys exactly when vLLM's hashes are."""
        n = (int(self.prompt[rid]) + int(self.max_tokens[rid]) - lookahead) // block_size
        toks = self.tokens(rid, 0, n * block_size + lookahead)
        keys, parent = [], 0
        for i in range(n):
            s = i * block_size
            parent = hash((parent, tuple(toks[s:s + block_size]), tuple(toks[s + block_size:s + block_size + lookahead])))
            keys.append(parent)
        return keys

    def max_model_len(self, spec_tokens: int = 0) -> int:
        """A ``max_model_len`` no request comes near (so only ``max_tokens`` ends them and no chunk is cut by
        it, even with async placeholders and drafts in flight)."""
        return int((self.prompt + self.max_tokens).max()) + 8 * (spec_tokens + 1) + 8 if len(self) else 64


def _lengths(prompt, max_tokens) -> tuple[np.ndarray, np.ndarray]:
    p, m = np.asarray(prompt, np.int64).reshape(-1), np.asarray(max_tokens, np.int64).reshape(-1)
    if p.shape != m.shape or (p < 1).any() or (m < 1).any():
        raise M3LabError("every request needs a prompt of >= 1 token and max_tokens >= 1", field="prompt_lens")
    return p, m


class UniqueContents(RequestContents):
    """Lengths only: every request's tokens are its own (no prefix is shared between requests)."""

    unique_outputs = True

    def __init__(self, prompt, max_tokens):
        self.prompt, self.max_tokens = _lengths(prompt, max_tokens)

    def tokens(self, rid, start, end):
        return [1 + rid] * (end - start)

    def block_keys(self, rid, block_size, lookahead=0):
        n = (int(self.prompt[rid]) + int(self.max_tokens[rid]) - lookahead) // block_size
        return [(rid, i) for i in range(n)]


class TokenContents(RequestContents):
    """Explicit prompt token ids (lists or arrays); outputs are ids unique to (request, position)."""

    unique_outputs = True

    def __init__(self, prompts, max_tokens):
        self.prompts = [np.asarray(p, np.int64).tolist() for p in prompts]
        self.prompt, self.max_tokens = _lengths([len(p) for p in self.prompts], max_tokens)

    def tokens(self, rid, start, end):
        p = self.prompts[rid]
        head = p[start:min(end, len(p))]
        return head + [OUTPUT_TOKEN_BASE + (rid << 24) + j for j in range(max(start, len(p)), end)]


class KeyContents(RequestContents):
    """One key per full block (a trace's ``hash_ids`` over prompt + output; ``keys`` a list per request or a
    callable ``rid -> keys``): every token of block i is ``keys[i]``; tokens past the keyed blocks are
    ``-1 - rid`` (never shared)."""

    def __init__(self, keys, prompt, max_tokens, block_size: int):
        self._keys, self.block_size = keys, block_size
        self.prompt, self.max_tokens = _lengths(prompt, max_tokens)
        self._chains: dict = {}        # lookahead -> ChainedKeys (each shared prefix chained once)

    def keys(self, rid: int):
        return self._keys(rid) if callable(self._keys) else self._keys[rid]

    def tokens(self, rid, start, end):
        bs, k = self.block_size, self.keys(rid)
        return [int(k[p // bs]) if p // bs < len(k) else -1 - rid for p in range(start, end)]

    def block_keys(self, rid, block_size, lookahead=0):
        if block_size != self.block_size:
            raise M3LabError(f"keys are per {self.block_size}-token block, not {block_size}", field="block_size")
        n = (int(self.prompt[rid]) + int(self.max_tokens[rid]) - lookahead) // block_size
        k = list(map(int, self.keys(rid)[:n + 1]))
        chains = self._chains.get(lookahead)
        if chains is None:
            chains = self._chains[lookahead] = ChainedKeys(lookahead)
        return chains.keys(k, n, -1 - rid)


@dataclass(frozen=True)
class FakeOutputs:
    """The fake model's acceptance of ``k`` drafts: each accepted with probability ``p`` until the first rejection,
    keyed on (``seed``, request, verify index). Mean accepted = p + p^2 + ... + p^k."""

    p: float = 0.8
    seed: int = 0

    def __post_init__(self):
        if not 0.0 <= self.p <= 1.0:
            raise M3LabError(f"acceptance p={self.p!r} must lie in [0, 1]", field="p")

    def accepted(self, rid: int, n: int, k: int) -> int:
        """Drafts accepted in request ``rid``'s verify number ``n`` (0-based) of ``k`` drafts."""
        if self.p >= 1.0:
            return k
        limit = int(self.p * 2.0**53)
        base = _mix(_mix(_mix(self.seed & _M64) ^ (rid & _M64)) ^ (n & _M64))
        for j in range(k):
            if (_mix(base ^ j) >> 11) >= limit:
                return j
        return k

    def accepted_run(self, rid: int, start: int, count: int, k: int) -> list[int]:
        """:meth:`accepted` of verify numbers ``start .. start + count - 1`` of request ``rid`` (``k`` drafts each),
        drawn at once; the drafts accepted of fewer drafts ``k' < k`` are ``min(accepted, k')``."""
        if self.p >= 1.0:
            return [k] * count
        limit = np.uint64(int(self.p * 2.0**53))
        head = _mix(_mix(self.seed & _M64) ^ (rid & _M64))
        base = _mix_array(np.uint64(head) ^ np.arange(start, start + count, dtype=np.uint64))
        out = np.full(count, k, np.int64)
        for j in range(k - 1, -1, -1):          # the first rejection wins: walk the drafts from the last one
            out[(_mix_array(base ^ np.uint64(j)) >> np.uint64(11)) >= limit] = j
        return out.tolist()

    def mean_accepted(self, k: int) -> float:
        return float(sum(self.p ** j for j in range(1, k + 1)))


class StretchComputed(Mapping):
    """``StepRecord.computed`` of step j of a decode stretch, {request: computed before the step}, read from the
    stretch's shared arrays (no dict per step)."""

    __slots__ = ("ids", "c0", "pos", "j")

    def __init__(self, ids: list, c0: list, pos: dict, j: int):
        self.ids, self.c0, self.pos, self.j = ids, c0, pos, j

    def __getitem__(self, rid):
        return self.c0[self.pos[rid]] + self.j

    def __iter__(self):
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def items(self):
        j = self.j
        return [(r, c + j) for r, c in zip(self.ids, self.c0)]


@dataclass
class StepRecord:
    """One non-empty engine step (``schedule()`` call number ``call``), as both schedulers record it.

    ``scheduled`` {request: tokens}, ``computed`` {request: tokens computed before the step}, ``spec`` {request:
    draft tokens verified}, ``admitted`` ((request, prefix-hit tokens, resumed after preemption), ...) sorted,
    ``preempted`` request ids (sorted), ``running`` / ``waiting`` after scheduling, ``kv_usage`` (vLLM's
    ``1 - free / (blocks - 1)``) and ``free_blocks`` after scheduling (None without a finite pool); set when the
    step's outputs are applied: ``emitted`` {request: output tokens appended (streamed to the client)},
    ``finished`` request ids (sorted) and ``applied`` (how many ``schedule()`` calls had run by then: sync
    ``call + 1``; async usually ``call + 2``)."""

    call: int
    scheduled: dict
    computed: dict
    spec: dict
    admitted: tuple = ()
    preempted: tuple = ()
    running: int = 0
    waiting: int = 0
    kv_usage: float | None = None
    free_blocks: int | None = None
    finished: tuple = field(default=())
    emitted: dict = field(default_factory=dict)
    applied: int | None = None
    #: a decode stretch's step j: (request ids [R], computed before its first step [R], j), so :meth:`arrays`
    #: need not read the dicts (not part of the record's identity)
    stretch: tuple | None = field(default=None, compare=False, repr=False)
    #: the step generator's rows: (request ids, new tokens, computed before, decode flags) tuples [R] in scheduling
    #: order, the decode flags by its requests' prompts, so :meth:`arrays` need not read the dicts (not identity)
    rows: tuple | None = field(default=None, compare=False, repr=False)

    FIELDS = ("call", "scheduled", "computed", "spec", "admitted", "preempted", "emitted", "finished", "applied",
              "running", "waiting", "free_blocks")

    def key(self) -> tuple:
        """What two equal schedules share (KV usage follows from free blocks)."""
        return tuple(sorted(self.scheduled.items())), self.call, tuple(sorted(self.computed.items())), \
            tuple(sorted(self.spec.items())), self.admitted, self.preempted, tuple(sorted(self.emitted.items())), \
            self.finished, self.applied, self.running, self.waiting, self.free_blocks

    @property
    def num_tokens(self) -> int:
        return sum(self.scheduled.values())

    def arrays(self, prompt) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(request ids, new tokens, computed before, decode flags) [R] in scheduling order. A request decodes when
        it is past its prompt and scheduled ``1 + drafts`` tokens (else a prefill chunk, or a recompute after
        preemption). ``prompt``: prompt lengths indexed by request id (the prompts the schedule was made with)."""
        if self.rows is not None:
            ids, new, comp, dec = self.rows
            return (np.array(ids, np.int64), np.array(new, np.int64), np.array(comp, np.int64),
                    np.array(dec, bool))
        if self.stretch is not None:
            ids, c0, j = self.stretch
            comp = c0 + j
            return ids, np.ones(len(ids), np.int64), comp, comp >= np.asarray(prompt)[ids]
        n = len(self.scheduled)
        ids = np.fromiter(self.scheduled, np.int64, n)
        new = np.fromiter(self.scheduled.values(), np.int64, n)
        comp = np.fromiter((self.computed[r] for r in self.scheduled), np.int64, n)
        spec = np.fromiter((self.spec.get(r, 0) for r in self.scheduled), np.int64, n) if self.spec else 0
        return ids, new, comp, (comp >= np.asarray(prompt)[ids]) & (new == 1 + spec)

    def engine_step(self, prompt, index: int = 0, time_s: float = 0.0) -> EngineStep:
        """The step as the cost model takes it (requests in scheduling order; context = computed + new)."""
        ids, new, comp, dec = self.arrays(prompt)
        make = EngineStep if self.rows is None and self.stretch is None else EngineStep.unchecked
        return make(new, comp + new, req_ids=ids, index=index, time_s=time_s, finished=self.finished,
                    decode_mask=dec)

    def row(self) -> dict:
        return {f: getattr(self, f) for f in self.FIELDS}


def first_divergence(ours: list[StepRecord], theirs: list[StepRecord], context: int = 1) -> str | None:
    """None when both lists are equal; else which step first differs, field by field, with its neighbours."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a.key() != b.key():
            diff = [f"  {f}: m3lab {getattr(a, f)!r} | vllm {getattr(b, f)!r}" for f in StepRecord.FIELDS
                    if getattr(a, f) != getattr(b, f)]
            near = [f"  step {j}: m3lab {ours[j].row()} | vllm {theirs[j].row()}"
                    for j in range(max(0, i - context), min(len(ours), len(theirs), i + context + 1)) if j != i]
            return "\n".join([f"first divergent step {i} (schedule() call {a.call} / {b.call}):", *diff,
                              "neighbours:", *near])
    if len(ours) != len(theirs):
        return f"step counts differ: m3lab {len(ours)} vs vllm {len(theirs)} (equal up to step {min(len(ours), len(theirs))})"
    return None


class ClosedLoop:
    """``--max-concurrency C --request-rate inf``: before each ``schedule()``, add requests (in id order) while
    fewer than ``concurrency`` are unfinished, ``n`` in all."""

    def __init__(self, n: int, concurrency: int):
        if not isinstance(concurrency, (int, np.integer)) or concurrency < 1:
            raise M3LabError(f"concurrency={concurrency!r} must be a positive integer", field="concurrency")
        self.n, self.concurrency, self.next = n, int(concurrency), 0

    def __call__(self, call: int, finished: int) -> list[int]:
        k = max(0, min(self.n, finished + self.concurrency) - self.next)
        out = list(range(self.next, self.next + k))
        self.next += k
        return out

    def quiet_calls(self, call: int) -> int:
        """Calls from ``call`` on that add nothing while no request finishes (right after a call of this rule:
        all of them)."""
        return 1 << 62


class AtCalls:
    """Request i is added before ``schedule()`` call ``calls[i]`` (calls non-decreasing)."""

    def __init__(self, calls):
        self.calls = np.asarray(calls, np.int64)
        if (np.diff(self.calls) < 0).any():
            raise M3LabError("arrival calls must be non-decreasing", field="arrivals")
        self.next = 0

    def __call__(self, call: int, finished: int) -> list[int]:
        start = self.next
        while self.next < len(self.calls) and self.calls[self.next] <= call:
            self.next += 1
        return list(range(start, self.next))

    def next_call(self) -> int | None:
        """The call before which the next request arrives (None when all have): an idle engine waits for it."""
        return int(self.calls[self.next]) if self.next < len(self.calls) else None

    def quiet_calls(self, call: int) -> int:
        """Calls from ``call`` on before the next arrival (right after a call of this rule)."""
        nxt = self.next_call()
        return 1 << 62 if nxt is None else max(nxt - call, 0)
