"""Published results used for teaching and sanity checks (each with its source).

Source: vLLM team, "Following the Bottleneck: Optimizing MiniMax M3 on AMD Instinct MI355X"
(2026-09). Measured on MI355X by the authors, not by m3lab.

A published number is shown beside an estimate only for exactly the deployment it was measured on
(:func:`measurement_for`): model, weights, KV dtype, hardware, TP/EP, lengths, concurrency, speculation.
"""
from __future__ import annotations

SOURCE = ('vLLM team, "Following the Bottleneck: Optimizing MiniMax M3 on AMD Instinct MI355X", 2026-09 '
          "(measured on MI355X by the authors)")

#: MXFP8, TP4, fixed 8K input / 1K output, concurrency 32: before and after the optimisations. The KV cache is
#: vLLM's default (the model dtype, bf16); no speculative decoding; TP-MoE (EP 1).
HEADLINE_MXFP8_TP4_C32 = {
    "model": "minimax-m3", "quant": "mxfp8", "kv_dtype": "bf16", "tp": 4, "ep": 1, "isl": 8192, "osl": 1024,
    "concurrency": 32, "spec_tokens": 0, "hardware": "mi355x", "source": SOURCE,
    "metrics": [
        # (metric, unit, before, after, higher_is_better)
        ("output tokens/s/GPU", "tok/s/GPU", 109.1, 342.4, True),
        ("median TTFT", "s", 1.46, 0.67, False),
        ("mean TPOT", "ms", 69.1, 22.1, False),
    ],
}

#: The optimisations of the write-up with their measured end-to-end effect (text as published).
OPTIMISATIONS = [
    ("shape-aware GEMM launcher", "+7.8–9.4% output throughput", "TP8, 8K in / 1K out", "07_gemm_tiling"),
    ("grouped-MoE program order", "1.08×–1.46×", "TP4 tests", "08 (MoE kernels)"),
    ("shared-expert fusion (129 experts, top-5)", "+30.2% at concurrency 1, +5.6% at 128", "TP4", "01_local_shapes"),
    ("index sharing (index_topk_freq 4)", "about −10% mean TPOT at concurrency 1", "", "02_repetition"),
    ("sparse page adapter (128-token blocks on 16-token pages)", "+5.56% (MXFP8) / +6.93% (MXFP4)", "TP4, concurrency 256", "04_fast_paths"),
    ("EAGLE3 speculative decoding, batched indexer", "+7.90% (MXFP8) / +8.32% (MXFP4)", "TP4", "10_serving_estimates"),
    ("prefill/decode disaggregation", "exact per-layer KV transfer geometry; worker-ratio tuning", "", "03_byte_planes"),
    ("agentic workloads", "bottleneck moves to prefix alignment and eviction policy", "", "06 (iterative profiling)"),
]


#: The fields that define a deployment: a measurement applies to an estimate only when all of them agree.
DEPLOYMENT_FIELDS = ("model", "quant", "kv_dtype", "hardware", "tp", "ep", "isl", "osl", "concurrency", "spec_tokens")
_KEYS = {"output tokens/s/GPU": "output_tokens_per_s_per_gpu", "median TTFT": "ttft_s", "mean TPOT": "tpot_ms"}


def measurement_for(config: dict) -> dict | None:
    """The published measurement of exactly the deployment ``config`` describes (the keys of
    :data:`DEPLOYMENT_FIELDS`, as in ``ServingEstimate.config``), or None.

    Returns ``{"hardware", "source", "before": {metric key: value}, "after": {...}}`` with the keys
    ``output_tokens_per_s_per_gpu``, ``ttft_s``, ``tpot_ms``.
    """
    pub = HEADLINE_MXFP8_TP4_C32
    defaults = {"ep": 1, "spec_tokens": 0, "kv_dtype": "bf16"}
    for key in DEPLOYMENT_FIELDS:
        have = config.get(key, defaults.get(key))
        if str(have).strip().lower() != str(pub[key]).lower():
            return None
    return {"hardware": pub["hardware"], "source": pub["source"],
            "before": {_KEYS[m]: before for m, _, before, _, _ in pub["metrics"]},
            "after": {_KEYS[m]: after for m, _, _, after, _ in pub["metrics"]}}


def headline_table():
    """The headline result as a DataFrame: metric, unit, before, after, ratio (after/before), improvement."""
    import pandas as pd

    rows = []
    for metric, unit, before, after, higher in HEADLINE_MXFP8_TP4_C32["metrics"]:
        rows.append({"metric": metric, "unit": unit, "before": before, "after": after,
                     "improvement_x": after / before if higher else before / after})
    return pd.DataFrame(rows)


def optimisations_table():
    """The write-up's optimisations, their published effect and the notebook that studies each."""
    import pandas as pd
    return pd.DataFrame(OPTIMISATIONS, columns=["optimisation", "published effect", "setting", "m3lab notebook"])
