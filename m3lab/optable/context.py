"""What every row formula of one engine step reads (:class:`StepContext`), and the quantised-GEMM rows helper:
shared by :mod:`m3lab.optable.builder` and the model-family rows of :mod:`m3lab.optable.families`."""
from __future__ import annotations

from dataclasses import dataclass

from m3lab.optable import ops
from m3lab.optable.counts import AttentionCounts, attention_counts
from m3lab.optable.dispatch import Dispatch
from m3lab.optable.routing import Routing
from m3lab.spec.model import ModelSpec
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.quant import QuantScheme
from m3lab.workload.step import EngineStep


@dataclass(frozen=True)
class StepContext:
    """Everything a layer's rows depend on, computed once per step."""

    model: ModelSpec
    plan: ParallelPlan
    quant: QuantScheme
    step: EngineStep
    counts: AttentionCounts
    routing: Routing | None
    topk_source: dict  # sparse layer -> layer whose top-k it uses
    dispatch: Dispatch | None = None

    @property
    def T(self) -> int:
        return self.step.num_tokens

    @property
    def phase(self) -> str:
        """The step's phase for the ops every token runs through: prefill when it has a prefill chunk."""
        return "prefill" if self.step.num_prefill_tokens else "decode"

    def parts(self) -> list[tuple[str | None, AttentionCounts, int, int]]:
        """(phase, counts, tokens, requests) of the attention kernels' launches: the whole step without a
        Dispatch; with one, the decode rows and the prefill chunks apart (vLLM launches their kernels apart)."""
        if self.dispatch is None:
            return [(None, self.counts, self.T, self.step.num_reqs)]
        sp, st = self.model.sparse, self.step
        out = []
        for phase, mask in (("decode", st.is_decode), ("prefill", ~st.is_decode)):
            if mask.any():
                cnt = attention_counts(st.new_tokens[mask], st.context_lens[mask], sp.block_size if sp else 0,
                                       sp.topk_blocks if sp else 0)
                out.append((phase, cnt, int(st.new_tokens[mask].sum()), int(mask.sum())))
        return out

    def runs(self, op: str, kind: str, phase: str | None) -> bool:
        return self.dispatch is not None and self.dispatch.runs(op, kind, phase or self.phase)


def gemm_rows(op: str, m: float, n: int, k: int, w_dtype: str, kind: str = "gemm") -> list[dict]:
    """A GEMM, preceded by its dynamic activation quantisation where the weights are quantised."""
    quant = [ops.act_quant(op, m, k, w_dtype)] if ops.needs_act_quant(w_dtype) else []
    return quant + [ops.gemm(op, m, n, k, w_dtype, kind=kind)]
