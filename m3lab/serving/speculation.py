"""Speculative decoding: verification in the reference decoder, greedy acceptance, and acceptance lengths.

Verification: a target step over the 1 + k positions ``[last token, draft_1 .. draft_k]`` of a request writes
their KV and returns logits at every position (:func:`verify_step`); position i's logits are the target's
distribution for the token after ``draft_i``, exactly what k + 1 sequential decode steps would give (the indexer,
top-k and sparse attention are causal per token). :func:`greedy_accept` keeps the longest draft prefix that
matches the target's argmax and adds the target's own next token (the bonus); :func:`rollback` drops the KV of
the rejected positions.

Acceptance lengths for estimates come from measurements, not from a random model (:func:`acceptance_table`):

- published: the EAGLE3 draft of MiniMax M3 (Inferact/MiniMax-M3-EAGLE3 model card, TP4, k = 3): mean acceptance
  length 2.70 on MT-Bench and 3.52 on GSM8K; one InferenceX EAGLE3-GQA TP4 recipe with k = 4 quotes 3.02 on
  synthetic data (the Inferact/MiniMax-M3-EAGLE3 model card; the InferenceX recipe);
- measured: ``spec_decode_acceptance_length`` of ``vllm bench serve`` result files; files that lack it but ran
  with speculation give mean ITL / mean TPOT (tokens per engine step), labelled inferred.

Other draft lengths are projected with the usual geometric model (each draft position accepted with probability
a, independently): accept_len(k) = (1 - a^(k+1)) / (1 - a), with a fitted to a published point.
"""
from __future__ import annotations

import math

import torch

from m3lab.errors import M3LabError
from m3lab.serving.vllm_bench import DATA_DIR, SHIPPED_BENCH, cited, read_bench_result
from m3lab.workload.deployed import chain_acceptance

EAGLE3_SOURCE = ("Inferact/MiniMax-M3-EAGLE3 model card (EAGLE3 draft of MiniMax M3, TP4, 3 speculative tokens), "
                 "Hugging Face")
INFERENCEX_SOURCE = "InferenceX EAGLE3-GQA TP4 recipe (Inferact/MiniMax-M3-EAGLE3-GQA draft), synthetic data"

#: Published mean acceptance lengths (vLLM's definition: tokens emitted per verification step, bonus included).
PUBLISHED_ACCEPTANCE = (
    {"model": "minimax-m3", "method": "EAGLE3", "draft": "Inferact/MiniMax-M3-EAGLE3", "k": 3, "tp": 4,
     "dataset": "MT-Bench", "accept_len": 2.70, "source": EAGLE3_SOURCE},
    {"model": "minimax-m3", "method": "EAGLE3", "draft": "Inferact/MiniMax-M3-EAGLE3", "k": 3, "tp": 4,
     "dataset": "GSM8K", "accept_len": 3.52, "source": EAGLE3_SOURCE},
    {"model": "minimax-m3", "method": "EAGLE3", "draft": "Inferact/MiniMax-M3-EAGLE3-GQA", "k": 4, "tp": 4,
     "dataset": "synthetic", "accept_len": 3.02, "source": INFERENCEX_SOURCE},
)


# ---- verification in the reference decoder ------------------------------------------------------------------


def verify_step(model, cache, seq: int, last_token: int, draft: list[int]) -> torch.Tensor:
    """One target step over ``[last_token] + draft`` for request ``seq``: logits [1 + k, V]."""
    tokens = torch.tensor([int(last_token)] + [int(t) for t in draft])
    return model.step(cache, [(seq, tokens)], all_logits=True)


def greedy_accept(logits: torch.Tensor, draft: list[int]) -> tuple[int, list[int]]:
    """(accepted draft tokens, emitted tokens): the longest prefix of ``draft`` equal to the target's argmax at
    each position, then the target's token at the first mismatch (or after the last draft token)."""
    target = logits.argmax(-1).tolist()
    n = 0
    while n < len(draft) and int(draft[n]) == target[n]:
        n += 1
    return n, [int(t) for t in draft[:n]] + [target[n]]


def rollback(cache, seq: int, rejected: int) -> None:
    """Forget the KV of the last ``rejected`` positions of ``seq`` (their slots are rewritten by the next step)."""
    if rejected:
        cache.lengths[seq] -= rejected


# ---- acceptance lengths ----------------------------------------------------------------------------------------


def geometric_accept_len(a: float, k: int) -> float:
    """Expected tokens per verification step when each draft position is accepted with probability ``a``."""
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def fit_acceptance_rate(accept_len: float, k: int) -> float:
    """The per-position acceptance probability a with geometric_accept_len(a, k) == accept_len (the step
    generator's fake model uses the same chain: :func:`m3lab.workload.deployed.chain_acceptance`)."""
    return chain_acceptance(accept_len, k)


def projected_accept_len(k: int, dataset: str = "MT-Bench") -> float:
    """Acceptance length at draft length ``k``, projected from the published M3 EAGLE3 point on ``dataset``."""
    rows = [r for r in PUBLISHED_ACCEPTANCE if r["dataset"] == dataset]
    if not rows:
        raise M3LabError(f"no published acceptance length for dataset {dataset!r}", field="dataset",
                         hint="one of " + ", ".join(r["dataset"] for r in PUBLISHED_ACCEPTANCE))
    r = rows[0]
    return 1.0 if k == 0 else geometric_accept_len(fit_acceptance_rate(r["accept_len"], r["k"]), k)


def bench_acceptance(path) -> dict | None:
    """Acceptance of one ``vllm bench serve`` result file: ``spec_decode_*`` fields when present (measured),
    else mean ITL / mean TPOT when the run used speculation (inferred); None without either."""
    import json
    from pathlib import Path


    res = read_bench_result(path)
    raw = json.loads(Path(path).read_text())
    row = {"model": res.model_id, "file": Path(path).name, "draft": None, "tp": None,
           "dataset": f"{res.mean_input_len:.0f} in / {res.mean_output_len:.0f} out, concurrency {res.max_concurrency}"}
    if raw.get("spec_decode_acceptance_length") is not None:
        k = raw.get("spec_decode_num_drafts") and raw.get("spec_decode_draft_tokens", 0) / raw["spec_decode_num_drafts"]
        return {**row, "method": "speculative", "k": round(k) if k else None,
                "accept_len": float(raw["spec_decode_acceptance_length"]),
                "acceptance_rate": raw.get("spec_decode_acceptance_rate"),
                "kind": "measured (spec_decode_acceptance_length)", "source": cited(path)}
    itl, tpot = res.stat("itl", "mean"), res.stat("tpot", "mean")
    if math.isfinite(itl) and math.isfinite(tpot) and tpot > 0 and itl / tpot > 1.05:
        return {**row, "method": "speculative", "k": None, "accept_len": itl / tpot, "acceptance_rate": None,
                "kind": "inferred (mean ITL / mean TPOT)", "source": cited(path)}
    return None


def acceptance_table(bench_paths=None) -> "pandas.DataFrame":  # noqa: F821
    """Published M3 figures plus what bench result files say (default: the shipped samples). ``acceptance_rate``
    is vLLM's: accepted draft tokens / draft tokens = (accept_len - 1) / k."""
    import pandas as pd


    rows = [{**r, "acceptance_rate": (r["accept_len"] - 1) / r["k"], "kind": "published"}   # vLLM's definition
            for r in PUBLISHED_ACCEPTANCE]
    paths = bench_paths if bench_paths is not None else [DATA_DIR / name for name in SHIPPED_BENCH]
    for p in paths:
        row = bench_acceptance(p)
        if row is not None:
            rows.append(row)
    cols = ["model", "method", "draft", "k", "tp", "dataset", "accept_len", "acceptance_rate", "kind", "source"]
    return pd.DataFrame(rows)[cols]


def spec_sweep(deployment, draft_lengths, *, dataset: str = "MT-Bench",
               calibration="default") -> "pandas.DataFrame":  # noqa: F821
    """Serving estimates of ``deployment`` with EAGLE3 against the draft length k (0: off): acceptance length
    projected from the published M3 EAGLE3 point on ``dataset`` (:func:`projected_accept_len`), one row per
    (k, mode)."""
    import pandas as pd

    from m3lab.serving.estimate import estimate  # local: pulls in pandas

    rows = []
    for k in draft_lengths:
        a = projected_accept_len(int(k), dataset) if k else None
        spec = {"spec_method": "eagle3" if k else None, "spec_tokens": int(k), "accept_len": a,
                "accept_dataset": f"{dataset} (projected to k={int(k)})" if k else "assumed"}
        est = estimate(deployment.with_settings(spec), calibration=calibration)
        for mode, res in est.results.items():
            rows.append({"k": int(k), "accept_len": a or 1.0, "mode": mode,
                         **{key: res[key] for key in ("output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms", "label")}})
    return pd.DataFrame(rows)
