"""A KV / prefix cache with vLLM v1's semantics, on integer block ids (no Python object per block).

What it reproduces (vLLM 0.33.0, full attention, hash block = KV block; file:line in ``vllm/v1/core/``):

- **keys**: a request's full blocks carry chained keys (``hashes[i]`` stands for the whole prefix up to
  block i, like ``request.block_hashes``); a partial block has none and never hits;
- **lookup** (``KVCacheManager.get_computed_blocks``, kv_cache_manager.py:266-328, and
  ``FullAttentionManager.find_longest_cache_hit``, single_type_kv_cache_manager.py:743-838): the longest
  run of cached keys from block 0, at most ``(num_tokens - 1) // block_size`` blocks; with EAGLE the last
  matched block is dropped; among duplicate blocks of one key the first cached one is returned
  (``BlockHashToBlockMap.get_one_block``, block_pool.py:61-70);
- **allocation** (``allocate_slots``, kv_cache_manager.py:380-627): fails without side effects when the
  new blocks plus the hit blocks that sit in the free queue exceed the free blocks (and, for admission,
  when the whole sequence would not fit: ``full_sequence_must_fit``); otherwise hit blocks are touched
  (``ref += 1``, out of the free queue), new blocks come from the head of the free queue, and a popped
  block that still has a key loses it then (lazy eviction, ``_maybe_evict_cached_block``);
- **caching**: every block that is full once the step's tokens are computed gets its key, capped at the
  tokens the request really has (``num_tokens_to_cache``); identical blocks filled by two requests are
  both kept under one key (no de-duplication, block_pool.py:47-52);
- **freeing** (``SingleTypeKVCacheManager.free`` / ``BlockPool.free_blocks``): a request's blocks in
  reverse order; blocks whose count drops to 0 go to the head of the free queue when they have no key,
  to the tail (:mod:`m3lab.cache.policies`) when they do;
- **stats** as ``PrefixCacheStats.record`` (vllm/v1/metrics/stats.py:138-156): queries and hits in tokens,
  one record per admitted lookup, preempted requests apart; **usage** as ``BlockPool.get_usage``:
  ``1 - free / (num_blocks - 1)`` (block 0 is vLLM's null block and is never handed out).

The free queue is kept in three parts whose concatenation is vLLM's single list: key-less freed blocks
(a deque, head first), the never-used ids (a counter, ascending, as vLLM's initial queue), and the
cached free blocks (the eviction policy; vLLM's LRU is a stamped first-in first-out array).
Reference counts live in a numpy array, so touching a whole hit prefix and freeing a whole request are
array operations. ``num_blocks=None`` is an
unlimited pool (never-used ids never run out, so nothing cached is ever evicted).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np

from m3lab.arith import ceil_div
from m3lab.cache.policies import make_policy
from m3lab.errors import M3LabError


@dataclass
class PrefixCacheStats:
    """Totals as vLLM's ``PrefixCacheStats`` counts them (tokens), plus block-level hits and evictions."""

    requests: int = 0
    queries: int = 0                 # tokens looked up (request.num_tokens at admission)
    hits: int = 0                    # tokens found cached
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    query_blocks: int = 0            # blocks the admitted requests needed (ceil(num_tokens / block_size))
    hit_blocks: int = 0
    evicted_blocks: int = 0          # keys dropped when a cached free block was handed out again

    def record(self, num_tokens: int, num_hits: int, preempted: bool, block_size: int) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
            return
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits
        self.query_blocks += ceil_div(num_tokens, block_size)
        self.hit_blocks += num_hits // block_size

    @property
    def hit_rate(self) -> float:
        """hits / queries in tokens (vLLM's ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``)."""
        return self.hits / self.queries if self.queries else 0.0

    @property
    def hit_rate_blocks(self) -> float:
        """Hit blocks / blocks the requests needed."""
        return self.hit_blocks / self.query_blocks if self.query_blocks else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "hit_rate": self.hit_rate, "hit_rate_blocks": self.hit_rate_blocks}


class PrefixCache:
    """Block pool + KV cache manager of one rank (see module docstring). Requests are any hashable ids.

    ``num_blocks`` counts vLLM's ``num_gpu_blocks`` (null block included); None = unlimited.
    ``policy``: ``lru`` (vLLM), ``lfu`` or ``radix`` (:mod:`m3lab.cache.policies`).
    """

    def __init__(self, num_blocks: int | None, block_size: int, policy: str = "lru", *, use_eagle: bool = False,
                 max_model_len: int | None = None, watermark: float = 0.0):
        if num_blocks is not None and (not isinstance(num_blocks, int) or num_blocks < 2):
            raise M3LabError(f"num_blocks={num_blocks!r} must be an integer >= 2 (block 0 is the null block) "
                             "or None for an unlimited cache", field="num_blocks")
        if not isinstance(block_size, int) or block_size < 1:
            raise M3LabError(f"block_size={block_size!r} must be a positive integer", field="block_size")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.use_eagle = use_eagle
        self.max_model_len = max_model_len if max_model_len is not None else 1 << 62
        self.watermark_blocks = int(watermark * num_blocks) if num_blocks else 0
        self.policy = make_policy(policy)
        self._tracks_hits = self.policy.tracks_hits
        self._tracks_tree = self.policy.tracks_tree
        self._keyless: deque[int] = deque()          # freed blocks without a key, next victim first
        self._fresh = 1                               # next never-used block id (0 is the null block)
        self._fresh_end = num_blocks if num_blocks is not None else math.inf
        size = num_blocks if num_blocks is not None else 1024
        self.ref = np.zeros(size, np.int32)           # reference count per block
        self.has_key = np.zeros(size, bool)           # whether the block is cached (has a key)
        self.key: list = [None] * size                # the key a block is cached under (None: not cached)
        self.table: dict = {}                         # key -> first cached block with that key
        self._dups: dict = {}                         # key -> further blocks with that key, in caching order
        if hasattr(self.policy, "reserve"):
            self.policy.reserve(size)
        self.req_blocks: dict = {}                    # request -> its block ids in order
        self._req_cached: dict = {}                   # request -> how many of its blocks are cached
        self.stats = PrefixCacheStats()
        self.peak_used = 0
        self.num_cached = 0                           # blocks holding a key (resident cache, duplicates included)

    # ---- pool ------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Free blocks, cached ones included (``BlockPool.get_num_free_blocks``); huge when unlimited."""
        fresh = self._fresh_end - self._fresh
        return len(self._keyless) + (fresh if fresh != math.inf else 1 << 62) + len(self.policy)

    @property
    def num_used(self) -> int:
        """Blocks held by live requests (excludes the null block)."""
        return int((self.ref > 0).sum())

    @property
    def usage(self) -> float | None:
        """vLLM's KV cache usage, ``1 - free / (num_blocks - 1)``; None for an unlimited pool."""
        if self.num_blocks is None:
            return None
        return 1.0 - self.num_free / (self.num_blocks - 1)

    @property
    def peak_usage(self) -> float | None:
        return None if self.num_blocks is None else self.peak_used / (self.num_blocks - 1)

    def free_order(self) -> list[int]:
        """The free queue from the next block handed out to the last (vLLM's ``get_all_free_blocks``);
        the policy part in policy order (exact for ``lru``). Finite pools only."""
        return [*self._keyless, *range(self._fresh, self._fresh_end), *self.policy.order()]

    def _take(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the head of the free queue, evicting keys (``get_new_blocks``)."""
        out = []
        keyless = self._keyless
        while n and keyless:
            out.append(keyless.popleft())
            n -= 1
        if n and self._fresh < self._fresh_end:
            k = n if self._fresh_end == math.inf else min(n, self._fresh_end - self._fresh)
            start = self._fresh
            self._fresh += k
            if self._fresh > len(self.ref):
                self._grow(self._fresh)
            out.extend(range(start, start + k))
            n -= k
        if n:
            key, policy, has_key = self.key, self.policy, self.has_key
            victims = policy.popleft_n(n) if hasattr(policy, "popleft_n") else [policy.popleft() for _ in range(n)]
            evicted = 0
            for b in victims:
                h = key[b]
                if h is not None:
                    self._drop_key(h, b)
                    key[b] = None
                    has_key[b] = False
                    evicted += 1
                    self.num_cached -= 1
                    if self._tracks_hits or self._tracks_tree:
                        policy.on_evicted(b)
                out.append(b)
            self.stats.evicted_blocks += evicted
        self.ref[out] = 1
        return out

    def _grow(self, size: int) -> None:
        """Unlimited pool: room for block ids below ``size``."""
        new = max(size, 2 * len(self.ref))
        extra = new - len(self.ref)
        self.ref = np.concatenate([self.ref, np.zeros(extra, np.int32)])
        self.has_key = np.concatenate([self.has_key, np.zeros(extra, bool)])
        self.key.extend([None] * extra)
        if hasattr(self.policy, "reserve"):
            self.policy.reserve(new)

    def _drop_key(self, h, b: int) -> None:
        if self.table.get(h) == b:
            more = self._dups.get(h)
            if more:
                self.table[h] = more.pop(0)
                if not more:
                    del self._dups[h]
            else:
                del self.table[h]
        else:
            more = self._dups[h]
            more.remove(b)
            if not more:
                del self._dups[h]

    def _insert(self, h, b: int) -> None:
        self.key[b] = h
        self.has_key[b] = True
        self.num_cached += 1
        if h not in self.table:
            self.table[h] = b
        else:
            self._dups.setdefault(h, []).append(b)

    # ---- manager ---------------------------------------------------------------------------------
    def get_computed_blocks(self, hashes: list, num_tokens: int, num_hashed: int | None = None) -> list[int]:
        """Cached block ids of the longest hit for a request of ``num_tokens`` tokens whose full blocks have
        keys ``hashes`` (a list; only the first ``(num_tokens - 1) // block_size`` are consulted, and only the
        first ``num_hashed`` exist yet when given: vLLM's ``request.block_hashes``)."""
        limit = (num_tokens - 1) // self.block_size
        if num_hashed is not None:
            limit = min(limit, num_hashed)
        if limit <= 0:
            return []
        got = list(map(self.table.get, hashes[:limit]))
        try:
            n = got.index(None)
        except ValueError:
            n = len(got)
        if self.use_eagle and n:
            n -= 1
        del got[n:]
        return got

    def record(self, num_tokens: int, hit_blocks: int, preempted: bool = False) -> None:
        """Record one admitted lookup (``KVCacheManager.record_prefix_cache_stats``)."""
        self.stats.record(num_tokens, hit_blocks * self.block_size, preempted, self.block_size)

    def blocks_to_allocate(self, rid, num_tokens_slot: int, hit: list[int] = (), evictable: int | None = None) -> int:
        """Free blocks an allocation needs (``get_num_blocks_to_allocate``); ``evictable``: how many ``hit``
        blocks sit in the free queue, when already counted."""
        required = ceil_div(num_tokens_slot, self.block_size)
        blocks = self.req_blocks.get(rid)
        if blocks is not None and rid in self._req_cached:
            return max(required - len(blocks), 0)
        have = len(blocks) if blocks is not None else 0
        if evictable is None:
            evictable = int((self.ref[hit] == 0).sum()) if len(hit) else 0
        return max(required - len(hit) - have, 0) + evictable

    def allocate_slots(self, rid, hashes: list, num_tokens: int, num_computed: int, num_new_tokens: int,
                       hit: list[int] = (), *, lookahead: int = 0, full_sequence_must_fit: bool = False,
                       apply_watermark: bool = False, num_hashed: int | None = None) -> bool:
        """Give request ``rid`` slots for ``num_new_tokens`` more tokens after ``num_computed`` computed ones
        and the ``hit`` blocks just found; cache its newly full blocks. False (nothing changed) when the free
        blocks do not suffice. ``num_tokens``: the tokens the request has (prompt + outputs so far);
        ``num_hashed``: how many of ``hashes`` exist yet (default all)."""
        bs = self.block_size
        if not hit and not full_sequence_must_fit and not apply_watermark:   # a running request whose blocks
            blocks = self.req_blocks.get(rid)                                  # already hold the new slots
            if blocks is not None and len(blocks) * bs >= min(num_computed + num_new_tokens + lookahead,
                                                              self.max_model_len):
                self.cache_blocks(rid, hashes, min(min(num_computed, self.max_model_len) + num_new_tokens,
                                                   num_tokens), num_hashed)
                return True
        total_computed = min(num_computed + len(hit) * bs, self.max_model_len)
        free = self.num_free
        reserve = self.watermark_blocks if apply_watermark else 0
        if hit:
            h = np.asarray(hit, np.int64)
            r = self.ref[h]
            in_queue = r == 0
            evictable = int(in_queue.sum())
        else:
            evictable = 0
        if full_sequence_must_fit and (self.blocks_to_allocate(rid, min(num_tokens, self.max_model_len), hit,
                                                               evictable) + reserve > free):
            return False
        slot = min(total_computed + num_new_tokens + lookahead, self.max_model_len)
        if self.blocks_to_allocate(rid, slot, hit, evictable) + reserve > free:
            return False
        blocks = self.req_blocks.get(rid)
        if blocks is None:
            blocks = self.req_blocks[rid] = []
        if hit:
            policy = self.policy
            if evictable:
                policy.remove_n(h[in_queue])
            self.ref[h] = r + 1
            if self._tracks_hits:
                for b in hit:
                    policy.on_hit(b)
            blocks.extend(hit)
            self._req_cached[rid] = len(blocks)
        k = ceil_div(slot, bs) - len(blocks)
        if k > 0:
            blocks.extend(self._take(k))
        if self.num_blocks is not None:
            used = self.num_blocks - 1 - self.num_free
            if used > self.peak_used:
                self.peak_used = used
        self.cache_blocks(rid, hashes, min(total_computed + num_new_tokens, num_tokens), num_hashed)
        return True

    def allocate_running(self, rid, hashes: list, num_tokens: int, num_computed: int, num_new_tokens: int,
                         lookahead: int, num_hashed: int) -> bool:
        """:meth:`allocate_slots` of a running request (no new hit, no admission check, no watermark), done at
        once when its blocks already hold the new slots (the common decode step)."""
        blocks = self.req_blocks.get(rid)
        bs, mml = self.block_size, self.max_model_len
        slots = num_computed + num_new_tokens + lookahead
        if blocks is None or len(blocks) * bs < (slots if slots < mml else mml):
            return self.allocate_slots(rid, hashes, num_tokens, num_computed, num_new_tokens, lookahead=lookahead,
                                       num_hashed=num_hashed)
        tokens = (num_computed if num_computed < mml else mml) + num_new_tokens
        if tokens > num_tokens:
            tokens = num_tokens
        n_hashed = len(hashes) if num_hashed > len(hashes) else num_hashed
        n_full = (tokens if tokens < n_hashed * bs else n_hashed * bs) // bs
        if self._req_cached.get(rid, 0) < n_full:
            self._cache(rid, hashes, n_full)
        return True

    def cache_blocks(self, rid, hashes: list, num_tokens: int, num_hashed: int | None = None) -> None:
        """Cache request ``rid``'s blocks that are full within its first ``num_tokens`` tokens and have a key
        (``KVCacheManager.cache_blocks``; ``num_hashed`` as for :meth:`allocate_slots`)."""
        n_hashed = len(hashes) if num_hashed is None or num_hashed > len(hashes) else num_hashed
        hashed_tokens = n_hashed * self.block_size
        n_full = (num_tokens if num_tokens < hashed_tokens else hashed_tokens) // self.block_size
        if self._req_cached.get(rid, 0) < n_full:
            self._cache(rid, hashes, n_full)

    def _cache(self, rid, hashes: list, n_full: int) -> None:
        """Give keys to request ``rid``'s blocks from the first uncached one up to block ``n_full``."""
        blocks = self.req_blocks[rid]
        insert = self._insert
        for i in range(self._req_cached.get(rid, 0), n_full):
            insert(hashes[i], blocks[i])
            if self._tracks_tree:
                self.policy.on_cached(blocks[i], blocks[i - 1] if i else None)
        self._req_cached[rid] = n_full

    def free(self, rid) -> None:
        """Release a finished or preempted request's blocks, last block first."""
        blocks = self.req_blocks.pop(rid, None)
        self._req_cached.pop(rid, None)
        if not blocks:
            return
        b = np.asarray(blocks[::-1], np.int64)
        r = self.ref[b] - 1
        self.ref[b] = r
        z = b[r == 0]
        if not len(z):
            return
        k = self.has_key[z]
        keyless = z[~k]
        if len(keyless):
            self._keyless.extendleft(keyless[::-1].tolist())
        cached = z[k]
        if len(cached):
            self.policy.append_n(cached)

    def usage_snapshot(self) -> dict:
        """Usage, cached blocks and the counters in one dict (for time series)."""
        return {"kv_usage": self.usage, "cached_blocks": self.num_cached, **self.stats.as_dict()}
