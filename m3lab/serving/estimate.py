"""Serving estimates: TTFT, TPOT and tokens/s/GPU from the scheduler, timed by the cost model.

``estimate(deployment)`` (a :class:`~m3lab.spec.serving.Deployment`) runs the one engine-step generator
(:class:`m3lab.workload.scheduler.Scheduler`, vLLM v1 continuous batching with chunked prefill at the
deployment's ``max_num_seqs`` / ``max_num_batched_tokens``; closed loop at the workload's ``concurrency``
like ``vllm bench serve --max-concurrency``, ``num_prompts`` requests) and times every step with
:class:`~m3lab.serving.step_cost.StepCoster` under two labelled modes:

- ``ceiling``: the roofline bound of every op (efficiency 1, no launch floors) — an upper bound on
  throughput that a measurement must not beat;
- ``calibrated``: each op timed by the cost source of the kernel vLLM runs for it (``m3lab/cost/README.md``:
  measured tables and peers, named assumptions; default: the hardware's shipped calibration, MI355X <- AITER's).

Per request: TTFT = first token - entry into the system (queueing + chunked prefill), TPOT = (last
token - first token) / (osl - 1). Throughput = all output tokens / makespan / GPUs (as vLLM bench
computes it). Memory: weights per GPU, KV capacity in tokens at ``gpu_memory_utilization``, and the
largest concurrency that fits; a concurrency whose KV does not fit raises M3LabError.

Speculative decoding (``serving.spec_tokens`` K draft tokens per step, ``acceptance.accept_len`` A tokens
emitted per verification step, vLLM's acceptance length, 1 ≤ A ≤ K + 1): decode steps verify K + 1 tokens and a
request needs ceil((osl - 1) / A) of them; the draft costs ``acceptance.draft_cost`` × a plain decode step per
draft token.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from m3lab.errors import M3LabError
from m3lab.serving.capacity import Capacity, block_size_of, capacity
from m3lab.serving.step_cost import StepCoster
from m3lab.workload.deployed import fixed_workload, scheduler_config
from m3lab.workload.scheduler import MIN_REQUESTS_PER_SLOT, Scheduler, SchedulerConfig, Workload


METRICS = (("output tokens/s/GPU", "tok/s/GPU", "output_tokens_per_s_per_gpu"), ("median TTFT", "s", "ttft_s"),
           ("mean TPOT", "ms", "tpot_ms"))


class ShortRunWarning(UserWarning):
    """The simulated run is too short to leave its start-up burst: its TTFT and throughput are not steady state."""


class ArrivalRecordingScheduler(Scheduler):
    """The project's Scheduler, recording the step index at which each request enters the system
    (via the ``arrivals`` hook), so TTFT can include queueing."""

    def __init__(self, config: SchedulerConfig | None = None):
        super().__init__(config)
        self.entered: dict[int, int] = {}

    def arrivals(self, state, workload) -> None:
        before = state.next_request
        super().arrivals(state, workload)
        for rid in range(before, state.next_request):
            self.entered[rid] = state.step_index


@dataclass
class ServingEstimate:
    """Result of :func:`estimate`: per-mode figures, the step timeline, per-request latencies, memory."""

    config: dict
    capacity: Capacity
    results: dict                      # mode -> figures (see summary())
    steps: pd.DataFrame                # one row per scheduler run of identical steps
    requests: pd.DataFrame             # one row per request and mode
    coster: StepCoster = field(repr=False)

    @property
    def kind(self) -> str:
        return "calibrated" if "calibrated" in self.results else "ceiling"

    def summary(self) -> dict:
        """Top-level figures of the calibrated estimate where a calibration exists (else the ceiling), the
        ceiling always nested under ``ceiling``, plus memory and labels (what ``--json`` prints)."""
        top = self.results[self.kind]
        figures = ("output_tokens_per_s_per_gpu", "total_tokens_per_s_per_gpu", "ttft_s", "ttft_mean_s",
                   "tpot_ms", "tpot_median_ms", "makespan_s", "label")
        out = {"kind": self.kind, **{k: top[k] for k in figures}}
        out["ceiling"] = {k: self.results["ceiling"][k] for k in figures}
        cap = self.capacity
        out.update(weight_gb_per_gpu=cap.weight_bytes_per_gpu / 1e9, kv_capacity_tokens=cap.kv_capacity_tokens,
                   kv_bytes_per_token_per_gpu=cap.kv_bytes_per_token_per_gpu, max_concurrency=cap.max_concurrency,
                   state_bytes_per_request_per_gpu=cap.state_bytes_per_request_per_gpu,
                   gpu_memory_utilization=cap.gpu_memory_utilization, distinct_steps_costed=self.coster.distinct_steps)
        out.update({k: v for k, v in self.config.items() if k not in out})
        return out

    def timeline(self, mode: str | None = None) -> pd.DataFrame:
        """Runs of the schedule under ``mode``: ``[index, repeat, decodes, prefill_tokens, start_s, t_ms]``."""
        mode = mode or self.kind
        return self.steps.rename(columns={f"start_s_{mode}": "start_s", f"t_ms_{mode}": "t_ms"})[
            ["index", "repeat", "decodes", "prefill_tokens", "start_s", "t_ms"]]

    def op_totals(self, mode: str | None = None) -> pd.DataFrame:
        """Per-op time and bytes summed over the whole run (for the repetition view)."""
        return self.coster.op_totals(mode or self.kind)


def _cumulative(t0: float, t1: float, repeat: int, j: np.ndarray) -> np.ndarray:
    """Time from a run's start to the end of its step j (steps' times linear from t0 to t1)."""
    slope = (t1 - t0) / (repeat - 1) if repeat > 1 else 0.0
    return (j + 1) * t0 + slope * j * (j + 1) / 2


def _simulate(coster: StepCoster, sched: ArrivalRecordingScheduler, workload: Workload, modes: tuple[str, ...],
              osl_steps: int) -> tuple[pd.DataFrame, dict]:
    """Walk the scheduler's runs once; time them under every mode. Returns (runs table, per-request times)."""
    n = workload.n_requests
    gen = np.zeros(n, np.int64)
    first = {m: np.full(n, np.nan) for m in modes}
    finish = {m: np.full(n, np.nan) for m in modes}
    clock = {m: 0.0 for m in modes}
    start_of: dict[int, dict] = {}
    rows = []
    for run in sched.runs(workload):
        step, repeat = run.step, run.repeat
        start_of[step.index] = dict(clock)
        times = {}
        for m in modes:
            t0 = coster.time_us(step, m, weight=repeat if repeat == 1 else repeat / 2) * 1e-6
            t1 = t0
            if repeat > 1:
                last = type(step)(step.new_tokens, step.context_lens + repeat - 1)
                t1 = coster.time_us(last, m, weight=repeat / 2) * 1e-6
            times[m] = (t0, t1)
        rids = step.req_ids
        decoding = gen[rids] >= 1
        firsts = np.asarray(step.first_token, np.int64)
        for m in modes:
            t0, t1 = times[m]
            if len(firsts):
                first[m][firsts] = clock[m] + t0
            need = osl_steps - gen[rids[decoding]]
            done = need <= repeat
            if done.any():
                finish[m][rids[decoding][done]] = clock[m] + _cumulative(t0, t1, repeat, need[done] - 1)
            if len(firsts):
                one = firsts[osl_steps <= 1]
                finish[m][one] = clock[m] + t0
            clock[m] += repeat * (t0 + t1) / 2
        gen[rids[decoding]] += repeat
        if len(firsts):
            gen[firsts] = 1
        rows.append({"index": step.index, "repeat": repeat, "decodes": int(decoding.sum()),
                     "prefill_tokens": int(step.new_tokens[~decoding].sum()),
                     **{f"start_s_{m}": start_of[step.index][m] for m in modes},
                     **{f"t_ms_{m}": 1e3 * sum(times[m]) / 2 for m in modes}})
    entered = {m: np.array([start_of.get(sched.entered.get(r, 0), {m: 0.0})[m] for r in range(n)]) for m in modes}
    return pd.DataFrame(rows), {"first": first, "finish": finish, "entered": entered, "makespan": clock}


def _figures(req: dict, mode: str, n: int, isl: int, osl: int, gpus: int, label: str) -> dict:
    ttft = req["first"][mode] - req["entered"][mode]
    tpot = (req["finish"][mode] - req["first"][mode]) / max(osl - 1, 1)
    span = req["makespan"][mode]
    return {"kind": mode, "label": label,
            "output_tokens_per_s_per_gpu": n * osl / span / gpus, "total_tokens_per_s_per_gpu": n * (isl + osl) / span / gpus,
            "ttft_s": float(np.nanmedian(ttft)), "ttft_mean_s": float(np.nanmean(ttft)),
            "tpot_ms": float(np.nanmean(tpot) * 1e3), "tpot_median_ms": float(np.nanmedian(tpot) * 1e3),
            "makespan_s": span}


def spec_decode_steps(osl: int, spec_tokens: int, accept_len: float | None) -> int:
    """Output steps a request needs with speculative decoding (``osl`` without); checks both settings."""
    if not spec_tokens:
        if accept_len not in (None, 1, 1.0):
            raise M3LabError("accept_len needs spec_tokens > 0", field="accept_len", hint="pass --spec-tokens K")
        return osl
    if not isinstance(spec_tokens, int) or spec_tokens < 0:
        raise M3LabError(f"spec_tokens={spec_tokens!r} must be a non-negative integer", field="spec_tokens")
    if accept_len is None:
        raise M3LabError(f"spec_tokens={spec_tokens} needs accept_len, the mean tokens accepted per step",
                         field="accept_len", hint=f"set accept_len in [1, {spec_tokens + 1}] (--accept-len A) and "
                                                  "its traffic (accept_dataset); published for EAGLE3 on M3 with 3 "
                                                  "draft tokens: 2.70 on MT-Bench (m3lab.pd.speculation)")
    if not isinstance(accept_len, (int, float)) or not 1 <= accept_len <= spec_tokens + 1:
        raise M3LabError(f"accept_len={accept_len!r} must lie in [1, spec_tokens + 1 = {spec_tokens + 1}]",
                         field="accept_len", hint="vLLM's mean acceptance length counts the bonus token")
    return 1 + math.ceil((osl - 1) / accept_len)


def estimate(deployment, *, calibration="default", routing=None) -> ServingEstimate:
    """Estimate serving ``deployment`` (a :class:`~m3lab.spec.serving.Deployment` with a fixed-length workload;
    see the module docstring). ``calibration``: "default" (the hardware's shipped one, if any), None (ceiling
    only), a shipped name, a CSV path or a Calibration. ``routing``: the MoE routing model (None: balanced).
    Requests simulated: ``workload.num_prompts``; fewer than ``MIN_REQUESTS_PER_SLOT`` x concurrency warns
    (:class:`ShortRunWarning`): the run would not reach steady state."""
    from m3lab.cost.model import cost_label, resolve_calibration

    d = deployment.validate()
    m, hw, plan, q, wl = d.model, d.hardware, d.plan, d.quant, d.workload
    spec_tokens, accept_len = d.serving.spec_tokens, d.acceptance.accept_len
    limits = d.scheduler_limits()
    osl_steps = spec_decode_steps(wl.osl, spec_tokens, accept_len)
    workload = fixed_workload(d, osl=osl_steps, what="the serving estimate")
    cal = resolve_calibration(hw, calibration)
    cap = capacity(m, plan, q, hw, isl=wl.isl, osl=wl.osl, gpu_memory_utilization=limits.gpu_memory_utilization,
                   spec_tokens=spec_tokens)
    cap.check(wl.concurrency)
    n_req, conc = wl.num_prompts, wl.concurrency
    steady = n_req >= MIN_REQUESTS_PER_SLOT * conc
    if not steady:
        warnings.warn(ShortRunWarning(
            f"num_prompts {n_req} < {MIN_REQUESTS_PER_SLOT} x concurrency {conc}: the run does not reach "
            f"steady state, so TTFT and throughput are start-up figures"), stacklevel=2)
    sched = ArrivalRecordingScheduler(scheduler_config(d, block_size=block_size_of(m)))
    coster = StepCoster(d, cal, routing)
    modes = ("ceiling",) + (("calibrated",) if cal is not None else ())
    runs, req = _simulate(coster, sched, workload, modes, osl_steps)
    gpus = plan.world
    results = {mode: _figures(req, mode, n_req, wl.isl, wl.osl, gpus,
                              cost_label(hw, None if mode == "ceiling" else cal)) for mode in modes}
    requests = pd.concat([pd.DataFrame({"mode": mode, "request": np.arange(n_req), "entered_s": req["entered"][mode],
                                        "first_token_s": req["first"][mode], "finish_s": req["finish"][mode]})
                          for mode in modes], ignore_index=True)
    requests["ttft_s"] = requests["first_token_s"] - requests["entered_s"]
    requests["tpot_ms"] = (requests["finish_s"] - requests["first_token_s"]) / max(wl.osl - 1, 1) * 1e3
    config = {"deployment": d.name, "deployment_key": d.key(), "model": m.name, "hardware": hw.name, "tp": plan.tp,
              "ep": plan.ep, "gpus": gpus, "quant": q.name, "kv_dtype": q.kv_dtype, "index_dtype": q.index_dtype,
              "index_topk_freq": d.index_sharing_freq, "isl": wl.isl, "osl": wl.osl, "concurrency": conc,
              "num_requests": n_req, "steady_state": steady, "max_num_seqs": limits.max_num_seqs,
              "max_num_batched_tokens": limits.max_num_batched_tokens, "spec_tokens": spec_tokens,
              "accept_len": accept_len, "accept_len_source": d.acceptance.source(),
              "calibration": cal.name if cal is not None else None,
              "routing": "balanced" if routing is None else str(routing)}
    return ServingEstimate(config=config, capacity=cap, results=results, steps=runs, requests=requests, coster=coster)


def compare_with_measured(est: ServingEstimate, measured: dict | None) -> pd.DataFrame:
    """The estimate per metric (``ceiling``, ``calibrated``), with ``measured`` beside it when given.

    ``measured`` has any of ``output_tokens_per_s_per_gpu``, ``ttft_s`` (median), ``tpot_ms`` (mean); it must be a
    measurement of the same deployment (see :func:`compare_with_published`). ``measured_over_ceiling`` is the
    throughput's efficiency against the roofline (below 1); latency rows have none (lower is better there)."""
    rows = []
    for metric, unit, key in METRICS:
        if measured is not None and key not in measured:
            continue
        row = {"metric": metric, "unit": unit}
        if measured is not None:
            row["measured"] = float(measured[key])
        for mode, res in est.results.items():
            row[mode] = res[key]
        if measured is not None:
            row["measured_over_ceiling"] = (row["measured"] / row["ceiling"] if key == "output_tokens_per_s_per_gpu"
                                            else float("nan"))
        rows.append(row)
    return pd.DataFrame(rows)


def compare_with_published(est: ServingEstimate) -> pd.DataFrame:
    """:func:`compare_with_measured` against the published measurement of exactly this deployment (model, quant,
    KV dtype, hardware, TP/EP, ISL/OSL, concurrency, speculative config), or the estimate alone when none exists."""
    from m3lab.published import measurement_for

    found = measurement_for(est.config)
    return compare_with_measured(est, found["after"] if found else None)


def comparison_title(est: ServingEstimate) -> str:
    """The title of the :func:`compare_with_published` figure: says "measured" only when a measurement exists."""
    from m3lab.published import measurement_for

    c = est.config
    case = f"{c['model']} {c['quant']} TP{c['tp']} c={c['concurrency']}, {c['isl']} in / {c['osl']} out"
    found = measurement_for(c)
    if found:
        return f"{case}: measured on {found['hardware'].upper()} (published) vs projected for {c['hardware']}"
    return (f"{case}: projected for {c['hardware']} ({', '.join(est.results)}); no measurement of this "
            f"deployment exists")


def sweep(deployment, concurrencies, *, calibration="default", routing=None) -> pd.DataFrame:
    """Estimates of ``deployment`` at each of ``concurrencies``: one row per (concurrency, mode) with ``source`` =
    the mode's name (for ``m3lab.plots.serving``)."""
    rows = []
    for c in concurrencies:
        est = estimate(deployment.with_settings({"concurrency": int(c)}), calibration=calibration, routing=routing)
        for mode, res in est.results.items():
            rows.append({"source": mode, "concurrency": int(c), **{k: v for k, v in res.items() if k != "kind"}})
    return pd.DataFrame(rows)


def add_published(table: pd.DataFrame, config: dict) -> pd.DataFrame:
    """``table`` (from :func:`sweep` of the deployment ``config``) plus a row for every concurrency of it that has
    a published measurement of exactly that deployment (source names who measured it, on what)."""
    from m3lab.published import measurement_for

    rows = []
    for c in sorted(set(table["concurrency"])):
        found = measurement_for({**config, "concurrency": int(c)})
        if found:
            rows.append({"source": f"measured ({found['hardware'].upper()}, published)", "concurrency": int(c),
                         **found["after"]})
    return pd.concat([table, pd.DataFrame(rows)], ignore_index=True) if rows else table
