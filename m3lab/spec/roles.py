"""Prefill/decode disaggregation as part of a deployment (:class:`PDRoles`): instances per role, each role's
plan and scheduler limits, and the KV link between them.

A role's ``tp``/``ep`` and limits left ``None`` are the deployment's own (``Deployment.role_plan`` /
``Deployment.role_limits``). The KV link is named ``kv_link_gbps`` (GB/s per GPU, one NIC per GPU) everywhere.
``layout`` is each side's main-cache layout for the hand-off geometry (:mod:`m3lab.pd.geometry`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from m3lab.errors import M3LabError

KV_LINK_GBPS = 50.0   # assumed GB/s per GPU between prefill and decode nodes (one 400 Gb/s NIC per GPU)
ROLE_NAMES = ("prefill", "decode")


@dataclass(frozen=True)
class RoleSpec:
    """One side of a P/D deployment: ``instances`` replicas of ``tp`` x ``ep`` GPUs with their own limits."""

    instances: int = 0
    tp: int | None = None
    ep: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    layout: str = "triton"


@dataclass(frozen=True)
class PDRoles:
    """Disaggregated serving: off while both sides have no instances (prefill and decode colocated)."""

    prefill: RoleSpec = field(default_factory=RoleSpec)
    decode: RoleSpec = field(default_factory=RoleSpec)
    kv_link_gbps: float = KV_LINK_GBPS

    @property
    def enabled(self) -> bool:
        return self.prefill.instances > 0 or self.decode.instances > 0

    def validate(self) -> PDRoles:
        """Raise M3LabError naming the field; return self."""
        for role in ROLE_NAMES:
            r = getattr(self, role)
            for name in ("instances", "tp", "ep", "max_num_seqs", "max_num_batched_tokens"):
                v = getattr(r, name)
                if v is None:
                    continue
                least = 0 if name == "instances" else 1
                if not isinstance(v, int) or isinstance(v, bool) or v < least:
                    raise M3LabError(f"{role}_{name}={v!r} must be an integer >= {least}", field=f"{role}_{name}")
        if self.enabled and not (self.prefill.instances and self.decode.instances):
            raise M3LabError("a P/D deployment needs at least one prefill and one decode instance", field="pd",
                             hint="e.g. pd=2:1 (2 prefill, 1 decode)")
        k = self.kv_link_gbps
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not k > 0:
            raise M3LabError(f"kv_link_gbps={k!r} must be positive (GB/s per GPU)", field="kv_link_gbps")
        return self
