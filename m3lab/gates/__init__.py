"""Checklist step 5, gates: every kernel against its reference (the perf gates, which re-time benchmarks against a
baseline, are m3lab.bench.perf_gate).

``run_gates(device)`` -> one DataFrame of results; ``m3lab gate`` turns it (with the perf gates) into one exit code.
Kernels plug in by adding a module to :data:`m3lab.gates.registry.GATE_MODULES` that calls
:func:`m3lab.gates.registry.register` (see m3lab/gates/gemm.py for the pattern).
"""
from .registry import Case, Gate, all_gates, register
from .runner import run_gates

__all__ = ["Case", "Gate", "all_gates", "register", "run_gates"]
