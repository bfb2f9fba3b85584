"""Published results used for teaching and sanity checks (each with its source).

Source: vLLM team, "Following the Bottleneck: Optimizing MiniMax M3 on AMD Instinct MI355X"
(2026-09). Measured on MI355X by the authors, not by m3lab.

A published number is shown beside an estimate only for exactly the deployment it was measured on
(:func:`measurement_for`: every field of the Deployment record, vLLM's switches included, as
:data:`HEADLINE_PRESETS` names them). The
write-up's per-fix gains (:data:`FIX_GAINS`) carry the configuration it states for each; :func:`fix_gain_for` gives
one beside an estimate only where every stated field agrees, and says which fields the write-up leaves unstated.
These figures are the test set of m3lab's estimates: nothing is fitted to them.
"""
from __future__ import annotations

from collections import namedtuple

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

#: One published per-fix result: the fix (a name of :data:`m3lab.ladder.fixes.FIXES`), the metric and its change in
#: percent (``low_pct`` = ``high_pct`` for one figure; a range as published), the text as published, and exactly the
#: configuration the write-up states for it (fields it does not state are absent). ``scope``: ``"serving"`` for an
#: end-to-end figure, ``"kernel"`` for one kernel's own speed-up (never shown beside a serving estimate).
FixGain = namedtuple("FixGain", "fix metric low_pct high_pct text config scope")

_M3 = {"model": "minimax-m3", "hardware": "mi355x"}
FIX_GAINS = (
    FixGain("decode_gemm_launcher", "output tokens/s/GPU", 7.8, 9.4, "+7.8–9.4% output throughput",
            {**_M3, "tp": 8, "isl": 8192, "osl": 1024}, "serving"),
    FixGain("moe_program_order", "kernel speed-up", 8.0, 46.0, "1.08×–1.46× in TP4 tests", {**_M3, "tp": 4},
            "kernel"),
    FixGain("shared_expert_fusion", "output tokens/s/GPU", 30.2, 30.2, "+30.2% output throughput at concurrency 1",
            {**_M3, "tp": 4, "concurrency": 1}, "serving"),
    FixGain("shared_expert_fusion", "output tokens/s/GPU", 5.6, 5.6, "+5.6% output throughput at concurrency 128",
            {**_M3, "tp": 4, "concurrency": 128}, "serving"),
    FixGain("index_sharing", "mean TPOT", -10.0, -10.0, "about −10% mean TPOT at concurrency 1",
            {**_M3, "concurrency": 1, "index_topk_freq": 4}, "serving"),
    FixGain("sparse_page_adapter", "output tokens/s/GPU", 5.56, 5.56, "+5.56% output throughput (MXFP8)",
            {**_M3, "quant": "mxfp8", "tp": 4, "concurrency": 256}, "serving"),
    FixGain("sparse_page_adapter", "output tokens/s/GPU", 6.93, 6.93, "+6.93% output throughput (MXFP4)",
            {**_M3, "quant": "mxfp4", "tp": 4, "concurrency": 256}, "serving"),
    FixGain("request_level_index_batching", "kernel speed-up", 48.9, 48.9, "index kernel up to 48.9% faster",
            {**_M3, "spec_method": "eagle3"}, "kernel"),
    FixGain("multi_token_verification", "output tokens/s/GPU", 7.90, 7.90, "+7.90% output throughput (MXFP8)",
            {**_M3, "quant": "mxfp8", "tp": 4, "spec_method": "eagle3"}, "serving"),
    FixGain("multi_token_verification", "output tokens/s/GPU", 8.32, 8.32, "+8.32% output throughput (MXFP4)",
            {**_M3, "quant": "mxfp4", "tp": 4, "spec_method": "eagle3"}, "serving"),
)
#: Fields an estimate is compared on; a published figure states some of them (the rest: "not stated").
FIX_CONFIG_FIELDS = ("model", "hardware", "quant", "tp", "ep", "isl", "osl", "concurrency", "index_topk_freq",
                     "spec_method")
#: A figure that names no speculative method is compared only with estimates without one (``spec_method`` "none"):
#: the write-up reports speculative decoding as its own step.
UNSTATED_MEANS = {"spec_method": "none"}

#: The optimisations of the write-up: (title, fix name or None, effect where it is no per-fix figure, setting,
#: the m3lab notebook that studies it). A fix's published effect is its FIX_GAINS texts.
OPTIMISATIONS = [
    ("shape-aware GEMM launcher", "decode_gemm_launcher", "", "TP8, 8K in / 1K out", "07_gemm_tiling"),
    ("grouped-MoE program order", "moe_program_order", "", "TP4 tests", "08 (MoE kernels)"),
    ("shared-expert fusion (129 experts, top-5)", "shared_expert_fusion", "", "TP4", "01_local_shapes"),
    ("index sharing (index_topk_freq 4)", "index_sharing", "", "", "02_repetition"),
    ("sparse page adapter (128-token blocks on 16-token pages)", "sparse_page_adapter", "", "TP4, concurrency 256",
     "04_fast_paths"),
    ("EAGLE3 speculative decoding, batched indexer", "multi_token_verification", "", "TP4", "10_serving_estimates"),
    ("prefill/decode disaggregation", None, "exact per-layer KV transfer geometry; worker-ratio tuning", "",
     "03_byte_planes"),
    ("agentic workloads", None, "bottleneck moves to prefix alignment and eviction policy", "",
     "06 (iterative profiling)"),
]


def fix_gains(fix: str) -> list:
    """The published :data:`FIX_GAINS` of ``fix`` (empty when the write-up gives none)."""
    return [g for g in FIX_GAINS if g.fix == fix]


def gains_text(fix: str) -> str:
    """The write-up's figures for ``fix``, each with the configuration it was measured on, as text ("" for none)."""
    return "; ".join(f"{g.text} ({describe_config(g.config)}{', kernel tests' if g.scope == 'kernel' else ''})"
                     for g in fix_gains(fix))


def describe_config(config: dict) -> str:
    """A published configuration as text (``"minimax-m3 on mi355x, tp 8, isl 8192, osl 1024"``)."""
    head = f"{config.get('model', '?')} on {config.get('hardware', '?')}"
    rest = [f"{k} {config[k]}" for k in FIX_CONFIG_FIELDS if k in config and k not in ("model", "hardware")]
    return ", ".join([head, *rest])


def _same(key: str, published_value, value) -> bool:
    if key == "model":  # the M3 checkpoints (minimax-m3, minimax-m3-mxfp8, ...) are one model
        return str(value).lower().startswith(str(published_value).lower())
    return str(value).strip().lower() == str(published_value).strip().lower()


def fix_gain_for(fix: str, config: dict) -> dict | None:
    """The write-up's figure for ``fix`` where its stated configuration is ``config``'s (every field it states agrees;
    ``config`` has the keys of :data:`FIX_CONFIG_FIELDS`), else its figures with their configurations and no value.

    Returns None when the write-up gives no figure for ``fix``; else ``{"metric", "text", "configuration", "scope",
    "matches", "value_pct", "not_stated"}``: ``value_pct`` is the published change in percent (a ``[low, high]``
    pair for a published range) only when ``matches`` (a serving figure of this configuration), else None;
    ``not_stated`` lists the compared fields the write-up does not state for that figure.
    """
    gains = fix_gains(fix)
    if not gains:
        return None
    for g in gains:
        stated = {**UNSTATED_MEANS, **g.config}
        if g.scope == "serving" and all(_same(k, v, config.get(k)) for k, v in stated.items()):
            value = g.low_pct if g.low_pct == g.high_pct else [g.low_pct, g.high_pct]
            return {"metric": g.metric, "text": g.text, "configuration": describe_config(g.config), "scope": g.scope,
                    "matches": True, "value_pct": value,
                    "not_stated": [k for k in FIX_CONFIG_FIELDS if k not in stated]}
    return {"metric": gains[0].metric, "text": "; ".join(g.text for g in gains),
            "configuration": "; ".join(describe_config(g.config) + (" (kernel tests)" if g.scope == "kernel" else "")
                                       for g in gains),
            "scope": gains[0].scope, "matches": False, "value_pct": None, "not_stated": []}


#: The deployments the headline was measured on, as m3lab's presets (``m3lab vllm plan --presets``): "before" is
#: vLLM's defaults, "after" the write-up's optimisations; both at the headline's lengths and concurrency.
HEADLINE_PRESETS = {"before": "mxfp8-tp4-baseline", "after": "mxfp8-tp4-optimised"}
#: Fields of a deployment a measurement does not state: they are not compared (the run's request count is
#: vllm bench's default, 1000, for the headline; a shipped benchmark file states its own).
NOT_STATED = ("num_prompts", "seed", "accept_dataset", "draft_cost")
#: P/D fields: compared only when either side is disaggregated.
_PD_FIELDS = ("kv_link_gbps", "prefill_", "decode_")
_KEYS = {"output tokens/s/GPU": "output_tokens_per_s_per_gpu", "median TTFT": "ttft_s", "mean TPOT": "tpot_ms"}


def headline_deployment(case: str):
    """The Deployment the headline's ``case`` ("before" or "after") was measured on."""
    from m3lab.spec.serving import make_deployment

    pub = HEADLINE_MXFP8_TP4_C32
    d = make_deployment(HEADLINE_PRESETS[case], isl=pub["isl"], osl=pub["osl"], concurrency=pub["concurrency"])
    assert (d.model.name.startswith(pub["model"]) and d.quant.name == pub["quant"] and d.plan.tp == pub["tp"]
            and d.quant.kv_dtype == pub["kv_dtype"] and d.hardware.name == pub["hardware"]), case
    return d


def deployment_differences(deployment, measured) -> list[str]:
    """The fields where ``deployment`` is not the deployment ``measured`` ran (both Deployments): every field of
    the record (:meth:`~m3lab.spec.serving.Deployment.settings`: hardware, plan, weights, KV and index caches,
    every vLLM switch and limit, speculation, lengths, concurrency, P/D roles) except :data:`NOT_STATED`; the
    model compared as the checkpoint vLLM serves (``minimax-m3`` with MXFP8 weights and ``minimax-m3-mxfp8`` are
    both MiniMaxAI/MiniMax-M3-MXFP8)."""
    from m3lab.spec.model import checkpoint_id

    mine, theirs = deployment.settings(), measured.settings()
    if mine.get("pd") == theirs.get("pd") == "0:0":
        mine, theirs = ({k: v for k, v in x.items() if not k.startswith(_PD_FIELDS)} for x in (mine, theirs))
    out = [k for k in sorted(set(mine) | set(theirs))
           if k not in NOT_STATED and k != "model" and mine.get(k) != theirs.get(k)]
    if checkpoint_id(deployment.model.name, deployment.quant.name) != checkpoint_id(measured.model.name,
                                                                                     measured.quant.name):
        out.insert(0, "model")
    return out


def measurement_for(deployment) -> dict | None:
    """The published measurement of exactly ``deployment`` (a :class:`~m3lab.spec.serving.Deployment`: no field of
    :func:`deployment_differences` differs), or None.

    Returns ``{"case", "preset", "hardware", "source", "figures", "not_stated"}``: ``case`` is "before" or
    "after", ``figures`` has the keys ``output_tokens_per_s_per_gpu``, ``ttft_s``, ``tpot_ms``.
    """
    pub = HEADLINE_MXFP8_TP4_C32
    for case, preset in HEADLINE_PRESETS.items():
        if not deployment_differences(deployment, headline_deployment(case)):
            column = 2 if case == "before" else 3
            return {"case": case, "preset": preset, "hardware": pub["hardware"], "source": pub["source"],
                    "figures": {_KEYS[m[0]]: m[column] for m in pub["metrics"]}, "not_stated": list(NOT_STATED)}
    return None


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
    rows = [(title, "; ".join(g.text for g in fix_gains(fix)) if fix else effect, setting, notebook)
            for title, fix, effect, setting, notebook in OPTIMISATIONS]
    return pd.DataFrame(rows, columns=["optimisation", "published effect", "setting", "m3lab notebook"])
