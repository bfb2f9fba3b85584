"""Closed-form attention counts against a brute-force loop over query positions."""
import numpy as np

from m3lab.optable.counts import attention_counts


def _brute(n, c, B, K):
    d = s = sc = sel = rd = 0
    for ni, ci in zip(n, c):
        ks = 0
        for p in range(ci - ni, ci):
            d += p + 1
            bt = p // B
            ks += p + 1 if bt + 1 <= K else (K - 1) * B + p % B + 1
            sc += bt + 1
            sel += min(bt + 1, K)
        s += ks
        rd += min(ci, ks)
    return d, s, sc, sel, rd


def test_counts_match_brute_force():
    rng = np.random.default_rng()
    for _ in range(100):
        R = int(rng.integers(1, 5))
        n = rng.integers(1, 200, R)
        c = n + rng.integers(0, 500, R)
        B, K = int(rng.choice([4, 16, 128])), int(rng.integers(1, 6))
        a = attention_counts(n, c, B, K)
        assert (a.dense_keys, a.sparse_keys, a.scored_blocks, a.selected_blocks, a.sparse_read_tokens) == \
            _brute(n, c, B, K)


def test_short_context_is_dense():
    a = attention_counts(np.array([1000]), np.array([1000]), 128, 16)  # every query < 2048: all blocks kept
    assert a.sparse_keys == a.dense_keys == 1000 * 1001 // 2
