"""Chained block keys of :class:`~m3lab.workload.requests.KeyContents`, each shared prefix chained once.

Key i of a request is ``hash((key i - 1, raw key i, the next lookahead raw keys))``: it stands for the raw keys
``0 .. i`` (and the lookahead after them). Requests that share a prefix of raw keys (agentic turns over one
growing context, sessions over one system prompt) share the chained keys of that prefix, so
:class:`ChainedKeys` keeps the raw and chained keys of earlier requests in lexicographic order of their raw keys:
the longest prefix a new request shares with any of them is the one it shares with a neighbour in that order.
"""
from __future__ import annotations

from bisect import bisect_left


def common_prefix(a: list, b: list) -> int:
    """Length of the longest common prefix of two lists (a bisection over C-speed slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def chain(raw: list, n: int, lookahead: int, tail: int, keys: list) -> list:
    """``keys`` (the first chained keys of ``raw``, already known) extended to ``n``; raw keys past the end of
    ``raw`` are ``tail`` (a lookahead past the keyed blocks)."""
    parent = keys[-1] if keys else 0
    for i in range(len(keys), n):
        nxt = () if not lookahead else (raw[i + 1] if i + 1 < len(raw) else tail,) * lookahead
        parent = hash((parent, raw[i], nxt))
        keys.append(parent)
    return keys


class ChainedKeys:
    """The chained keys of requests over raw key lists, for one lookahead (see the module docstring)."""

    def __init__(self, lookahead: int):
        self.lookahead = lookahead
        self.raw: list = []            # raw key lists, sorted; none is a prefix of the next
        self.chained: list = []        # their chained keys

    def keys(self, raw: list, n: int, tail: int) -> list:
        """The ``n`` chained keys of ``raw`` (one raw key past the ``n`` when the lookahead needs it)."""
        i = bisect_left(self.raw, raw)
        known: list = []
        for j in (i - 1, i):
            if 0 <= j < len(self.raw):
                same = common_prefix(raw, self.raw[j])
                if self.lookahead:     # key i also covers raw key i + 1 (past a request's raw keys: its own tail)
                    same -= 1
                if same > len(known):
                    known = self.chained[j][:min(same, n)]
        out = chain(raw, n, self.lookahead, tail, known)
        self._remember(i, raw, out)
        return out

    def _remember(self, i: int, raw: list, chained: list) -> None:
        """Insert at sorted position ``i``, replacing a predecessor that is a prefix of ``raw`` (or equal)."""
        prev = i - 1
        if i < len(self.raw) and self.raw[i] == raw:
            prev = i
        if prev >= 0 and len(self.raw[prev]) <= len(raw) and self.raw[prev] == raw[:len(self.raw[prev])]:
            self.raw[prev], self.chained[prev] = raw, chained
        else:
            self.raw.insert(i, raw)
            self.chained.insert(i, chained)
