"""Run a :class:`~m3lab.cache.trace.Trace` through a KV cache: m3lab's simulator or vLLM's own classes.

Both engines have the same request-level methods (:class:`Engine`): ``add`` a request's keys, ``lookup``
its cached prefix, ``allocate`` slots, ``record`` the lookup, ``free`` its blocks, ``remove`` it.

The replay protocol (the cache's view, no clock): requests in arrival order (a turn that waits on another
goes at that one's arrival plus its think time); at most ``concurrency`` requests hold blocks, the
oldest finishing first. A request is admitted as vLLM admits it (lookup, then ``allocate_slots`` for the
whole prompt with ``full_sequence_must_fit``, then the stats record), then decodes its output (slots up
to ``prompt + output - 1`` tokens; the blocks that fill are cached). When blocks run out the oldest
running request finishes early; a request that fits in no empty pool is counted in ``rejected``
(vLLM would never schedule it). For time, queues and preemption use :mod:`m3lab.serving.cached`.
"""
from __future__ import annotations

import math
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from m3lab.arith import ceil_div
from m3lab.cache.pool import PrefixCache
from m3lab.cache.trace import Trace
from m3lab.cache.vllm_ref import VllmKVCache
from m3lab.errors import M3LabError

ENGINES = ("m3lab", "vllm")
PROGRESS_MIN_REQUESTS = 2000       # show a progress bar from this many requests on


class M3LabKVCache(PrefixCache):
    """:class:`PrefixCache` with the request-level methods of the replay (keys kept per request)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._keys: dict = {}

    def add(self, rid, keys: list, prompt: int, total: int) -> None:
        self._keys[rid] = keys

    def lookup(self, rid, num_tokens: int) -> list[int]:
        return self.get_computed_blocks(self._keys[rid], num_tokens)

    def allocate(self, rid, num_tokens: int, num_computed: int, num_new_tokens: int, hit: list,
                 full_sequence_must_fit: bool = False, lookahead: int = 0) -> bool:
        return self.allocate_slots(rid, self._keys[rid], num_tokens, num_computed, num_new_tokens, hit,
                                   lookahead=lookahead, full_sequence_must_fit=full_sequence_must_fit)

    def record(self, rid, num_tokens: int, hit_blocks: int, preempted: bool = False) -> None:  # noqa: D102
        super().record(num_tokens, hit_blocks, preempted)

    def remove(self, rid) -> None:
        self._keys.pop(rid, None)

    def block_ids(self, rid) -> list[int]:
        return list(self.req_blocks.get(rid, ()))

    @property
    def evicted_blocks(self) -> int:
        return self.stats.evicted_blocks


Engine = M3LabKVCache   # the interface both engines implement (vLLM's: m3lab.cache.vllm_ref.VllmKVCache)


def make_engine(engine: str, num_blocks: int | None, block_size: int, policy: str = "lru", *,
                use_eagle: bool = False):
    """A fresh cache: ``m3lab`` (any policy, finite or unlimited) or ``vllm`` (LRU, finite)."""
    if engine == "m3lab":
        return M3LabKVCache(num_blocks, block_size, policy, use_eagle=use_eagle)
    if engine == "vllm":
        if policy != "lru":
            raise M3LabError(f"vLLM's classes evict in LRU order only, not {policy!r}", field="policy",
                             hint="use --engine m3lab for other policies")
        if num_blocks is None:
            raise M3LabError("vLLM's block pool needs a finite capacity", field="capacity_tokens",
                             hint="pass --capacity-tokens N (the hit rate of a very large N equals unlimited)")
        return VllmKVCache(num_blocks, block_size, use_eagle=use_eagle)
    raise M3LabError(f"unknown engine {engine!r}", field="engine", hint=f"choose one of {', '.join(ENGINES)}")


def blocks_for_tokens(capacity_tokens: float | None, block_size: int) -> int | None:
    """vLLM's ``num_gpu_blocks`` for a KV capacity in tokens (+1: the null block); None when unlimited."""
    if capacity_tokens is None or capacity_tokens == math.inf:
        return None
    if capacity_tokens < block_size:
        raise M3LabError(f"capacity of {capacity_tokens} tokens is less than one block of {block_size}",
                         field="capacity_tokens")
    return int(capacity_tokens) // block_size + 1


def replay_order(trace: Trace) -> np.ndarray:
    """Request indices by arrival; a request that waits on another arrives at that one's arrival + think."""
    t = np.asarray(trace.arrival_s, float).copy()
    after = trace.after
    for i in np.flatnonzero(after >= 0):           # ``after`` always points backwards
        t[i] = t[after[i]] + trace.think_s[i]
    return np.argsort(t, kind="stable")


@dataclass
class ReplayResult:
    """Totals and one row per admitted request (``requests``)."""

    engine: str
    policy: str
    block_size: int
    num_blocks: int | None
    stats: dict
    requests: pd.DataFrame = field(repr=False)
    rejected: int = 0
    peak_kv_usage: float | None = None
    seconds: float = 0.0
    skipped_lines: int = 0

    def summary(self) -> dict:
        """What ``m3lab cache-sim`` prints."""
        s = self.stats
        return {"requests": int(s["requests"]), "hit_rate_tokens": s["hits"] / s["queries"] if s["queries"] else 0.0,
                "hit_rate_blocks": s["hit_blocks"] / s["query_blocks"] if s["query_blocks"] else 0.0,
                "evicted_blocks": int(s["evicted_blocks"]), "peak_kv_usage": self.peak_kv_usage,
                "hit_tokens": int(s["hits"]), "query_tokens": int(s["queries"]), "rejected": self.rejected,
                "engine": self.engine, "policy": self.policy, "block_size": self.block_size,
                "capacity_blocks": self.num_blocks,
                "capacity_tokens": None if self.num_blocks is None else (self.num_blocks - 1) * self.block_size,
                "skipped_lines": self.skipped_lines, "seconds": self.seconds}


def _progress(n: int, enabled: bool):
    if not enabled or n < PROGRESS_MIN_REQUESTS or not sys.stderr.isatty():   # a bar only on a terminal
        return None
    from rich.console import Console
    from rich.progress import Progress
    prog = Progress(transient=True, console=Console(stderr=True))   # stdout keeps only the results
    prog.start()
    return prog, prog.add_task("replaying", total=n)


def replay(trace: Trace, engine: str = "m3lab", *, num_blocks: int | None = None, policy: str = "lru",  # long: hot loop
           concurrency: int = 1, use_eagle: bool = False, progress: bool = False, cache=None) -> ReplayResult:
    """Replay ``trace`` (see module docstring). ``num_blocks``: vLLM's ``num_gpu_blocks`` (None: unlimited);
    ``cache``: an engine to use instead of a fresh one."""
    if not isinstance(concurrency, int) or concurrency < 1:
        raise M3LabError(f"concurrency={concurrency!r} must be a positive integer", field="concurrency")
    bs = trace.block_size
    kv = cache if cache is not None else make_engine(engine, num_blocks, bs, policy, use_eagle=use_eagle)
    order = replay_order(trace)
    running: deque = deque()
    rows_req, rows_hit, rows_usage, rows_evict = [], [], [], []
    rejected = 0
    peak = 0.0
    bar = _progress(len(order), progress)
    t0 = time.perf_counter()

    def finish_oldest() -> bool:
        if not running:
            return False
        rid = running.popleft()
        kv.free(rid)
        kv.remove(rid)
        return True

    for n, i in enumerate(order):
        i = int(i)
        p, o = int(trace.prompt[i]), int(trace.output[i])
        while len(running) >= concurrency:
            finish_oldest()
        kv.add(i, trace.keys(i), p, p + o)
        hit = kv.lookup(i, p)
        while not kv.allocate(i, p, 0, p - len(hit) * bs, hit, full_sequence_must_fit=True):
            if not finish_oldest():
                break
        else:
            kv.record(i, p, len(hit))
            if o > 1:
                while not kv.allocate(i, p + o, p, o - 1, []):
                    if not finish_oldest():
                        break
            running.append(i)
            u = kv.usage
            if u is not None and u > peak:
                peak = u
            rows_req.append(i)
            rows_hit.append(len(hit) * bs)
            rows_usage.append(u)
            rows_evict.append(kv.evicted_blocks)
            if bar is not None and n % 256 == 0:
                bar[0].update(bar[1], completed=n)
            continue
        rejected += 1
        kv.free(i)
        kv.remove(i)
    while finish_oldest():
        pass
    if bar is not None:
        bar[0].stop()
    seconds = time.perf_counter() - t0
    stats = _stats(kv, trace, rows_req, rows_hit)
    req = pd.DataFrame({"request": rows_req, "prompt_tokens": trace.prompt[rows_req], "hit_tokens": rows_hit,
                        "kv_usage": rows_usage, "evicted_blocks": rows_evict})
    return ReplayResult(engine, policy, bs, getattr(kv, "num_blocks", num_blocks), stats, req, rejected,
                        peak if kv.usage is not None else None, seconds, trace.skipped)


def _stats(kv, trace: Trace, rows_req: list, rows_hit: list) -> dict:
    """Totals in vLLM's terms: from the engine's own counters (vLLM's PrefixCacheStats for ``vllm``)."""
    bs = trace.block_size
    if hasattr(kv, "take_stats"):
        s = kv.take_stats()
    else:
        s = {k: v for k, v in kv.stats.as_dict().items()}
    prompts = trace.prompt[rows_req] if rows_req else np.zeros(0, np.int64)
    s["query_blocks"] = int(ceil_div(prompts, bs).sum())
    s["hit_blocks"] = int(sum(rows_hit) // bs)
    s["evicted_blocks"] = kv.evicted_blocks
    return s
