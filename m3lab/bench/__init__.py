"""Kernel benchmarks: graph-replayed timing, the long-format result table, per-op entry points."""
