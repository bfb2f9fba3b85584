"""Routing models: how many tokens each expert of a grouped GEMM receives, without simulating tokens.

A routing model gives, per routed expert e, the probability ``q[e]`` that a token selects it (sum over experts
= top-k). From it, for T tokens: expected tokens per expert ``T * q``, expected experts touched
``sum(1 - (1 - q)^T)`` (their weights are what a decode step must read) and the most popular expert's mean load.
Everything is vectorised over an array of token counts, so a long workload is handled per distinct T,
never per step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from m3lab.errors import M3LabError


@dataclass(frozen=True)
class Routing:
    """Per-expert selection probabilities ``q`` ([experts], sums to ``topk``); ``name`` says where from."""

    name: str
    q: np.ndarray
    topk: int

    @property
    def experts(self) -> int:
        return int(self.q.shape[0])

    def local(self, ep: int, rank: int = 0) -> np.ndarray:
        """Selection probabilities of the routed experts held by ``rank`` out of ``ep``."""
        per = self.experts // ep
        return self.q[rank * per:(rank + 1) * per]

    def counts(self, tokens, ep: int = 1, rank: int = 0) -> np.ndarray:
        """Expected tokens per local expert: [len(tokens), experts/ep] (float)."""
        t = np.atleast_1d(np.asarray(tokens, dtype=np.float64))
        return t[:, None] * self.local(ep, rank)[None, :]

    def routed_tokens(self, tokens, ep: int = 1, rank: int = 0) -> np.ndarray:
        """Expected (token, expert) pairs landing on the local experts: [len(tokens)]."""
        return np.atleast_1d(np.asarray(tokens, dtype=np.float64)) * self.local(ep, rank).sum()

    def active_experts(self, tokens, ep: int = 1, rank: int = 0) -> np.ndarray:
        """Expected local experts that receive at least one token: [len(tokens)]."""
        t = np.atleast_1d(np.asarray(tokens, dtype=np.float64))
        q = np.clip(self.local(ep, rank), 0.0, 1.0)
        return (1.0 - np.power(1.0 - q[None, :], t[:, None])).sum(axis=1)

    def max_load(self, tokens, ep: int = 1, rank: int = 0) -> np.ndarray:
        """Mean load of the most popular local expert, T * max(q): [len(tokens)]. Sampling noise is not
        included (at small T the busiest expert of a real batch carries more; see ``counts`` draws)."""
        return np.atleast_1d(np.asarray(tokens, dtype=np.float64)) * self.local(ep, rank).max()


def _cap(w: np.ndarray, topk: int) -> np.ndarray:
    """Scale weights to sum ``topk`` with every probability <= 1 (water-filling)."""
    q = np.zeros_like(w)
    free = np.ones(w.shape, dtype=bool)
    budget = float(topk)
    for _ in range(w.size):
        q[free] = w[free] / w[free].sum() * budget
        over = free & (q > 1.0)
        if not over.any():
            break
        q[over] = 1.0
        budget -= over.sum()
        free &= ~over
    return q


def balanced(experts: int, topk: int) -> Routing:
    """Every expert equally likely: q = topk / experts."""
    _check(experts, topk)
    return Routing("balanced", np.full(experts, topk / experts), topk)


def zipf(experts: int, topk: int, s: float = 1.0) -> Routing:
    """Skewed: expert e chosen in proportion to (e + 1)^-s (s = 0 is balanced); expert 0 is the hottest."""
    _check(experts, topk)
    if s < 0:
        raise M3LabError(f"zipf parameter must be >= 0, got {s}", field="zipf_s")
    w = np.power(np.arange(1, experts + 1, dtype=np.float64), -float(s))
    return Routing(f"zipf(s={s:g})", _cap(w, topk), topk)


def recorded(counts, topk: int, name: str = "recorded") -> Routing:
    """From recorded router statistics: tokens per expert ([experts], or [layers, experts] averaged)."""
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim == 2:
        c = c.mean(axis=0)
    if c.ndim != 1 or c.size == 0 or (c < 0).any() or c.sum() <= 0:
        raise M3LabError("recorded routing counts must be a non-negative [experts] array with a positive sum",
                         field="counts")
    _check(c.size, topk)
    return Routing(name, _cap(c, topk), topk)


def _check(experts: int, topk: int) -> None:
    if experts <= 0 or topk <= 0 or topk > experts:
        raise M3LabError(f"routing needs 0 < topk ({topk}) <= experts ({experts})", field="topk")


def make_routing(spec, experts: int, topk: int) -> Routing:
    """``None``/"balanced", "zipf:S", a float (Zipf s), a :class:`Routing`, or an array of recorded counts."""
    if isinstance(spec, Routing):
        if spec.experts != experts:
            raise M3LabError(f"routing has {spec.experts} experts, model has {experts}", field="routing")
        return spec
    if spec is None or spec == "balanced":
        return balanced(experts, topk)
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return zipf(experts, topk, float(spec))
    if isinstance(spec, str) and spec.startswith("zipf"):
        try:
            s = float(spec.split(":", 1)[1]) if ":" in spec else 1.0
        except ValueError:
            raise M3LabError(f"routing {spec!r}: write zipf:S with a number S", field="routing") from None
        return zipf(experts, topk, s)
    if isinstance(spec, (list, tuple, np.ndarray)):
        return recorded(spec, topk)
    raise M3LabError(f"unknown routing {spec!r}", field="routing", hint="balanced, zipf:S, or recorded counts")
