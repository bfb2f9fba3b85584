"""Prefill/decode disaggregation: worker ratio, KV hand-off time, and the resulting per-GPU throughput.

A prefill instance (``tp`` GPUs) serves only prompts: its request rate and prefill latency come from
:func:`m3lab.serving.estimate.estimate` with one output token (the scheduler's chunked prefill). A
decode instance holds ``concurrency`` requests decoding from ``isl`` to ``isl + osl`` tokens: its
TPOT is the mean cost of those decode steps. Each request's KV (every layer; ``kv_per_layer``)
travels from prefill to decode over ``pd.kv_link_gbps`` (GB/s per GPU; all ranks in parallel), with a
linear-attention model's fixed recurrent state per request (``state_bytes_per_request``; 0 otherwise).

With P prefill and D decode instances the system serves ``min(P × prefill rate, D × decode rate)``
requests/s; output tokens/s/GPU = that × osl / ((P + D) × tp); TTFT = prefill latency + KV hand-off
(:func:`disaggregated`, a rate bound). :func:`pd_estimate` simulates the same deployment request by request
(queues at both pools, the decode instances' batch limit, hand-offs one at a time per prefill instance): what
``m3lab estimate --pd P:D`` prints. Both take the hand-off bytes from the exact geometry of
:mod:`m3lab.pd.geometry` for M3-style caches.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from m3lab.errors import M3LabError
from m3lab.spec.settings import parse_pd

DECODE_SAMPLES = 8    # decode contexts sampled between isl and isl + osl


def _decode_step_s(coster, concurrency: int, isl: int, osl: int, mode: str) -> float:
    from m3lab.workload.step import EngineStep

    ctx = np.linspace(isl + 1, isl + osl, DECODE_SAMPLES).round().astype(int)
    return float(np.mean([coster.time_us(EngineStep.decode(concurrency, int(c)), mode) for c in ctx])) * 1e-6


def _handoff_bytes_per_rank(m, plan, quant, isl: int) -> float:
    """Bytes the busiest rank moves for one request: the exact hand-off geometry for M3-style caches
    (:func:`m3lab.pd.geometry.pd_plan`), else per-layer KV bytes per rank plus a linear-attention state."""
    from m3lab.analysis.byte_planes import kv_per_layer
    from m3lab.spec.memory import state_bytes_per_request
    from m3lab.spec.quant import load_quant

    if m.sparse is not None and m.sparse.style == "block" and m.linear is None and m.mla is None:
        from m3lab.pd.geometry import pd_plan
        q = load_quant(quant)
        s, _ = pd_plan(m, plan.tp, plan.tp, isl, kv_dtype=q.kv_dtype, index_dtype=q.index_dtype)
        return float(max(s["max_bytes_sent_per_prefill_rank"], s["max_bytes_received_per_decode_rank"]))
    return float(kv_per_layer(m, plan, quant)["bytes_per_token_per_rank"].sum() * isl
                 + state_bytes_per_request(m, plan))


def disaggregated(deployment, *, ratios=((1, 1), (1, 2), (1, 3), (2, 1), (2, 3)), prefill_concurrency: int = 4,
                  calibration="default") -> pd.DataFrame:
    """One row per (prefill:decode ratio, mode) for ``deployment`` (both sides on its plan; its workload's
    lengths and concurrency; its KV link): request rates, TTFT (prefill + KV hand-off), TPOT and output
    tokens/s/GPU; ``limited_by`` says which side sets the rate. ``prefill_concurrency``: prompts in flight on a
    prefill instance."""
    from m3lab.serving.estimate import estimate

    d = deployment.validate()
    wl, tp = d.workload, d.plan.tp
    isl, osl, concurrency = wl.isl, wl.osl, wl.concurrency
    pre = estimate(d.with_settings({"osl": 1, "concurrency": prefill_concurrency,
                                    "num_prompts": 4 * prefill_concurrency}), calibration=calibration)
    dec = estimate(d.with_settings({"osl": 2, "num_prompts": 4 * concurrency}),
                   calibration=calibration)  # checks the decode side's KV capacity
    kv_bytes_rank = _handoff_bytes_per_rank(d.model, d.plan, d.quant, isl)
    kv_s = kv_bytes_rank / (d.pd.kv_link_gbps * 1e9)
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


# ---- a simulated P:D deployment (``m3lab estimate ... --pd P:D``) ---------------------------------------------
#
# Closed loop at ``concurrency`` requests (as ``vllm bench serve --max-concurrency`` against a P/D proxy):
# - a request enters, waits for the first free prefill instance (FIFO) and is prefilled there in chunks of at
#   most ``max_num_batched_tokens`` (one prompt at a time; the prefill's own first token is discarded, as vLLM's
#   P/D proxy does with ``max_tokens=1``);
# - its KV then crosses the link: the busiest rank's bytes from the exact hand-off geometry
#   (:func:`m3lab.pd.geometry.pd_plan`) over ``kv_link_gbps``, one transfer at a time per prefill instance;
# - it joins the least-loaded decode instance (at most ``max_num_seqs`` and its KV capacity at once) at the next
#   step boundary; every decode step emits one token per request (``accept_len`` with speculative decoding), the
#   first at the request's first step, so TTFT = queueing + prefill + hand-off + first decode step;
# - when it finishes, the next request enters.


def parse_ratio(text: str) -> tuple[int, int]:
    """"P:D" -> (P, D), both positive integers (:func:`m3lab.spec.settings.parse_pd`)."""
    p, d = parse_pd(text)
    if p < 1:
        raise M3LabError(f"--pd {text!r} needs at least one prefill and one decode instance", field="pd")
    return p, d


def _simulate_pd(pre_coster, dec_coster, mode: str, *, prefill: int, decode: int, isl: int, osl_steps: int,
                 concurrency: int, num_requests: int, handoff_s: float, max_seqs: int, chunk: int) -> dict:
    import heapq

    from m3lab.workload.step import EngineStep

    t_pre, past = 0.0, 0
    while past < isl:                                   # one prompt, chunked as the prefill scheduler does
        n = min(chunk, isl - past)
        t_pre += pre_coster.time_us(EngineStep.prefill(n, past=past), mode) * 1e-6
        past += n
    pre_free = [0.0] * prefill
    link_free = [0.0] * prefill
    waiting: list[list] = [[] for _ in range(decode)]     # (ready time, request) per decode instance
    active: list[dict] = [{} for _ in range(decode)]      # request -> decode steps done
    busy_until = [None] * decode
    entered, first, finish = {}, {}, {}
    events: list = []
    issued = 0
    batch_sum = steps = 0

    def enter(t: float) -> None:
        nonlocal issued
        if issued >= num_requests:
            return
        r = issued
        issued += 1
        entered[r] = t
        i = min(range(prefill), key=lambda j: pre_free[j])
        done = max(t, pre_free[i]) + t_pre
        pre_free[i] = done
        sent = max(done, link_free[i]) + handoff_s
        link_free[i] = sent
        heapq.heappush(events, (sent, 0, r))

    def start_step(j: int, t: float) -> None:
        nonlocal batch_sum, steps
        room = max_seqs - len(active[j])
        ready = waiting[j][:room]
        for r in ready:
            waiting[j].remove(r)
            active[j][r] = 0
        if not active[j]:
            busy_until[j] = None
            return
        b = len(active[j])
        ctx = isl + 1 + int(np.mean(list(active[j].values())))
        dt = dec_coster.time_us(EngineStep.decode(b, ctx), mode) * 1e-6
        batch_sum, steps = batch_sum + b, steps + 1
        busy_until[j] = t + dt
        heapq.heappush(events, (t + dt, 1, j))

    for _ in range(concurrency):
        enter(0.0)
    now = 0.0
    while events:
        now, kind, x = heapq.heappop(events)
        if kind == 0:                                   # KV arrived: queue at the least-loaded decode instance
            j = min(range(decode), key=lambda k: len(active[k]) + len(waiting[k]))
            waiting[j].append(x)
            if busy_until[j] is None:
                start_step(j, now)
        else:                                           # decode instance x finished a step
            for r in list(active[x]):
                active[x][r] += 1
                if active[x][r] == 1:
                    first[r] = now
                if active[x][r] >= osl_steps:
                    finish[r] = now
                    del active[x][r]
                    enter(now)
            start_step(x, now)
    n = len(finish)
    ttft = np.array([first[r] - entered[r] for r in finish])
    tpot = np.array([(finish[r] - first[r]) for r in finish])
    return {"makespan_s": now, "completed": n, "ttft": ttft, "decode_span": tpot, "prefill_s": t_pre,
            "prefill_busy": issued * t_pre / max(prefill * now, 1e-12),
            "mean_decode_batch": batch_sum / max(steps, 1)}


def pd_estimate(deployment, *, calibration="default") -> dict:
    """``deployment`` served disaggregated (``pd.prefill.instances`` prefill instances on the prefill role's plan,
    ``pd.decode.instances`` decode instances on the decode role's), simulated as described above. Returns the
    summary dict ``m3lab estimate --pd`` prints: the calibrated figures where a calibration exists (else the
    ceiling), the ceiling under ``ceiling``, the hand-off and the pools' load."""
    from m3lab.cost.model import cost_label, resolve_calibration
    from m3lab.pd.geometry import pd_plan
    from m3lab.serving.capacity import capacity
    from m3lab.serving.estimate import spec_decode_steps
    from m3lab.serving.step_cost import StepCoster
    from m3lab.workload.deployed import fixed_workload

    d = deployment.validate()
    if not d.pd.enabled:
        raise M3LabError("the P/D estimate needs prefill and decode instances", field="pd",
                         hint="e.g. --pd 2:1 (2 prefill, 1 decode)")
    m, hw, q, wl = d.model, d.hardware, d.quant, d.workload
    isl, osl, concurrency = wl.isl, wl.osl, wl.concurrency
    prefill, decode = d.pd.prefill.instances, d.pd.decode.instances
    pplan, dplan = d.role_plan("prefill"), d.role_plan("decode")
    spec_tokens, accept_len = d.serving.spec_tokens, d.acceptance.accept_len
    dlim, plim = d.role_limits("decode"), d.role_limits("prefill")
    cap = capacity(m, dplan, q, hw, isl=isl, osl=osl, gpu_memory_utilization=dlim.gpu_memory_utilization,
                   spec_tokens=spec_tokens)
    max_seqs = min(dlim.max_num_seqs, cap.max_concurrency)
    if max_seqs < 1:
        cap.check(1)
    osl_steps = spec_decode_steps(osl, spec_tokens, accept_len)
    fixed_workload(d, what="the P/D estimate")
    kv_link_bw = d.pd.kv_link_gbps * 1e9
    handoff, _ = pd_plan(m, pplan.tp, dplan.tp, isl, kv_dtype=q.kv_dtype, index_dtype=q.index_dtype,
                         prefill_layout=d.pd.prefill.layout, decode_layout=d.pd.decode.layout, bandwidth=kv_link_bw)
    cal = resolve_calibration(hw, calibration)
    pre = StepCoster(dataclasses.replace(d, plan=pplan), cal)   # prefill steps only: no speculative rows
    dec = StepCoster(dataclasses.replace(d, plan=dplan), cal)
    n_req = wl.num_prompts
    gpus = d.gpus
    results = {}
    for mode in ("ceiling",) + (("calibrated",) if cal is not None else ()):
        sim = _simulate_pd(pre, dec, mode, prefill=prefill, decode=decode, isl=isl, osl_steps=osl_steps,
                           concurrency=concurrency, num_requests=n_req, handoff_s=handoff["transfer_s"],
                           max_seqs=max_seqs, chunk=plim.max_num_batched_tokens)
        span, n = sim["makespan_s"], sim["completed"]
        results[mode] = {
            "output_tokens_per_s_per_gpu": n * osl / span / gpus,
            "total_tokens_per_s_per_gpu": n * (isl + osl) / span / gpus,
            "ttft_s": float(np.median(sim["ttft"])), "ttft_mean_s": float(np.mean(sim["ttft"])),
            "tpot_ms": float(np.mean(sim["decode_span"]) / max(osl - 1, 1) * 1e3),
            "prefill_s_per_request": sim["prefill_s"], "prefill_utilisation": min(sim["prefill_busy"], 1.0),
            "mean_decode_batch": sim["mean_decode_batch"], "makespan_s": span,
            "label": cost_label(hw, None if mode == "ceiling" else cal)}
    kind = "calibrated" if "calibrated" in results else "ceiling"
    figures = ("output_tokens_per_s_per_gpu", "total_tokens_per_s_per_gpu", "ttft_s", "ttft_mean_s", "tpot_ms",
               "prefill_s_per_request", "prefill_utilisation", "mean_decode_batch", "makespan_s", "label")
    return {"kind": kind, **{k: results[kind][k] for k in figures},
            "ceiling": {k: results["ceiling"][k] for k in figures},
            "pd": f"{prefill}:{decode}", "prefill_instances": prefill, "decode_instances": decode,
            "prefill_tp": pplan.tp, "decode_tp": dplan.tp, "ep": dplan.ep, "gpus": gpus, "model": m.name,
            "hardware": hw.name, "deployment": d.name, "deployment_key": d.key(),
            "quant": q.name, "kv_dtype": q.kv_dtype, "isl": isl, "osl": osl, "concurrency": concurrency,
            "num_requests": n_req, "max_num_seqs_per_decode_instance": max_seqs,
            "kv_handoff_bytes_per_request": handoff["bytes_per_request"],
            "kv_handoff_descriptors_per_request": handoff["descriptors_per_request"],
            "kv_handoff_ms": handoff["transfer_s"] * 1e3, "kv_link_gbps": d.pd.kv_link_gbps,
            "spec_tokens": spec_tokens, "accept_len": accept_len, "accept_len_source": d.acceptance.source(),
            "calibration": cal.name if cal is not None else None}


def pd_ratio_sweep(deployment, ratios, *, calibration="default") -> pd.DataFrame:
    """:func:`pd_estimate` of ``deployment`` at each of ``ratios`` [(P, D)]: one row per (ratio, mode) with the
    four figures."""
    rows = []
    for p, d in ratios:
        s = pd_estimate(deployment.with_settings({"pd": f"{p}:{d}"}), calibration=calibration)
        modes = {"ceiling": s["ceiling"]}
        if s["kind"] == "calibrated":
            modes["calibrated"] = {k: s[k] for k in s["ceiling"]}
        for mode, res in modes.items():
            rows.append({"ratio": s["pd"], "prefill": p, "decode": d, "gpus": s["gpus"], "mode": mode, **res,
                         "kv_handoff_ms": s["kv_handoff_ms"]})
    return pd.DataFrame(rows)
