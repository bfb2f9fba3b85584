"""Eviction policies on their own: vLLM's LRU order, LFU counts, the radix policy's leaves-first rule."""
from __future__ import annotations

import numpy as np
import pytest

from m3lab.cache.policies import LFU, LRU, RadixLRU, make_policy
from m3lab.cache.pool import PrefixCache
from m3lab.errors import M3LabError


def test_lru_is_append_order_with_removal():
    q = LRU(16)
    q.append_n([5, 3, 9])
    q.append_n(np.array([1, 2]))
    q.remove(9)
    q.append_n([9])                                       # re-freed: back at the tail
    assert q.order() == [5, 3, 1, 2, 9] and len(q) == 5
    assert q.popleft_n(2) == [5, 3] and q.popleft() == 1 and len(q) == 2
    for b in range(200):                                  # wraps and compacts its arrays
        q.append_n([10 + b % 5])
        q.remove_n(np.array([10 + b % 5]))
    assert q.order() == [2, 9]


def test_lfu_evicts_the_least_hit_block():
    q = LFU()
    q.on_hit(7)
    q.on_hit(7)
    q.on_hit(4)
    q.append_n([7, 4, 8])
    assert [q.popleft() for _ in range(3)] == [8, 4, 7]


def test_radix_evicts_leaves_first_then_the_oldest():
    q = RadixLRU()
    q.on_cached(1, None)
    q.on_cached(2, 1)
    q.on_cached(3, 2)
    q.on_cached(4, 1)                                     # a tree: 1 -> 2 -> 3 and 1 -> 4
    q.append_n([1, 2, 3])                                 # 1 and 2 have children: only 3 may go
    assert q.popleft() == 3
    q.on_evicted(3)                                       # now 2 is a leaf, 1 still has child 4 (in use)
    assert q.popleft() == 2
    q.on_evicted(2)
    assert q.popleft() == 1                               # no leaf left among the free: the oldest goes


def test_policies_behind_one_interface():
    for name in ("lru", "lfu", "radix"):
        cache = PrefixCache(40, 4, name)
        cache.allocate_slots("a", list(range(5)), 21, 0, 21)
        cache.free("a")
        hit = cache.get_computed_blocks(list(range(5)), 21)
        assert len(hit) == 5 and cache.allocate_slots("b", list(range(5)), 21, 0, 1, hit)
    with pytest.raises(M3LabError, match="unknown eviction policy"):
        make_policy("fifo")
