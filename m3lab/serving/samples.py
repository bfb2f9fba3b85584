"""The shipped serving benchmarks of other models (data/SOURCE.md) against m3lab's estimate of the SAME model
and deployment: measured (InferenceX, on MI355X) beside projected (ceiling and calibrated estimate).

Deployment facts come from the files and :data:`~m3lab.serving.vllm_bench.SHIPPED_BENCH`: hardware, TP,
quantisation, concurrency, the mean input/output lengths of the run (the random dataset's lengths vary
around 8K / 1K, so the estimate uses the means the file reports). Both runs used MTP speculative decoding;
the files do not state its settings, so:

- ``accept_len`` is derived from the file: tokens per streamed chunk = mean ITL / mean TPOT (each chunk
  carries the tokens one verification step accepted, TPOT divides by tokens);
- ``spec_tokens`` = :data:`SPEC_TOKENS` draft tokens per step (assumed; it must be ≥ accept_len - 1);
- the draft (one MTP layer + the LM head) costs ``draft_cost`` × a plain decode step per draft token
  (:data:`~m3lab.serving.step_cost.DRAFT_COST`, assumed).

Never mix models: each sample is compared only with the estimate of its own architecture.
"""
from __future__ import annotations

import math

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.serving.estimate import estimate
from m3lab.serving.vllm_bench import DATA_DIR, SHIPPED_BENCH, read_bench_result
from m3lab.spec.serving import make_deployment

SPEC_TOKENS = 3          # assumed MTP draft length of both runs (not in the files)
MEASURED_BY = "InferenceX (SemiAnalysisAI/InferenceX @775633cf)"


def sample_deployment(name: str) -> dict:
    """Everything :func:`~m3lab.serving.estimate.estimate` needs to redo a shipped sample's deployment."""
    if name not in SHIPPED_BENCH:
        raise M3LabError(f"unknown shipped benchmark {name!r}", field="sample",
                         hint=f"one of {', '.join(SHIPPED_BENCH)}")
    facts = SHIPPED_BENCH[name]
    res = read_bench_result(DATA_DIR / name)
    tpot, itl = res.stat("tpot", "mean"), res.stat("itl", "mean")
    accept = min(max(itl / tpot, 1.0), SPEC_TOKENS + 1.0) if tpot > 0 and not math.isnan(itl) else None
    return {"sample": name, "model": facts["model"], "model_id": res.model_id, "hardware": facts["hardware"],
            "tp": facts["tp"], "gpus": facts["gpus"], "quant": facts["quant"], "engine": facts["engine"],
            "concurrency": res.max_concurrency, "isl": round(res.mean_input_len), "osl": round(res.mean_output_len),
            "spec_tokens": SPEC_TOKENS if accept else 0, "accept_len": accept, "measured": res}


def estimate_sample(name: str, calibration="default", num_requests: int | None = None):
    """The :class:`~m3lab.serving.estimate.ServingEstimate` of a shipped sample's model and deployment
    (``num_requests``: requests simulated; default: the prompts the sample's run sent)."""
    d = sample_deployment(name)
    spec = {"spec_method": "mtp", "spec_tokens": d["spec_tokens"], "accept_len": d["accept_len"],
            "accept_dataset": "the sample's own run (mean ITL / mean TPOT)"} if d["spec_tokens"] else {}
    dep = make_deployment(None, spec, model=d["model"], hardware=d["hardware"], tp=d["tp"], quant=d["quant"],
                          isl=d["isl"], osl=d["osl"], concurrency=d["concurrency"],
                          num_prompts=num_requests or d["measured"].num_prompts)
    return estimate(dep, calibration=calibration)


def samples_side_by_side(calibration="default") -> pd.DataFrame:
    """One row per (sample, metric): ``measured`` (by whom, on what: ``measured_by``), ``ceiling`` and
    ``calibrated`` (projected: ``projected_for`` names the profile and the calibration), and
    ``measured_over_ceiling`` (throughput rows only). Metrics: output tokens/s/GPU, median TTFT (s), mean TPOT (ms)."""
    rows = []
    for name in SHIPPED_BENCH:
        d = sample_deployment(name)
        est = estimate_sample(name, calibration)
        per_gpu = d["measured"].per_gpu(d["gpus"])
        measured = {"output_tokens_per_s_per_gpu": per_gpu["output_tokens_per_s_per_gpu"],
                    "ttft_s": per_gpu["median_ttft_s"], "tpot_ms": per_gpu["mean_tpot_ms"]}
        where = (f"{MEASURED_BY}: {d['model_id']} on {d['hardware'].upper()} TP{d['tp']}, {d['engine']} + MTP, "
                 f"concurrency {d['concurrency']}")
        for metric, unit, key in (("output tokens/s/GPU", "tok/s/GPU", "output_tokens_per_s_per_gpu"),
                                  ("median TTFT", "s", "ttft_s"), ("mean TPOT", "ms", "tpot_ms")):
            row = {"model": d["model"], "model_id": d["model_id"], "quant": d["quant"], "concurrency": d["concurrency"],
                   "isl": d["isl"], "osl": d["osl"], "spec_tokens": d["spec_tokens"],
                   "accept_len": round(d["accept_len"], 2) if d["accept_len"] else None,
                   "metric": metric, "unit": unit, "measured": measured[key]}
            for mode, res in est.results.items():
                row[mode] = res[key]
            row["calibrated"] = row.get("calibrated", float("nan"))
            # the throughput's efficiency against the roofline; latencies are lower-is-better, so no ratio there
            row["measured_over_ceiling"] = (measured[key] / row["ceiling"] if key == "output_tokens_per_s_per_gpu"
                                            else float("nan"))
            row["measured_by"] = where
            row["projected_for"] = est.summary()["label"] + f" | ceiling: {est.results['ceiling']['label']}"
            rows.append(row)
    return pd.DataFrame(rows)
