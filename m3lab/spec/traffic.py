"""The traffic a deployment serves (:class:`WorkloadSpec`): fixed lengths as ``vllm bench serve --dataset-name
random`` sends them, AgentX-like agentic sessions (:mod:`m3lab.cache.agentic`), or a recorded trace.

Defaults are the checklist's (8192 in / 1024 out at concurrency 32) and ``vllm bench serve``'s where it has one:
``num_prompts`` 1000 (``vllm/benchmarks/datasets/datasets.py`` ``DEFAULT_NUM_PROMPTS``) and an infinite request
rate (``vllm/benchmarks/serve.py`` ``--request-rate``: every request is sent at once and ``--max-concurrency``
bounds those in flight), here ``request_rate=None``.
"""
from __future__ import annotations

from dataclasses import dataclass

from m3lab.errors import M3LabError

WORKLOAD_KINDS = ("fixed", "agentx", "trace")
VLLM_BENCH_NUM_PROMPTS = 1000   # vllm/benchmarks/datasets/datasets.py DEFAULT_NUM_PROMPTS
#: The largest value each count takes (m3lab's bounds, not vLLM's): beyond them a simulation would run for hours
#: or exhaust memory before saying anything. Tokens per request are bounded first by the model's context
#: (:meth:`m3lab.spec.serving.Deployment.validate`); these hold for models whose context is unknown.
UPPER_BOUNDS = {"isl": 10_000_000, "osl": 10_000_000, "concurrency": 100_000, "num_prompts": 1_000_000,
                "sessions": 100_000}


def _positive_int(name: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise M3LabError(f"{name} must be a positive integer, got {v!r}", field=name)
    if v > UPPER_BOUNDS.get(name, v):
        raise M3LabError(f"{name}={v:,} is beyond m3lab's limit of {UPPER_BOUNDS[name]:,}", field=name,
                         hint=f"use at most {UPPER_BOUNDS[name]:,}")


@dataclass(frozen=True)
class WorkloadSpec:
    """What the clients send: ``kind`` fixed (``isl``/``osl`` tokens per request), agentx (``sessions``
    AgentX-like sessions from ``seed``) or trace (a Mooncake JSONL file at ``trace``); ``concurrency`` requests
    (sessions) in flight, ``num_prompts`` requests in all, ``request_rate`` req/s (None: all at once)."""

    kind: str = "fixed"
    isl: int = 8192
    osl: int = 1024
    concurrency: int = 32
    num_prompts: int = VLLM_BENCH_NUM_PROMPTS
    request_rate: float | None = None
    sessions: int | None = None       # agentx: sessions generated (None: one per concurrency slot)
    trace: str | None = None          # trace: path of the Mooncake JSONL file
    seed: int = 0

    def validate(self) -> WorkloadSpec:
        """Raise M3LabError naming the field; return self."""
        if self.kind not in WORKLOAD_KINDS:
            raise M3LabError(f"workload {self.kind!r} is unknown", field="workload",
                             hint=f"use one of {', '.join(WORKLOAD_KINDS)}")
        for name in ("isl", "osl", "concurrency", "num_prompts"):
            _positive_int(name, getattr(self, name))
        if self.sessions is not None:
            _positive_int("sessions", self.sessions)
        if self.request_rate is not None and (isinstance(self.request_rate, bool)
                                              or not isinstance(self.request_rate, (int, float))
                                              or not self.request_rate > 0):
            raise M3LabError(f"request_rate={self.request_rate!r} must be a positive number (req/s)",
                             field="request_rate", hint="None (or inf) sends every request at once, as vllm bench")
        if (self.kind == "trace") != (self.trace is not None):
            raise M3LabError("a trace workload needs trace=PATH, and trace=PATH needs workload=trace", field="trace")
        return self


def check_context(model, isl: int, osl: int = 0, max_model_len: int | None = None) -> None:
    """Raise M3LabError (field ``isl``) when a request of ``isl`` + ``osl`` tokens is longer than the context vLLM
    serves ``model`` (a :class:`~m3lab.spec.model.ModelSpec`) with: ``max_model_len``, else the model's
    ``max_position_embeddings`` (vLLM rejects a longer request); nothing when neither is known."""
    limit = max_model_len or model.max_position
    if limit and isl + osl > limit:
        source = "--max-model-len" if max_model_len else "max_position_embeddings"
        tokens = f"isl + osl = {isl + osl:,} tokens" if osl else f"isl = {isl:,} tokens"
        raise M3LabError(f"{tokens} is longer than {model.name}'s context of {limit:,} tokens ({source})",
                         field="isl", hint=f"keep {'isl + osl' if osl else 'isl'} at most {limit:,}")
