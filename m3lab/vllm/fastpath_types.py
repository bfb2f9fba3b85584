"""The records of the fast-path resolver: a condition with its value, a decision per op, the platform probes.

Kept apart from :mod:`m3lab.vllm.fastpaths` (the entry point) and :mod:`m3lab.vllm.fastpath_rules` (the rules)
so that both import them without importing each other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from m3lab.errors import M3LabError
from m3lab.vllm.cite import Cite

STATUSES = ("runs", "off", "refused", "skipped")
LAYER_KINDS = ("dense", "sparse", "sparse_reuse", "model")


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
class Decision:
    """What vLLM does for one op on one kind of layer."""

    op: str
    layer_kind: str
    decision: str                 # reference-note label: A1..A8, G1..G3, M1..M3, N1..N4
    path: str                     # short name of the path taken
    kernels: tuple[str, ...]      # kernel (or library entry) names it launches
    checks: tuple[Check, ...]
    decided_by: Cite
    status: str = "runs"
    note: str = ""
    shape: str = ""               # local GEMM shape (M, N, K) or similar, when it decides

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "layer_kind": self.layer_kind, "decision": self.decision, "path": self.path,
                "kernels": list(self.kernels), "status": self.status, "note": self.note, "shape": self.shape,
                "decided_by": str(self.decided_by), "checks": [c.to_dict() for c in self.checks]}


@dataclass(frozen=True)
class Platform:
    """What vLLM's platform probes would answer on this hardware (``vllm/platforms``)."""

    kind: str          # "rocm" | "cuda"
    arch: str          # "gfx950", "gfx942", "sm_90", "sm_100"
    compute_units: int

    @classmethod
    def of(cls, hardware) -> Platform:
        vendor = (hardware.vendor or "").lower()
        if vendor not in ("amd", "nvidia") or not hardware.arch:
            raise M3LabError(f"hardware {hardware.name!r} has no vendor/arch the resolver knows",
                             field="hardware", hint="profiles need vendor: amd|nvidia and arch: gfx950|gfx942|sm_90|sm_100")
        return cls("rocm" if vendor == "amd" else "cuda", hardware.arch, int(hardware.compute_units or 0))

    @property
    def rocm(self) -> bool:
        return self.kind == "rocm"

    @property
    def gfx950(self) -> bool:  # vllm.platforms.rocm.on_gfx950
        return self.arch == "gfx950"

    @property
    def gfx9(self) -> bool:
        return self.rocm and self.arch.startswith("gfx9")

    @property
    def cdna(self) -> int:  # vllm.platforms.rocm.get_cdna_version
        return {"gfx942": 3, "gfx950": 4}.get(self.arch, 0)

    @property
    def aiter_supported(self) -> bool:
        """``is_aiter_found_and_supported``: ROCm, CDNA >= 3, aiter installed (assumed on a ROCm vLLM image)."""
        return self.rocm and self.cdna > 2

    @property
    def supports_mx(self) -> bool:  # RocmPlatform.supports_mx: gfx95x
        return self.gfx950

    @property
    def sm(self) -> int:
        return int(self.arch.removeprefix("sm_")) if self.arch.startswith("sm_") else 0
