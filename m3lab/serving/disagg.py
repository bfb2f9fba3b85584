"""Prefill/decode disaggregation: worker ratio, KV hand-off time, and the resulting per-GPU throughput.

A prefill instance (``tp`` GPUs) serves only prompts: its request rate and prefill latency come from
:func:`m3lab.serving.estimate.estimate` with one output token (the scheduler's chunked prefill). A
decode instance holds ``concurrency`` requests decoding from ``isl`` to ``isl + osl`` tokens: its
TPOT is the mean cost of those decode steps. Each request's KV (every layer; ``kv_per_layer``)
travels from prefill to decode over ``pd.kv_link_gbps`` (GB/s per GPU; all ranks in parallel), with a
linear-attention model's fixed recurrent state per request (``state_bytes_per_request``; 0 otherwise).

With P prefill and D decode instances the system serves ``min(P × prefill rate, D × decode rate)``
requests/s; output tokens/s/GPU = that × osl / ((P + D) × tp); TTFT = prefill latency + KV hand-off
(:func:`disaggregated`, a rate bound). :func:`pd_serving` runs the deployment as vLLM serves it, every instance
an engine of the step generator under vllm bench's closed loop behind vLLM's P/D proxy (:mod:`m3lab.serving.pd_sim`);
:func:`pd_estimate` is its summary, what ``m3lab estimate --pd P:D`` prints. Both take the hand-off bytes from the
exact geometry of :mod:`m3lab.pd.geometry` for M3-style caches.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from m3lab.analysis.byte_planes import kv_per_layer
from m3lab.arith import ceil_div
from m3lab.cost.host_time import step_host_us
from m3lab.cost.model import cost_label, resolve_calibration
from m3lab.errors import M3LabError
from m3lab.pd.geometry import pd_plan
from m3lab.serving.cache_capacity import cache_capacity
from m3lab.serving.capacity import block_size_of
from m3lab.serving.estimate import estimate
from m3lab.serving.pd_sim import setup, simulate, whole_requests
from m3lab.serving.step_cost import StepCoster
from m3lab.spec.memory import state_bytes_per_request
from m3lab.spec.quant import load_quant
from m3lab.workload.deployed import ACCEPTANCE_MODEL, acceptance, fake_outputs, fixed_contents
from m3lab.workload.step import EngineStep

DECODE_SAMPLES = 8    # decode contexts sampled between isl and isl + osl


def _decode_step_s(coster, concurrency: int, isl: int, osl: int, mode: str) -> float:
    ctx = np.linspace(isl + 1, isl + osl, DECODE_SAMPLES).round().astype(int)
    return float(np.mean([coster.time_us(EngineStep.decode(concurrency, int(c)), mode) for c in ctx])) * 1e-6


def _handoff_bytes_per_rank(m, plan, quant, isl: int) -> float:
    """Bytes the busiest rank moves for one request: the exact hand-off geometry for M3-style caches
    (:func:`m3lab.pd.geometry.pd_plan`), else per-layer KV bytes per rank plus a linear-attention state."""
    if m.sparse is not None and m.sparse.style == "block" and m.linear is None and m.mla is None:
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


def _role_blocks(d, role: str, block_size: int) -> int:
    """vLLM's ``num_gpu_blocks`` of one instance of ``role`` (its plan, its memory setting)."""
    lim = d.role_limits(role)
    return cache_capacity(d.model, d.role_plan(role), d.quant, d.hardware,
                          gpu_memory_utilization=lim.gpu_memory_utilization,
                          spec_tokens=d.serving.spec_tokens).num_blocks


#: The simulation's per-request times, as the ``requests`` table names them (seconds since the run's start).
REQUEST_COLUMNS = {"send": "send_s", "pre_sched": "prefill_scheduled_s", "pre_out": "prefill_done_s",
                   "kv_at": "kv_arrived_s", "dec_sched": "decode_scheduled_s", "first": "first_token_s",
                   "finish": "finish_s", "ttft": "ttft_s"}


@dataclass
class PDServing:
    """A simulated P:D run: ``summary()`` (figures, notes, hand-off, load), per-request times and TTFT parts
    (``requests``: the :data:`REQUEST_COLUMNS` times, ``queueing_s, prefill_s, handoff_s, first_decode_s``,
    ``tpot_ms``, ``prefill_instance``, ``decode_instance``), and each instance's steps (``engines``: name ->
    DataFrame of start_s, end_s, ...)."""

    summary_: dict
    requests: pd.DataFrame = field(repr=False)
    engines: dict = field(repr=False)

    def summary(self) -> dict:
        return dict(self.summary_)


def pd_serving(deployment, *, calibration="default", progress: bool = False) -> PDServing:
    """``deployment`` served disaggregated (``pd.prefill.instances`` prefill and ``pd.decode.instances`` decode
    instances on their roles' plans and limits) under vllm bench's closed loop, as :mod:`m3lab.serving.pd_sim`
    simulates it: a :class:`PDServing` (its ``summary()`` is what ``m3lab estimate --pd`` prints: the calibrated
    figures where a calibration exists, else the ceiling, the ceiling under ``ceiling``, TTFT's parts, notes, the
    hand-off and the pools' load; ``requests``: per-request times and TTFT parts)."""
    d = deployment.validate()
    if not d.pd.enabled:
        raise M3LabError("the P/D estimate needs prefill and decode instances", field="pd",
                         hint="e.g. --pd 2:1 (2 prefill, 1 decode)")
    fixed_contents(d, what="the P/D estimate")
    m, hw, q, wl = d.model, d.hardware, d.quant, d.workload
    pplan, dplan = d.role_plan("prefill"), d.role_plan("decode")
    accept_len, accept_source = acceptance(d)
    bs = block_size_of(m)
    handoff, _ = pd_plan(m, pplan.tp, dplan.tp, wl.isl, kv_dtype=q.kv_dtype, index_dtype=q.index_dtype,
                         prefill_layout=d.pd.prefill.layout, decode_layout=d.pd.decode.layout,
                         bandwidth=d.pd.kv_link_gbps * 1e9)
    s = setup(d, prefill_blocks=_role_blocks(d, "prefill", bs), decode_blocks=_role_blocks(d, "decode", bs),
              block_size=bs, handoff_s=handoff["transfer_s"], outputs=fake_outputs(d, accept_len))
    for cfg, role in ((s.prefill_cfg, "prefill"), (s.decode_cfg, "decode")):
        need = ceil_div(wl.isl + (1 if role == "prefill" else wl.osl) + cfg.lookahead_tokens, bs)
        if need > cfg.num_kv_blocks - 1:
            raise M3LabError(f"one request needs {need:,} KV blocks but a {role} instance holds "
                             f"{cfg.num_kv_blocks - 1:,}", field="isl", hint=f"raise the {role} role's tp")
    cal = resolve_calibration(hw, calibration)
    pre = StepCoster(dataclasses.replace(d, plan=pplan), cal)   # prefill steps only: no speculative rows
    dec = StepCoster(dataclasses.replace(d, plan=dplan), cal)
    host = step_host_us(m.layers)
    results = {}
    for mode in ("ceiling",) + (("calibrated",) if cal is not None else ()):
        results[mode] = simulate(s, lambda st, mode=mode: pre.time_us(st, mode),
                                 lambda st, mode=mode: dec.time_us(st, mode),
                                 host if mode == "calibrated" else None, progress=progress)
        results[mode]["label"] = cost_label(hw, None if mode == "ceiling" else cal)
    kind = "calibrated" if "calibrated" in results else "ceiling"
    top = results[kind]
    summary = _pd_summary(d, s, results, kind, handoff, cal)
    summary.update(accept_len=accept_len, accept_len_source=accept_source,
                   acceptance_model=ACCEPTANCE_MODEL if d.serving.spec_tokens else None)
    req = pd.DataFrame(top["requests"]).rename(columns=REQUEST_COLUMNS).rename_axis("request").reset_index()
    return PDServing(summary, req, top["engines"])


def _pd_summary(d, s, results: dict, kind: str, handoff: dict, cal) -> dict:
    """What ``m3lab estimate --pd`` prints of a simulated P:D run (figures of ``kind``, the ceiling's nested)."""
    top, wl = results[kind], d.workload
    pplan, dplan = d.role_plan("prefill"), d.role_plan("decode")
    figures = [k for k in top if k not in ("notes", "requests", "engines")]
    pc, dc = s.prefill_cfg, s.decode_cfg
    return {"kind": kind, **{k: top[k] for k in figures}, "notes": top["notes"],
            "ceiling": {k: results["ceiling"][k] for k in figures},
            "pd": f"{s.prefill_instances}:{s.decode_instances}", "prefill_instances": s.prefill_instances,
            "decode_instances": s.decode_instances, "prefill_tp": pplan.tp, "decode_tp": dplan.tp, "ep": dplan.ep,
            "gpus": d.gpus, "model": d.model.name, "hardware": d.hardware.name, "deployment": d.name,
            "deployment_key": d.key(), "quant": d.quant.name, "kv_dtype": d.quant.kv_dtype, "isl": wl.isl,
            "osl": wl.osl, "concurrency": wl.concurrency, "num_requests": wl.num_prompts,
            "routing": "round robin to prefill, then to decode (vLLM's P/D proxy)",
            "prefill_max_num_seqs": pc.max_num_seqs, "prefill_max_num_batched_tokens": pc.max_num_batched_tokens,
            "prefill_kv_blocks": pc.num_kv_blocks, "decode_max_num_seqs": dc.max_num_seqs,
            "decode_max_num_batched_tokens": dc.max_num_batched_tokens, "decode_kv_blocks": dc.num_kv_blocks,
            "max_num_seqs_per_decode_instance": min(dc.max_num_seqs, whole_requests(dc, wl.isl + wl.osl)),
            "kv_handoff_bytes_per_request": handoff["bytes_per_request"],
            "kv_handoff_descriptors_per_request": handoff["descriptors_per_request"],
            "kv_handoff_ms": handoff["transfer_s"] * 1e3, "kv_link_gbps": d.pd.kv_link_gbps,
            "spec_tokens": d.serving.spec_tokens, "calibration": cal.name if cal is not None else None}


def pd_estimate(deployment, *, calibration="default", progress: bool = False) -> dict:
    """:func:`pd_serving`'s summary (what ``m3lab estimate --pd P:D --json`` prints)."""
    return pd_serving(deployment, calibration=calibration, progress=progress).summary()


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
