"""What :class:`~m3lab.workload.engine_core.EngineCore` keeps per request (:class:`Req`, vLLM's ``Request`` as
scheduling reads it) and per ``schedule()`` call (:class:`Batch`), with the request statuses."""
from __future__ import annotations

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3


class Req:
    """One request's scheduling state (the fields of vLLM's ``Request`` that scheduling reads)."""

    __slots__ = ("rid", "P", "M", "O", "C", "spec", "ph", "inflight", "stale", "prefill_chunk", "status",
                 "preemptions", "verifies", "keys", "first_step", "external", "draws")

    def __init__(self, rid: int, prompt: int, max_tokens: int, keys: list, external: int = 0):
        self.rid, self.P, self.M, self.keys, self.external = rid, prompt, max_tokens, keys, external
        self.O = self.C = self.spec = self.ph = self.inflight = self.stale = self.preemptions = self.verifies = 0
        self.prefill_chunk, self.status, self.first_step = True, WAITING, -1
        self.draws: list = []          # the fake model's accepted drafts (of k) per verify number, drawn ahead


class Batch:
    """One ``schedule()`` call: ``reqs`` [(request, tokens, drafts verified)] in vLLM's order and the fake
    model's token counts (0 for a partial prefill chunk), its :class:`StepRecord` (None when it neither
    scheduled nor preempted anything); ``executed``: it scheduled tokens; ``done``: its outputs are applied."""

    __slots__ = ("reqs", "counts", "record", "executed", "done")

    def __init__(self, reqs, counts, record):
        self.reqs, self.counts, self.record, self.done = reqs, counts, record, False
        self.executed = bool(reqs)
