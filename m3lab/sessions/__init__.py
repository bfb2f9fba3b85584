"""GPU sessions: one device call each, as thin scripts over the benchmark runners (m3lab.bench), the tuners
(m3lab.tune), the gates (m3lab.gates, m3lab.bench.perf_gate) and the analysis of their rows (m3lab.bench_analysis).

``python -m m3lab.sessions.<name> --out DIR``: :mod:`.gemm` (GEMM: self-check, tuning, benchmark, baseline,
gates), :mod:`.peers` (every peer at its best in rounds, perf baseline, every gate), :mod:`.moe` and
:mod:`.sparse` (that op's gates, then its tuner and runner). Every phase is guarded: a failure is logged and
the next phase runs, so a cut session keeps what finished.
"""
