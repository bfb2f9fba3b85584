"""The registry of correctness gates: named gates, each producing cases for a device.

A :class:`Case` is one kernel call with its reference: ``run()`` poisons the kernel's output,
runs kernel and reference on fresh random inputs and returns ``(out, ref)``; the runner scores it
with :func:`m3lab.gates.checks.rel_rms` against the tolerance of ``dtype``. A case may instead
return an exact-match pair (``exact=True``: integer codes must be bit-identical).
"""
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

# Modules that register gates on import. MoE and sparse-attention gates add their module here.
GATE_MODULES = ("m3lab.gates.mx", "m3lab.gates.gemm", "m3lab.gates.moe", "m3lab.gates.vllm_act", "m3lab.gates.sparse",
                "m3lab.gates.vllm_sparse", "m3lab.gates.vllm_gemm")


@dataclass(frozen=True)
class Case:
    """One kernel call vs its reference."""
    name: str                                               # e.g. "M=7,N=80,K=96,kernel=splitk"
    dtype: str                                              # tolerance key: "float32" | "float16" | "bfloat16"
    run: Callable[[], tuple[torch.Tensor, torch.Tensor]]    # -> (kernel out, reference out)
    exact: bool = False                                     # codes: bit-identical or fail
    finding: Callable[[], str] | None = None                # after run(): a documented difference, with its size


@dataclass(frozen=True)
class Gate:
    """A named correctness gate: ``cases(device)`` yields the calls to check on that device."""
    name: str                                               # e.g. "gemm.mxfp4"
    op: str                                                 # op name in traces/bench/<op>.csv
    cases: Callable[[torch.device], Iterable[Case]]
    doc: str = ""


_GATES: dict[str, Gate] = {}


def register(gate: Gate) -> Gate:
    """Add (or replace) a gate by name."""
    _GATES[gate.name] = gate
    return gate


def all_gates() -> dict[str, Gate]:
    """Every registered gate (importing GATE_MODULES on first use)."""
    for mod in GATE_MODULES:
        importlib.import_module(mod)
    return dict(_GATES)
