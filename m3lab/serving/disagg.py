"""Prefill/decode disaggregation: worker ratio, KV hand-off time, and the resulting per-GPU throughput.

A prefill instance (``tp`` GPUs) serves only prompts: its request rate and prefill latency come from
:func:`m3lab.serving.estimate.estimate` with one output token (the scheduler's chunked prefill). A
decode instance holds ``concurrency`` requests decoding from ``isl`` to ``isl + osl`` tokens: its
TPOT is the mean cost of those decode steps. Each request's KV (every layer; ``kv_per_layer``)
travels from prefill to decode over ``kv_link_bw`` (B/s per GPU; all ranks in parallel), together with a
linear-attention model's fixed recurrent state per request (``state_bytes_per_request``; 0 otherwise).

With P prefill and D decode instances the system serves ``min(P × prefill rate, D × decode rate)``
requests/s; output tokens/s/GPU = that × osl / ((P + D) × tp); TTFT = prefill latency + KV hand-off.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from m3lab.errors import M3LabError

KV_LINK_BW = 50e9     # assumed B/s per GPU between a prefill and a decode node (one 400 Gb/s NIC per GPU)
DECODE_SAMPLES = 8    # decode contexts sampled between isl and isl + osl


def _decode_step_s(coster, concurrency: int, isl: int, osl: int, mode: str) -> float:
    from m3lab.workload.step import EngineStep

    ctx = np.linspace(isl + 1, isl + osl, DECODE_SAMPLES).round().astype(int)
    return float(np.mean([coster.time_us(EngineStep.decode(concurrency, int(c)), mode) for c in ctx])) * 1e-6


def disaggregated(model, hardware, *, tp: int, quant="bf16", isl: int, osl: int, concurrency: int,
                  ratios=((1, 1), (1, 2), (1, 3), (2, 1), (2, 3)), prefill_concurrency: int = 4,
                  kv_link_bw: float = KV_LINK_BW, calibration="default", kv_dtype: str | None = None) -> pd.DataFrame:
    """One row per (prefill:decode ratio, mode): request rates, TTFT (prefill + KV hand-off), TPOT and output
    tokens/s/GPU; ``limited_by`` says which side sets the rate."""
    from m3lab.analysis.byte_planes import kv_per_layer
    from m3lab.serving.estimate import estimate

    if kv_link_bw <= 0:
        raise M3LabError(f"kv_link_bw={kv_link_bw} must be positive (B/s per GPU)", field="kv_link_bw")
    pre = estimate(model, hardware, tp=tp, quant=quant, kv_dtype=kv_dtype, isl=isl, osl=1, concurrency=prefill_concurrency,
                   calibration=calibration)
    dec = estimate(model, hardware, tp=tp, quant=quant, kv_dtype=kv_dtype, isl=isl, osl=2, concurrency=concurrency,
                   calibration=calibration)  # checks the decode side's KV capacity
    from m3lab.spec.model import load_model
    from m3lab.spec.plan import ParallelPlan

    from m3lab.spec.memory import state_bytes_per_request

    m = load_model(model)
    plan = ParallelPlan(tp=tp)
    from m3lab.spec.quant import load_quant

    q = load_quant(quant).with_cache(kv_dtype) if kv_dtype else quant
    kv_bytes_rank = (kv_per_layer(m, plan, q)["bytes_per_token_per_rank"].sum() * isl
                     + state_bytes_per_request(m, plan))
    kv_s = kv_bytes_rank / kv_link_bw
    rows = []
    for mode, res in pre.results.items():
        pre_rate = pre.config["num_requests"] / res["makespan_s"]            # requests/s per prefill instance
        tpot = _decode_step_s(dec.coster, concurrency, isl, osl, mode)
        dec_rate = concurrency / (tpot * osl)                                 # requests/s per decode instance
        for p, d in ratios:
            rate = min(p * pre_rate, d * dec_rate)
            rows.append({"mode": mode, "prefill": p, "decode": d, "ratio": f"{p}:{d}",
                         "prefill_req_per_s": p * pre_rate, "decode_req_per_s": d * dec_rate,
                         "limited_by": "prefill" if p * pre_rate < d * dec_rate else "decode",
                         "kv_handoff_gb_per_request": kv_bytes_rank * tp / 1e9, "kv_handoff_ms": kv_s * 1e3,
                         "ttft_s": res["ttft_s"] + kv_s, "tpot_ms": tpot * 1e3,
                         "output_tokens_per_s_per_gpu": rate * osl / ((p + d) * tp), "label": res["label"]})
    return pd.DataFrame(rows)
