"""Orders in which free, still-cached KV blocks are evicted: vLLM's LRU and two alternatives.

A block whose last user finished keeps its hash (vLLM evicts lazily) and waits in a free structure
until an allocation needs it. :class:`~m3lab.cache.pool.PrefixCache` keeps the free blocks *without* a
hash (and the never-used ones) itself, because every policy hands those out first, as vLLM does
(``BlockPool.free_blocks`` prepends them, vllm/v1/core/block_pool.py:870-889). A policy orders only
the cached free blocks:

- :class:`LRU` — vLLM's order exactly: blocks join the tail in the order ``free_blocks`` is given
  (a finished request's blocks tail-first, ``single_type_kv_cache_manager.py:591-601``), leave it when
  a hit touches them, and are evicted from the head (``FreeKVCacheBlockQueue``, kv_cache_utils.py).
- :class:`LFU` — least hits since the block was cached first, least recently freed among equals.
- :class:`RadixLRU` — prefix-tree aware (SGLang's RadixCache evicts this way): only a leaf of the tree
  of cached prefixes (a block that no cached block extends) may go, least recently freed first; when
  every free block still has a cached child, the least recently freed one goes.

Each policy is a small class over integer block ids with ``append_n``, ``remove(_n)``, ``popleft`` and
``len``; ``on_hit`` / ``on_cached`` / ``on_evicted`` are called only when ``tracks_hits`` /
``tracks_tree`` say the policy needs them.
"""
from __future__ import annotations

import heapq

import numpy as np

from m3lab.errors import M3LabError


class LRU:
    """vLLM's free queue for cached blocks, as a first-in first-out array with lazy removal.

    vLLM's doubly linked list only ever appends at the tail, so the queue is ordered by the time of
    appending: each append stamps the block with the next sequence number, a removal (a hit touching a
    free block) clears the stamp, and the head is the oldest entry whose stamp is still the block's own.
    Appends and removals are numpy operations on whole requests; the order is exactly vLLM's.
    """

    name = "lru"
    tracks_hits = False
    tracks_tree = False

    def __init__(self, size: int = 1024):
        self._stamp = np.full(size, -1, np.int64)     # per block: stamp of its live entry, -1 when not queued
        self._blocks = np.zeros(1024, np.int64)       # entries in append order ...
        self._stamps = np.zeros(1024, np.int64)       # ... and the stamp each was given
        self._head = self._tail = self._next = self._len = 0

    def reserve(self, size: int) -> None:
        """Room for block ids below ``size``."""
        if size > len(self._stamp):
            self._stamp = np.concatenate([self._stamp, np.full(size - len(self._stamp), -1, np.int64)])

    def _live(self) -> np.ndarray:
        b = self._blocks[self._head:self._tail]
        return self._stamp[b] == self._stamps[self._head:self._tail]

    def _make_room(self, k: int) -> None:
        keep = self._live()
        b, st = self._blocks[self._head:self._tail][keep], self._stamps[self._head:self._tail][keep]
        size = max(len(self._blocks), 2 * (len(b) + k))
        if size > len(self._blocks):
            self._blocks, self._stamps = np.zeros(size, np.int64), np.zeros(size, np.int64)
        self._blocks[:len(b)], self._stamps[:len(b)] = b, st
        self._head, self._tail = 0, len(b)

    def append_n(self, blocks) -> None:
        blocks = np.asarray(blocks, np.int64)
        k = len(blocks)
        if self._tail + k > len(self._blocks):
            self._make_room(k)
        stamps = np.arange(self._next, self._next + k, dtype=np.int64)
        t = self._tail
        self._blocks[t:t + k], self._stamps[t:t + k] = blocks, stamps
        self._stamp[blocks] = stamps
        self._tail += k
        self._next += k
        self._len += k

    def remove(self, b: int) -> None:
        self._stamp[b] = -1
        self._len -= 1

    def remove_n(self, blocks) -> None:
        self._stamp[blocks] = -1
        self._len -= len(blocks)

    def popleft_n(self, n: int) -> list[int]:
        """The ``n`` oldest entries, removed."""
        out: list = []
        while len(out) < n:
            need, h = n - len(out), self._head
            if h >= self._tail:
                raise IndexError("pop from an empty free queue")
            span = min(self._tail, h + max(2 * need, 64))
            b = self._blocks[h:span]
            live = np.flatnonzero(self._stamp[b] == self._stamps[h:span])[:need]
            out.extend(b[live].tolist())
            self._head = h + int(live[-1]) + 1 if len(live) == need else span
        self._stamp[out] = -1
        self._len -= n
        return out

    def popleft(self) -> int:
        return self.popleft_n(1)[0]

    def order(self) -> list[int]:
        """Free cached blocks from the next victim to the last."""
        return self._blocks[self._head:self._tail][self._live()].tolist()

    def __len__(self) -> int:
        return self._len


class _Heap:
    """A min-heap of (priority..., block) with lazy deletion: ``live[b]`` holds the entry that counts."""

    def __init__(self):
        self._heap: list = []
        self._live: dict[int, tuple] = {}

    def push(self, entry: tuple) -> None:
        self._live[entry[-1]] = entry
        heapq.heappush(self._heap, entry)

    def discard(self, b: int) -> None:
        del self._live[b]

    def pop(self) -> int:
        heap, live = self._heap, self._live
        while True:
            entry = heapq.heappop(heap)
            b = entry[-1]
            if live.get(b) is entry:
                del live[b]
                return b

    def __contains__(self, b: int) -> bool:
        return b in self._live

    def __len__(self) -> int:
        return len(self._live)


class LFU:
    """Evict the free cached block hit least often since it was cached; ties: least recently freed."""

    name = "lfu"
    tracks_hits = True
    tracks_tree = False

    def __init__(self):
        self._heap = _Heap()
        self._hits: dict[int, int] = {}
        self._clock = 0

    def append_n(self, blocks) -> None:
        for b in np.asarray(blocks).tolist():
            self._clock += 1
            self._heap.push((self._hits.get(b, 0), self._clock, b))

    def remove(self, b: int) -> None:
        self._heap.discard(b)

    def remove_n(self, blocks) -> None:
        for b in np.asarray(blocks).tolist():
            self._heap.discard(b)

    def popleft(self) -> int:
        return self._heap.pop()

    def on_hit(self, b: int) -> None:
        self._hits[b] = self._hits.get(b, 0) + 1

    def on_evicted(self, b: int) -> None:
        self._hits.pop(b, None)

    def __len__(self) -> int:
        return len(self._heap)


class RadixLRU:
    """Leaf-first LRU over the tree of cached prefixes (see module docstring)."""

    name = "radix"
    tracks_hits = False
    tracks_tree = True

    def __init__(self):
        self._leaves = _Heap()                 # free blocks with no cached child
        self._inner: dict[int, int] = {}       # free blocks with a cached child -> free stamp
        self._inner_heap = _Heap()             # the same, for the fallback when no leaf is free
        self._children: dict[int, set] = {}    # block -> cached blocks whose parent it is
        self._parent: dict[int, int] = {}      # cached block -> its parent block (absent at the root)
        self._clock = 0

    def append_n(self, blocks) -> None:
        for b in np.asarray(blocks).tolist():
            self._clock += 1
            if self._children.get(b):
                self._inner[b] = self._clock
                self._inner_heap.push((self._clock, b))
            else:
                self._leaves.push((self._clock, b))

    def remove(self, b: int) -> None:
        if b in self._inner:
            del self._inner[b]
            self._inner_heap.discard(b)
        else:
            self._leaves.discard(b)

    def remove_n(self, blocks) -> None:
        for b in np.asarray(blocks).tolist():
            self.remove(b)

    def popleft(self) -> int:
        if len(self._leaves):
            return self._leaves.pop()
        b = self._inner_heap.pop()
        del self._inner[b]
        return b

    def on_cached(self, b: int, parent: int | None) -> None:
        if parent is not None:
            self._parent[b] = parent
            self._children.setdefault(parent, set()).add(b)

    def on_evicted(self, b: int) -> None:
        for child in self._children.pop(b, ()):     # an inner block went (fallback): its children are roots
            del self._parent[child]
        p = self._parent.pop(b, None)
        if p is None:
            return
        kids = self._children[p]
        kids.discard(b)
        if not kids and p in self._inner:           # the parent became a free leaf: it keeps its stamp
            stamp = self._inner.pop(p)
            self._inner_heap.discard(p)
            self._leaves.push((stamp, p))

    def __len__(self) -> int:
        return len(self._leaves) + len(self._inner)


POLICIES = {"lru": LRU, "lfu": LFU, "radix": RadixLRU}


def make_policy(name: str):
    """A fresh policy by name (``lru`` = vLLM's, ``lfu``, ``radix``)."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise M3LabError(f"unknown eviction policy {name!r}", field="policy",
                         hint=f"choose one of {', '.join(POLICIES)}") from None
