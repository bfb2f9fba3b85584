"""The records of the fast-path resolver: a condition with its value, typed local shapes, a decision per op.

Kept apart from :mod:`m3lab.vllm.fastpaths` (the entry point) and :mod:`m3lab.vllm.decide` (the decisions)
so that both import them without importing each other. Everything here is plain data (it crosses the
worker-process boundary of :mod:`m3lab.vllm.workers`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from m3lab.vllm.cite import Cite


@dataclass(frozen=True)
class Check:
    """One condition of a decision: what vLLM tests, the value here, whether it holds, where it is tested."""

    name: str
    value: Any
    holds: bool
    cite: Cite | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "holds": self.holds,
                "cite": str(self.cite) if self.cite else None}


@dataclass(frozen=True)
class GemmShape:
    """A GEMM's local (per-rank) shape: ``x[m, k] @ w[n, k].T``."""

    m: int
    n: int
    k: int

    def __str__(self) -> str:
        return f"M={self.m} N={self.n} K={self.k}"

    def to_dict(self) -> dict[str, int]:
        return {"m": self.m, "n": self.n, "k": self.k}


@dataclass(frozen=True)
class ExpertShape:
    """The local grouped GEMM of the experts: rows (routed + fused shared), experts per token, width."""

    experts: int
    topk: int
    inter: int

    def __str__(self) -> str:
        return f"{self.experts} experts, top-{self.topk}, intermediate {self.inter}"

    def to_dict(self) -> dict[str, int]:
        return {"experts": self.experts, "topk": self.topk, "inter": self.inter}


@dataclass(frozen=True)
class Decision:
    """What vLLM does for one op on one kind of layer.

    ``path``: a short id (stable: cost tables key on it; :mod:`m3lab.vllm.fastpaths` lists them);
    ``vllm``: what vLLM's code returned (a class, a backend, a flag), as text; ``how``: ``executed`` when
    vLLM's code decided under the emulated platform, ``restated`` when m3lab states the rule;
    ``decided_by``: the vLLM code that decided.
    """

    op: str
    layer_kind: str               # dense | sparse | sparse_reuse | model
    decision: str                 # reference-note label: A1..A8, G1..G3, M1..M3, N1..N4
    path: str                     # short id of the path taken
    kernels: tuple[str, ...]      # kernel (or library entry) names it launches
    checks: tuple[Check, ...]
    decided_by: Cite
    status: str = "runs"          # runs | off | refused | skipped
    note: str = ""
    shape: GemmShape | ExpertShape | None = None
    how: str = "executed"         # executed (vLLM's code decided) | restated (m3lab states the rule)
    vllm: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "layer_kind": self.layer_kind, "decision": self.decision, "path": self.path,
                "how": self.how, "vllm": self.vllm, "kernels": list(self.kernels), "status": self.status,
                "note": self.note, "shape": str(self.shape) if self.shape else "",
                "shape_values": self.shape.to_dict() if self.shape else None,
                "decided_by": str(self.decided_by), "checks": [c.to_dict() for c in self.checks]}
