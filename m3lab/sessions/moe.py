"""One GPU session for the grouped MoE: gates, tuning of the bf16 table, then every provider side by side.

``python -m m3lab.sessions.moe --out DIR [--phases gates,tune,bench] [--deadline-s 520]`` writes into DIR:
``gates_cuda.csv`` (moe.* and vllm.* gates), ``moe_tune.csv`` (every tuning timing), the tuned table in vLLM's
format (``E=..,N=..,device_name=...json`` + ``.m3lab.json``, also in ``moe_configs.json``), ``moe.csv`` (benchmark
rows, m3lab.bench.moe), ``log.txt``.
"""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import typer

from ..bench import moe as bm
from ..bench.session_log import session_log
from ..tune import moe as tm
from .gate_phase import gate_phase

GATE_NAMES = ("moe.*", "vllm.*")


def main(out: str = "out", phases: str = "gates,tune,bench", deadline_s: float = 520.0, tune_until_s: float = 300.0,
         providers: str = ",".join(bm.PROVIDERS), ts: str = ",".join(map(str, bm.TS)),
         tune_ts: str = ",".join(map(str, tm.TUNE_TS)), rep_ms: float = 40.0) -> None:
    """Gates (moe.*, vllm.*) on the GPU, tuning of the bf16 table, then every provider side by side."""
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log = session_log(outdir / "log.txt", t0)
    todo = phases.split(",")
    if "gates" in todo:
        gate_phase(outdir, list(GATE_NAMES), log)
    if "tune" in todo:
        ts_ = tuple(int(v) for v in tune_ts.split(","))
        trials = tm.tune_table(ts_, budget_s=tune_until_s - (time.time() - t0), outdir=outdir, log=log,
                               precompile_first=False)
        pd.DataFrame(trials).to_csv(outdir / "moe_tune.csv", index=False)
    if "bench" in todo:
        bm.run(out, providers.split(","), tuple(int(v) for v in ts.split(",")), deadline_s=deadline_s - 20
               - (time.time() - t0), rep_ms=rep_ms, log=log)
    log(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    typer.run(main)
