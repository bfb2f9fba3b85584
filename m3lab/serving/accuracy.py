"""How far m3lab's calibrated estimates land from every end-to-end measurement the repository ships.

Each measured run is estimated as exactly the deployment it ran (nothing is fitted to these runs: they are the
test set):

- the vLLM team's MiniMax M3 MXFP8 TP4 run at 8K / 1K, concurrency 32 on MI355X, before its optimisations (vLLM's
  defaults, :data:`m3lab.published.HEADLINE_PRESETS`) and after them (published, :mod:`m3lab.published`);
- the InferenceX runs of Qwen3.5-397B-A17B and GLM-5.2 on MI355X (measured by others, shipped under
  ``m3lab/serving/data``, estimated by :mod:`m3lab.serving.samples`).

:func:`accuracy_table` has one row per (run, metric) with ``estimate_over_measured``; :func:`band_line` is the
one line ``m3lab estimate`` prints under every estimate. The band is recomputed whenever m3lab's code or data
change, and kept on disk under ``$M3LAB_CACHE_DIR/accuracy`` (default ``~/.cache/m3lab``; ``off`` disables it).
"""
from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Callable

import pandas as pd

from m3lab.published import HEADLINE_PRESETS, headline_deployment, measurement_for
from m3lab.serving.dispatch import CACHE_ENV, resolver_fingerprint
from m3lab.serving.estimate import METRICS, estimate
from m3lab.serving.samples import samples_side_by_side
from m3lab.serving.vllm_bench import SHIPPED_BENCH

#: the metrics of the band, as ``m3lab estimate`` names them in its one line
SHORT = {"output_tokens_per_s_per_gpu": "tok/s/GPU", "ttft_s": "TTFT", "tpot_ms": "TPOT"}
_KEY_OF = {metric: key for metric, _, key in METRICS}


def accuracy_table(calibration="default", progress: Callable | None = None) -> pd.DataFrame:
    """One row per (measured run, metric): ``run``, ``measured_by``, ``metric``, ``unit``, ``measured``,
    ``estimate`` (calibrated, projected for the run's hardware) and ``estimate_over_measured``; every run the
    repository ships, each beside the estimate of its own deployment. ``progress(done, total, what)``: called
    before each run is estimated."""
    update = progress or (lambda done, total, what="": None)
    total = len(HEADLINE_PRESETS) + len(SHIPPED_BENCH)
    rows = []
    for i, case in enumerate(HEADLINE_PRESETS):
        update(i, total, f"M3 {case}")
        d = headline_deployment(case)
        found = measurement_for(d)
        est = estimate(d, calibration=calibration)
        for metric, unit, key in METRICS:
            rows.append({"run": f"MiniMax M3 MXFP8 TP4 c=32, {case} ({found['preset']})",
                         "measured_by": "published: vLLM team, MI355X", "metric": metric, "unit": unit,
                         "measured": found["figures"][key], "estimate": est.results[est.kind][key]})
    update(len(HEADLINE_PRESETS), total, "InferenceX runs")
    side = samples_side_by_side(calibration)
    for r in side.itertuples():
        rows.append({"run": f"{r.model_id} TP4 c={r.concurrency} + MTP", "measured_by": "InferenceX, MI355X",
                     "metric": r.metric, "unit": r.unit, "measured": r.measured, "estimate": r.calibrated})
    table = pd.DataFrame(rows)
    table["estimate_over_measured"] = table["estimate"] / table["measured"]
    return table


def band(table: pd.DataFrame) -> dict:
    """``{metric key: [lowest, highest] estimate_over_measured}`` over the runs of ``table`` plus ``runs``."""
    out = {"runs": int(table["run"].nunique())}
    for metric, ratios in table.groupby("metric", sort=False)["estimate_over_measured"]:
        out[_KEY_OF[metric]] = [float(ratios.min()), float(ratios.max())]
    return out


def band_line(b: dict) -> str:
    """The band as one line: ``accuracy over 4 shipped runs, estimate/measured: tok/s/GPU 0.99–2.33×, ...``."""
    parts = [f"{SHORT[k]} {lo:.2f}–{hi:.2f}×" for k, (lo, hi) in ((k, b[k]) for k in SHORT if k in b)]
    return f"accuracy over {b['runs']} shipped runs, estimate/measured: " + ", ".join(parts)


def _cache_file() -> Path | None:
    root = os.environ.get(CACHE_ENV, "")
    if root.lower() == "off":
        return None
    return (Path(root) if root else Path.home() / ".cache" / "m3lab") / "accuracy" / f"{fingerprint()}.json"


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """Hash of m3lab's code and data (every file under ``m3lab/`` but caches) and of vLLM's version (through
    :func:`m3lab.serving.dispatch.resolver_fingerprint`)."""
    h = hashlib.sha256(resolver_fingerprint().encode())
    root = Path(__file__).resolve().parents[1]
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def shipped_band(progress: Callable | None = None) -> dict:
    """:func:`band` of :func:`accuracy_table` with the hardware's default calibration, from the disk cache when
    this code has computed it before (else computed, about 10 s, ``progress`` called as in :func:`accuracy_table`)."""
    path = _cache_file()
    if path is not None and path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):   # a damaged entry is computed again and rewritten
            pass
    b = band(accuracy_table(progress=progress))
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(b))
            tmp.replace(path)
        except OSError:                 # a read-only cache costs time, not the answer
            pass
    return b
