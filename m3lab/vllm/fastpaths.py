"""Which code vLLM 0.33.0 runs for each op of MiniMax M3, for a deployment and a step: the fast-path resolver.

``resolve(deployment, tokens=32)`` answers, for each op of a dense layer and of a sparse layer (computing
its top-k, and reusing it under index sharing) and for the LM head: the path vLLM takes, the kernels it
launches, every condition with its value, and the vLLM function (file:line) that decides it. The rules
(``m3lab.vllm.fastpath_rules``) mirror vLLM's dispatch code, cited with :class:`~m3lab.vllm.cite.Cite`;
where vLLM's deciding function is pure it is called (the MXFP8 linear tile, the skinny-GEMM CU budget,
the monokernel refusal list). Decisions are labelled in the reference note's terms (A1-A8, G1-G3, M1-M3,
N1-N4).

Outcomes: ``runs`` (the path taken), ``off`` (a requested path vLLM quietly turns off, with why),
``refused`` (vLLM raises at start-up: the deployment does not serve; the CLI exits 2), ``skipped``
(the op does not run on this layer kind, e.g. the indexer of an index-sharing reuse layer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from m3lab.errors import M3LabError
from m3lab.spec.serving import Deployment
from m3lab.vllm import fastpath_rules as rules
from m3lab.vllm.fastpath_types import Check, Decision, Platform

__all__ = ["Check", "Decision", "Platform", "Resolution", "resolve", "PHASES"]
PHASES = ("decode", "prefill")


@dataclass
class Resolution:
    """Every decision for one deployment and step, plus what vLLM refuses or turns off."""

    deployment: Deployment
    tokens: int
    phase: str
    platform: Platform
    decisions: list[Decision] = field(default_factory=list)

    @property
    def refused(self) -> list[Decision]:
        return [d for d in self.decisions if d.status == "refused"]

    @property
    def turned_off(self) -> list[Decision]:
        return [d for d in self.decisions if d.status == "off"]

    @property
    def ok(self) -> bool:
        """False when vLLM refuses this deployment at start-up."""
        return not self.refused

    def decision(self, op: str, layer_kind: str = "sparse") -> Decision:
        """The decision for ``op`` on ``layer_kind`` (falls back to the model-level row)."""
        for d in self.decisions:
            if d.op == op and d.layer_kind in (layer_kind, "model"):
                return d
        raise KeyError(f"no decision for {op!r} on {layer_kind!r}")

    def table(self):
        """One row per decision: op, layer_kind, decision, status, path, kernels, conditions, decided_by, note."""
        import pandas as pd
        rows = [{"op": d.op, "layer_kind": d.layer_kind, "decision": d.decision, "status": d.status,
                 "path": d.path, "kernels": ", ".join(d.kernels), "shape": d.shape,
                 "conditions": "; ".join(f"{c.name}={c.value}{'' if c.holds else ' (fails)'}" for c in d.checks),
                 "decided_by": str(d.decided_by), "note": d.note} for d in self.decisions]
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        d = self.deployment
        env, args = d.to_vllm()
        return {"deployment": d.name or "custom", "model": d.model.name, "hardware": d.hardware.name,
                "platform": {"kind": self.platform.kind, "arch": self.platform.arch},
                "plan": d.plan.describe(), "quant": d.quant.name, "kv_dtype": d.quant.kv_dtype,
                "index_dtype": d.quant.index_dtype, "tokens": self.tokens, "phase": self.phase,
                "vllm_env": env, "vllm_args": args, "ok": self.ok,
                "refused": [x.to_dict() for x in self.refused], "turned_off": [x.to_dict() for x in self.turned_off],
                "decisions": [x.to_dict() for x in self.decisions]}


def resolve(deployment: Deployment, tokens: int = 32, phase: str = "decode") -> Resolution:
    """Resolve every op of the deployment's dense and sparse layers for one step of ``tokens`` tokens.

    ``phase="decode"``: ``tokens`` decode rows (requests x (1 + speculative tokens)); ``"prefill"``: one
    prefill chunk of ``tokens`` tokens.

    >>> from m3lab.spec.serving import load_preset
    >>> r = resolve(load_preset("mxfp8-tp4-optimised"), tokens=32)
    >>> r.decision("attention").path
    'aiter_sparse_pa'
    """
    if not isinstance(tokens, int) or tokens < 1:
        raise M3LabError(f"tokens must be a positive integer, got {tokens!r}", field="--tokens")
    if phase not in PHASES:
        raise M3LabError(f"phase {phase!r} is not one of {', '.join(PHASES)}", field="--phase")
    model = deployment.model
    if model.sparse is None or model.sparse.style != "block":
        raise M3LabError(f"the resolver knows MiniMax M3's code paths; {model.name!r} is not an M3 model",
                         field="--model", hint="use minimax-m3 or minimax-m3-mxfp8")
    res = Resolution(deployment=deployment.validate(), tokens=tokens, phase=phase,
                     platform=Platform.of(deployment.hardware))
    res.decisions = rules.all_decisions(res.deployment, res.platform, tokens, phase)
    return res
