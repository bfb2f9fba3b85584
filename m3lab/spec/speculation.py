"""Speculative decoding's acceptance (:class:`SpecAcceptance`): what the traffic yields, with where it comes from.

The launch side (method, draft tokens, draft checkpoint) is vLLM's ``--speculative-config``, held by
:class:`~m3lab.spec.switches.ServingConfig` (``spec_method``, ``spec_tokens``, ``spec_model``). The mean
acceptance length depends on the traffic as much as on the draft, so the record names the traffic it was
measured on (``accept_dataset``): a chat-benchmark value (MT-Bench, GSM8K) is refused for agentic traffic unless
the user marks it assumed. Published acceptance lengths: :data:`m3lab.serving.speculation.PUBLISHED_ACCEPTANCE`.
"""
from __future__ import annotations

from dataclasses import dataclass

from m3lab.errors import M3LabError

DRAFT_COST = 0.05   # assumed: EAGLE3 draft step / target decode step (~1 dense layer + LM head of M3's 60 layers)
ASSUMED = "assumed"
AGENTIC_DATASETS = ("agentic", ASSUMED)   # acceptances an agentic workload may use


@dataclass(frozen=True)
class SpecAcceptance:
    """Mean tokens emitted per verification step (vLLM's acceptance length, bonus token included), the traffic
    it was measured on, and the draft model's cost per draft token as a fraction of a target decode step."""

    accept_len: float | None = None
    accept_dataset: str = ASSUMED      # e.g. MT-Bench, GSM8K, agentic, or assumed
    draft_cost: float = DRAFT_COST

    def validate(self, spec_tokens: int, workload_kind: str) -> SpecAcceptance:
        """Check against the draft length and the traffic; raise M3LabError naming the field; return self."""
        a = self.accept_len
        if not spec_tokens:
            if a not in (None, 1, 1.0):
                raise M3LabError("accept_len needs speculative decoding (spec_tokens > 0)", field="accept_len",
                                 hint="set spec_method and spec_tokens, or drop accept_len")
            return self
        if a is not None and (isinstance(a, bool) or not isinstance(a, (int, float))
                              or not 1 <= a <= spec_tokens + 1):
            raise M3LabError(f"accept_len={a!r} must lie in [1, spec_tokens + 1 = {spec_tokens + 1}]",
                             field="accept_len", hint="vLLM's mean acceptance length counts the bonus token")
        if not isinstance(self.draft_cost, (int, float)) or not self.draft_cost >= 0:
            raise M3LabError(f"draft_cost={self.draft_cost!r} must be >= 0", field="draft_cost")
        if a is not None and workload_kind != "fixed" and self.accept_dataset.lower() not in AGENTIC_DATASETS:
            raise M3LabError(f"accept_len {a} was measured on {self.accept_dataset}, not on agentic traffic",
                             field="accept_dataset",
                             hint="give an agentic acceptance (accept_dataset=agentic) or mark it "
                                  "accept_dataset=assumed")
        return self

    def source(self) -> str | None:
        """How the acceptance length is known, in words (None without one)."""
        if self.accept_len is None:
            return None
        return ASSUMED if self.accept_dataset.lower() == ASSUMED else f"measured on {self.accept_dataset}"
