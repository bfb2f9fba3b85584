"""Who sends what when in an agentic run: sessions of turns over a :class:`~m3lab.cache.trace.Trace`.

:class:`Sessions` feeds a :class:`~m3lab.serving.timed_engine.TimedEngine` (closed loop over sessions):

- at most ``concurrency`` sessions are active; when one ends (all its requests finished) the next starts, its
  first requests arriving at their offsets from the session's first arrival in the trace;
- a request that waits on another (``Trace.after``: the next turn, or the parent after a blocking subagent)
  arrives ``think_s`` after that one's last token reached the client;
- ``open_loop=True`` ignores sessions and sends every request at its own trace time (``arrival_s``).

``arrived`` keeps each request's arrival time (s), the start of its TTFT.
"""
from __future__ import annotations

import numpy as np

from m3lab.cache.trace import Trace


class Sessions:
    """The agentic client of one run (see the module docstring)."""

    def __init__(self, trace: Trace, concurrency: int, *, open_loop: bool = False):
        self.trace, self.concurrency, self.open_loop = trace, concurrency, open_loop
        n = len(trace)
        self.arrived = np.full(n, np.nan)
        self.finished = 0
        self.active_s: list = []                  # (time, active sessions) after each change
        self._children: dict = {}
        for i in np.flatnonzero(trace.after >= 0):
            self._children.setdefault(int(trace.after[i]), []).append(int(i))
        self._left = np.bincount(trace.session) if n else np.zeros(0, np.int64)
        firsts: dict = {}
        for i in range(n):
            firsts.setdefault(int(trace.session[i]), i)
        self._order = sorted(firsts, key=lambda s: (trace.arrival_s[firsts[s]], firsts[s]))
        self._next = self._active = 0

    def start(self, engine) -> None:
        """The requests that arrive without waiting on another: the first sessions' (or all, open loop)."""
        if self.open_loop:
            for i in range(len(self.trace)):
                self._send(engine, float(self.trace.arrival_s[i]), i)
        else:
            self._start_sessions(engine, 0.0)

    def _send(self, engine, t: float, rid: int) -> None:
        self.arrived[rid] = t
        engine.push(t, rid)

    def _start_sessions(self, engine, t: float) -> None:
        tr = self.trace
        while self._active < self.concurrency and self._next < len(self._order):
            s = self._order[self._next]
            self._next += 1
            self._active += 1
            roots = np.flatnonzero((tr.session == s) & (tr.after < 0))
            t0 = float(tr.arrival_s[roots].min())
            for i in roots.tolist():
                self._send(engine, t + float(tr.arrival_s[i]) - t0, i)
        self.active_s.append((t, self._active))

    def on_finished(self, engine, rid: int, t: float) -> None:
        """Request ``rid``'s last token reached the client at ``t``: its waiting turns think, then arrive."""
        tr = self.trace
        self.finished += 1
        for c in self._children.get(rid, ()):
            self._send(engine, t + float(tr.think_s[c]), c)
        s = int(tr.session[rid])
        self._left[s] -= 1
        if self._left[s] == 0 and not self.open_loop:
            self._active -= 1
            self._start_sessions(engine, t)

    @property
    def done(self) -> bool:
        return self.finished >= len(self.trace)

    def tail_share(self, end_s: float) -> float:
        """Share of the run (to ``end_s``) with fewer than ``concurrency`` active sessions, after they first
        were (the run's tail once the sessions run out)."""
        if self.open_loop or not self.active_s:
            return 0.0
        times = [t for t, a in self.active_s if a < self.concurrency and t > 0]
        return (end_s - min(times)) / end_s if times and end_s > 0 else 0.0
