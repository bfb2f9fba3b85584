"""One GPU session for sparse attention and the indexer: their GPU gates (ours and vLLM's, bf16), then every
benchmark point.

``python -m m3lab.sessions.sparse --out DIR`` writes ``gates_cuda.csv``, ``sparse_attn.csv`` (rows,
m3lab.bench.sparse_attn), ``extra.csv`` and ``bench_log.txt`` into DIR.
"""
from __future__ import annotations

import time
from pathlib import Path

import typer

from ..bench import sparse_attn as sa
from ..bench.session_log import session_log
from .gate_phase import gate_phase

GATE_NAMES = "sparse.*,vllm.sparse*,vllm.index*,vllm.amd.*"


def main(out: str = "out", batches: str = ",".join(map(str, sa.BATCHES)), contexts: str = ",".join(map(str, sa.CONTEXTS)),
         q_rows: str = ",".join(map(str, sa.Q_ROWS)), deadline_s: float = 400.0, prefill: bool = True,
         gates: str = GATE_NAMES) -> None:
    """GPU gates of the sparse kernels into OUT/gates_cuda.csv, then every benchmark point (until ``deadline_s``
    from the benchmark's start) appended to OUT/sparse_attn.csv, extras to OUT/extra.csv."""
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    log = session_log(outdir / "bench_log.txt", time.time())
    if gates:
        gate_phase(outdir, gates.split(","), log)
    ints = lambda text: tuple(int(v) for v in text.split(","))  # noqa: E731
    sa.run(out, ints(batches), ints(contexts), ints(q_rows), deadline_s=deadline_s, prefill=prefill, log=log)


if __name__ == "__main__":
    typer.run(main)
