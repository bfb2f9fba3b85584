"""m3lab's prefix cache against vLLM's own ``KVCacheManager`` / ``BlockPool`` (vLLM 0.33.0, CPU, no model).

Both caches get the same operations — admissions with chunked prefill, decodes with and without
speculative lookahead, finishes, preemptions and re-admissions — on a small finite pool, and after every
operation the test asserts the same answer: hit block ids, allocation success, the free queue in order
(so eviction order), evictions, resident cached blocks, every live request's block table, and at the end
vLLM's ``PrefixCacheStats``. Hand-made cases pin the documented behaviours; 1,000 seeded random streams
with shared prefixes cover the rest. A second group breaks one semantic detail of m3lab's cache on
purpose and requires the comparison to catch it.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from m3lab.cache import pool as pool_mod
from m3lab.cache.replay import M3LabKVCache

from m3lab.cache import vllm_ref

RANDOM_STREAMS = 1000


class Twin:
    """The same request operations on both caches, compared after each one."""

    def __init__(self, num_blocks: int, block_size: int, use_eagle: bool = False, ours=M3LabKVCache):
        self.ours = ours(num_blocks, block_size, use_eagle=use_eagle)
        self.ref = vllm_ref.VllmKVCache(num_blocks, block_size, use_eagle=use_eagle)
        self.bs = block_size
        self.req: dict = {}
        self.log: list = []

    def both(self, method: str, *args, **kwargs):
        a = getattr(self.ours, method)(*args, **kwargs)
        b = getattr(self.ref, method)(*args, **kwargs)
        assert a == b, f"{method}{args}: m3lab {a!r} != vLLM {b!r} after {self.log}"
        return a

    def check(self) -> None:
        o, r = self.ours, self.ref
        where = f"after {self.log}"
        assert o.num_free == r.num_free, where
        assert o.free_order() == r.free_order(), where
        assert o.evicted_blocks == r.evicted_blocks, where
        assert o.num_cached == r.num_cached, where
        assert o.usage == pytest.approx(r.usage), where
        for rid, st in self.req.items():
            if st["running"]:
                assert o.block_ids(rid) == r.block_ids(rid), f"request {rid} {where}"

    # ---- operations ----------------------------------------------------------------------------
    def add(self, rid, keys: list, prompt: int, total: int) -> None:
        assert len(keys) == total // self.bs
        self.both("add", rid, keys, prompt, total)
        self.req[rid] = {"tokens": prompt, "total": total, "computed": 0, "running": False, "preempted": False}

    def admit(self, rid, chunk: int | None = None, full: bool = True) -> bool:
        st = self.req[rid]
        self.log.append(("admit", rid, chunk, full))
        hit = self.both("lookup", rid, st["tokens"])
        n_new = st["tokens"] - len(hit) * self.bs
        if chunk is not None:
            n_new = min(chunk, n_new)
        ok = self.both("allocate", rid, st["tokens"], 0, n_new, hit, full_sequence_must_fit=full)
        if ok:
            self.both("record", rid, st["tokens"], len(hit), st["preempted"])
            st.update(running=True, computed=len(hit) * self.bs + n_new)
            self._sampled(st)
        self.check()
        return ok

    def _sampled(self, st) -> None:
        if st["computed"] == st["tokens"] and st["tokens"] < st["total"]:
            st["tokens"] += 1                      # the token sampled at the end of this step

    def step(self, rid, chunk: int, lookahead: int = 0) -> bool:
        st = self.req[rid]
        n = min(chunk, st["tokens"] - st["computed"])
        if n <= 0:
            return True
        self.log.append(("step", rid, n, lookahead))
        ok = self.both("allocate", rid, st["tokens"], st["computed"], n, [], lookahead=lookahead)
        if ok:
            st["computed"] += n
            self._sampled(st)
        self.check()
        return ok

    def free(self, rid, preempt: bool = False) -> None:
        self.log.append(("preempt" if preempt else "finish", rid))
        self.both("free", rid)
        st = self.req[rid]
        if preempt:
            st.update(running=False, computed=0, preempted=True)
        else:
            self.both("remove", rid)
            del self.req[rid]
        self.check()

    def final_stats(self) -> None:
        ref = self.ref.take_stats()
        ours = {k: getattr(self.ours.stats, k) for k in ref}
        assert ours == ref, f"PrefixCacheStats: m3lab {ours} != vLLM {ref}"


def _keys(n: int, start: int) -> list:
    return list(range(start, start + n))


# ---- hand-made cases -------------------------------------------------------------------------------
def test_tail_first_free_and_lru_order():
    t = Twin(num_blocks=12, block_size=4)
    t.add("a", _keys(3, 100), 14, 14)                      # 3 full blocks + 2 tokens, no output
    assert t.admit("a")
    t.free("a")
    assert t.ours.free_order()[:1] == [4]                   # the key-less partial block is reused first ...
    assert t.ours.free_order()[-3:] == [3, 2, 1]            # ... the cached ones tail-first at the end
    t.final_stats()


def test_hit_capped_below_a_whole_prompt():
    t = Twin(num_blocks=16, block_size=4)
    t.add("a", _keys(3, 100), 12, 12)
    assert t.admit("a")
    t.free("a")
    t.add("b", _keys(3, 100), 12, 12)                       # the same 12 tokens: only 2 blocks may hit
    assert t.admit("b")
    assert t.ours.stats.hits == 8
    t.final_stats()


def test_eagle_drops_the_last_hit_block():
    t = Twin(num_blocks=16, block_size=4, use_eagle=True)
    t.add("a", _keys(4, 100), 16, 16)
    assert t.admit("a")
    t.free("a")
    t.add("b", _keys(4, 100), 16, 16)
    assert t.admit("b")
    assert t.ours.stats.hits == 8                           # 3 blocks capped, then one dropped
    t.final_stats()


def test_duplicate_blocks_from_concurrent_prefills_and_lazy_eviction():
    t = Twin(num_blocks=10, block_size=2)
    keys = _keys(4, 50)
    t.add("a", keys, 8, 8)
    t.add("b", keys, 8, 8)
    assert t.admit("a", chunk=2)                             # a caches block 0 only
    assert t.admit("b", chunk=2)                             # b hits block 0, then computes its own copies
    for _ in range(3):
        t.step("a", 2)
        t.step("b", 2)
    t.free("a")
    t.free("b")
    t.add("c", _keys(4, 900), 8, 8)                          # fills the pool: evicts from the LRU head
    assert t.admit("c")
    t.add("d", keys, 8, 8)
    t.admit("d")
    t.final_stats()


def test_admission_fails_without_side_effects_and_preempted_stats_apart():
    t = Twin(num_blocks=6, block_size=2)
    t.add("a", _keys(4, 10), 8, 9)
    assert t.admit("a")
    t.add("b", _keys(4, 20), 8, 8)
    assert not t.admit("b")                                  # 4 blocks needed, 1 free
    t.free("a", preempt=True)
    assert t.admit("b")
    t.free("b")
    assert t.admit("a")                                      # re-admitted: counted as preempted
    assert t.ours.stats.preempted_requests == 1
    t.final_stats()


# ---- random streams --------------------------------------------------------------------------------
def run_stream(seed: int, ours=M3LabKVCache) -> None:
    """One seeded stream of operations on a small pool (raises AssertionError at the first difference)."""
    rng = random.Random(seed)
    bs = rng.choice((1, 2, 3, 4, 5))
    t = Twin(num_blocks=rng.randint(4, 24), block_size=bs, use_eagle=rng.random() < 0.2, ours=ours)
    lookahead = rng.choice((0, 0, 0, 1, 3))
    sequences: list = []
    next_key = [1000]

    def fresh(n):
        next_key[0] += n
        return list(range(next_key[0] - n, next_key[0]))

    def new_request(rid):
        if sequences and rng.random() < 0.25:                  # an exact repeat (a retry, a resent prompt)
            keys, prompt, total = rng.choice(sequences)
        else:
            prompt = rng.randint(1, 9 * bs)
            total = prompt + rng.randint(0, 3 * bs)
            keys = []
            if sequences and rng.random() < 0.75:              # extend a prefix of an earlier sequence
                base = rng.choice(sequences)[0]
                keys = base[: rng.randint(0, min(len(base), prompt // bs))]
            keys = keys + fresh(total // bs - len(keys))
        sequences.append((keys, prompt, total))
        t.add(rid, keys, prompt, total)

    n_ops = rng.randint(20, 45)
    rid = 0
    for _ in range(n_ops):
        live = [r for r, s in t.req.items() if s["running"]]
        waiting = [r for r, s in t.req.items() if not s["running"]]
        u = rng.random()
        if u < 0.3 and len(t.req) < 7:
            new_request(rid)
            t.admit(rid, chunk=rng.choice((None, bs, 2 * bs + 1)), full=rng.random() < 0.7)
            rid += 1
        elif u < 0.4 and waiting:
            t.admit(rng.choice(waiting), full=rng.random() < 0.7)
        elif u < 0.8 and live:
            r = rng.choice(live)
            if not t.step(r, rng.choice((1, bs, 3 * bs)), lookahead):
                t.free(r, preempt=True)
        elif u < 0.92 and live:
            t.free(rng.choice(live))
        elif live:
            t.free(rng.choice(live), preempt=True)
    for r in list(t.req):
        t.free(r)
    t.final_stats()
    return t


def test_random_streams_match_vllm():
    seen = {"evicted": 0, "hits": 0, "preempted_hits": 0, "refused": 0}
    for seed in range(RANDOM_STREAMS):
        t = run_stream(seed)
        seen["evicted"] += t.ours.evicted_blocks
        seen["hits"] += t.ours.stats.hits
        seen["preempted_hits"] += t.ours.stats.preempted_hits
        seen["refused"] += sum(1 for op in t.log if op[0] == "preempt")
    # the streams exercise what they claim to: evictions, hits, preemptions and re-admission hits
    assert seen["evicted"] > 1000 and seen["hits"] > 1000 and seen["preempted_hits"] > 0 and seen["refused"] > 100


# ---- the comparison catches a changed semantic detail -------------------------------------------------
def _fails_somewhere(ours, seeds=range(60)) -> bool:
    for seed in seeds:
        try:
            run_stream(seed, ours)
        except Exception:          # a difference (AssertionError), or the broken cache tripping over itself
            return True
    return False


class _FreeHeadFirst(M3LabKVCache):
    def free(self, rid):                                      # a request's blocks freed first block first
        blocks = self.req_blocks.get(rid)
        if blocks:
            blocks.reverse()
        super().free(rid)


class _UncappedHit(M3LabKVCache):
    def get_computed_blocks(self, hashes, num_tokens):       # hit up to the whole prompt (no "- 1")
        return super().get_computed_blocks(hashes, num_tokens + 1)


class _KeylessToTail(M3LabKVCache):
    def free(self, rid):                                      # key-less blocks appended, not reused first
        before = list(self._keyless)
        super().free(rid)
        new = [b for b in self._keyless if b not in before]
        self._keyless = pool_mod.deque(before)
        self.policy.append_n(new)


class _MostRecentVictim(M3LabKVCache):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        pol = self.policy

        def newest_first(n):                                  # evict the most recently freed blocks
            out = pol.order()[::-1][:n]
            pol.remove_n(np.asarray(out, np.int64))
            return out

        pol.popleft_n = newest_first


class _IgnoresEvictableHits(M3LabKVCache):
    def blocks_to_allocate(self, rid, num_tokens_slot, hit=()):  # forgets that touched free hits leave the pool
        required = -(-num_tokens_slot // self.block_size)
        return max(required - len(hit) - len(self.req_blocks.get(rid, ())), 0)


@pytest.mark.parametrize("broken", [_FreeHeadFirst, _UncappedHit, _KeylessToTail, _MostRecentVictim,
                                    _IgnoresEvictableHits])
def test_a_changed_detail_is_caught(broken):
    assert _fails_somewhere(broken)
