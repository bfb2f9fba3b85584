"""Serving estimates: TTFT, TPOT and tokens/s/GPU as ``vllm bench serve`` measures them, timed by the cost model.

``estimate(deployment)`` (a :class:`~m3lab.spec.serving.Deployment` with a fixed-length workload) runs vllm bench's
closed loop (``--max-concurrency C --num-prompts N --request-rate inf``, :mod:`m3lab.serving.bench_load`) through
the one engine-step generator (:meth:`m3lab.workload.scheduler.Scheduler.records`, proven equal to vLLM's own
scheduler; ``engine="vllm"`` runs vLLM's class itself) on the deployment's engine (:func:`m3lab.workload.deployed.
scheduler_config`: ``max_num_seqs``, ``max_num_batched_tokens``, chunked prefill, prefix caching, async scheduling,
speculative method and k with exact draft verification, and the KV blocks its memory leaves), then times every
step under two labelled modes:

- ``ceiling``: device time only, the roofline bound of every op (efficiency 1, no launch floors) — an upper
  bound on throughput that a measurement must not beat;
- ``calibrated``: each op timed by the cost source of the kernel vLLM runs for it (``m3lab/cost/README.md``:
  measured tables and peers, named assumptions; default: the hardware's shipped calibration, MI355X <- AITER's),
  plus the host time of each step (:mod:`m3lab.cost.host_time`: schedule, input preparation, launches, output
  processing) overlapped with the device as the engine's sync or async scheduling allows
  (:mod:`m3lab.serving.timeline`).

Figures as vllm bench computes them (``calculate_metrics``): TTFT from send to first token with the server's
queueing included (median, mean, p90, p99), TPOT mean (latency - TTFT) / (output - 1), ITL, throughput per GPU;
``queueing_s`` is the median wait before a request's first scheduled chunk, ``prefill_s`` the median from there
to its first token; ``makespan_s`` is vllm bench's duration and ``device_s`` the device's busy time in it (the sum
of the step times the cost model gives: what per-op totals add up to). Notes say when C requests cannot run at
once (slots or KV), when the run is too short for steady state and which TTFT percentiles the start-up burst
sets. ``host_time_sensitivity`` re-times the same schedule with every host time scaled (the host constants are
upper bounds: ``HOST_SCALES``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from m3lab.arith import ceil_div
from m3lab.cost.host_time import step_host_us
from m3lab.cost.model import cost_label
from m3lab.errors import M3LabError
from m3lab.serving.bench_load import BenchRun, engine_steps, simulate_records, stretch_runs, time_records
from m3lab.serving.capacity import Capacity, block_size_of, capacity
from m3lab.serving.step_cost import StepCoster
from m3lab.workload.deployed import ACCEPTANCE_MODEL, acceptance, fake_outputs, fixed_contents, scheduler_config
from m3lab.workload.requests import first_divergence
from m3lab.workload.step import EngineStep

METRICS = (("output tokens/s/GPU", "tok/s/GPU", "output_tokens_per_s_per_gpu"), ("median TTFT", "s", "ttft_s"),
           ("mean TPOT", "ms", "tpot_ms"))
#: Host-time scales of the sensitivity: the constants as measured (upper bounds: a loaded 2-core box, a trace
#: recorded with Python stacks) down to none (an engine whose host work never shows).
HOST_SCALES = (0.0, 0.25, 1.0)
#: The figures each mode reports (``ServingEstimate.summary``; the ceiling's nested under ``ceiling``).
FIGURES = ("output_tokens_per_s_per_gpu", "total_tokens_per_s_per_gpu", "ttft_s", "ttft_mean_s", "ttft_p90_s",
           "ttft_p99_s", "tpot_ms", "tpot_median_ms", "tpot_p90_ms", "tpot_p99_ms", "itl_ms", "itl_median_ms",
           "e2el_s", "queueing_s", "prefill_s", "makespan_s", "device_s", "label")


@dataclass
class ServingEstimate:
    """Result of :func:`estimate`: per-mode figures and vllm bench runs, the step table, per-request latencies."""

    config: dict
    capacity: Capacity
    results: dict                      # mode -> figures (see summary())
    runs: dict = field(repr=False)     # mode -> BenchRun (per step and per request tables)
    coster: StepCoster = field(repr=False)
    notes: list = field(default_factory=list)
    host_sensitivity: list = field(default_factory=list)
    engine_check: dict | None = None
    step_keys: list = field(default_factory=list, repr=False)   # the coster's key of each step (None: none ran)
    deployment: object = field(default=None, repr=False)       # the Deployment estimated

    def retimed(self, key_us, mode: str = "calibrated") -> BenchRun:
        """The same schedule under ``mode`` with each step's device µs from ``key_us(key)`` (a key of
        ``step_keys``: e.g. the cost model with an assumption moved), through the same timeline and metrics: what
        an estimate with that cost model would report, exactly."""
        return self.runs[mode].retime(1.0, self._device(key_us))

    def retimed_rate(self, key_us, mode: str = "calibrated") -> float:
        """Output tokens/s per GPU of :meth:`retimed` (the same figure of its summary, without the other metrics)."""
        return self.runs[mode].output_rate(self._device(key_us))

    def _device(self, key_us) -> np.ndarray:
        return np.array([float(key_us(k)) if k is not None else 0.0 for k in self.step_keys])

    @property
    def kind(self) -> str:
        return "calibrated" if "calibrated" in self.results else "ceiling"

    @property
    def steps(self) -> pd.DataFrame:
        """One row per executed step of the reported mode: ``index, repeat (1), decodes, prefill_tokens, start_s,
        end_s, output_s, t_ms, running, waiting, kv_usage, ...`` (see :mod:`m3lab.serving.timeline`)."""
        return self.runs[self.kind].steps

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request and mode: send, first scheduled, first token and finish times, TTFT, TPOT."""
        return pd.concat([run.requests.assign(mode=mode) for mode, run in self.runs.items()], ignore_index=True)

    def summary(self) -> dict:
        """Top-level figures of the calibrated estimate where a calibration exists (else the ceiling), the
        ceiling always nested under ``ceiling``, plus notes, host-time sensitivity, memory and labels (what
        ``--json`` prints)."""
        top = self.results[self.kind]
        out = {"kind": self.kind, **{k: top[k] for k in FIGURES}}
        out["ceiling"] = {k: self.results["ceiling"][k] for k in FIGURES}
        out["notes"] = list(self.notes)
        out["host_time_sensitivity"] = list(self.host_sensitivity)
        if self.engine_check is not None:
            out["engine_check"] = dict(self.engine_check)
        cap = self.capacity
        out.update(weight_gb_per_gpu=cap.weight_bytes_per_gpu / 1e9, kv_capacity_tokens=cap.kv_capacity_tokens,
                   kv_bytes_per_token_per_gpu=cap.kv_bytes_per_token_per_gpu, max_concurrency=cap.max_concurrency,
                   state_bytes_per_request_per_gpu=cap.state_bytes_per_request_per_gpu,
                   gpu_memory_utilization=cap.gpu_memory_utilization, distinct_steps_costed=self.coster.distinct_steps)
        out.update({k: v for k, v in self.config.items() if k not in out})
        return out

    def ttft_parts(self, mode: str | None = None) -> pd.DataFrame:
        """Per request of ``mode``: ``send_s, queueing_s`` (to its first scheduled chunk), ``prefill_s`` (from there
        to its first token), ``ttft_s, first_token_s, tpot_ms``."""
        req = self.runs[mode or self.kind].requests
        return req.assign(prefill_s=req["first_token_s"] - req["first_scheduled_s"])[
            ["request", "send_s", "queueing_s", "prefill_s", "ttft_s", "first_token_s", "tpot_ms"]]

    def timeline(self, mode: str | None = None) -> pd.DataFrame:
        """Steps of the schedule under ``mode``: ``[index, repeat, decodes, prefill_tokens, start_s, t_ms]``."""
        return self.runs[mode or self.kind].steps[["index", "repeat", "decodes", "prefill_tokens", "start_s", "t_ms"]]

    def op_totals(self, mode: str | None = None) -> pd.DataFrame:
        """Per-op time and bytes summed over the whole run (for the repetition view)."""
        return self.coster.op_totals(mode or self.kind)


def _figures(run: BenchRun, mode: str, label: str) -> dict:
    s = run.summary()
    return {"kind": mode, "label": label, **{k: s[k] for k in FIGURES if k in s}, "makespan_s": s["duration_s"],
            "device_s": float(run.steps["device_us"].sum()) * 1e-6}


def _kv_blocks(cap: Capacity, cfg, isl: int, osl: int) -> int:
    """vLLM's ``num_gpu_blocks`` (null block included) of the KV capacity; refuses a request that never fits."""
    blocks = cap.kv_capacity_tokens // cap.block_size
    need = ceil_div(isl + osl + cfg.lookahead_tokens, cap.block_size)
    if need > blocks - 1:
        raise M3LabError(f"one request of {isl} + {osl} tokens needs {need:,} KV blocks of {cap.block_size} per GPU "
                         f"but only {blocks - 1:,} fit at gpu_memory_utilization {cap.gpu_memory_utilization} "
                         f"(weights {cap.weight_bytes_per_gpu / 1e9:.1f} GB/GPU)", field="isl",
                         hint="shorten the request, raise tp, or use an fp8 KV cache (--kv-dtype fp8); the largest "
                              f"concurrency that fits whole is {cap.max_concurrency}")
    return blocks


def _engine_check(cfg, contents, conc: int, outputs, records: list, m3lab_s: float, progress: bool) -> tuple:
    """vLLM's own scheduler on the same run: (its records, how much slower it is and whether it agrees)."""
    from m3lab.vllm.scheduler_judge import warm_up     # heavy, optional (vLLM)

    t0 = time.perf_counter()
    warm_up()
    t1 = time.perf_counter()
    theirs = simulate_records(cfg, contents, conc, engine="vllm", outputs=outputs, progress=progress)
    t2 = time.perf_counter()
    diff = first_divergence(records, theirs)
    return theirs, {"m3lab_s": m3lab_s, "vllm_s": t2 - t1, "vllm_import_s": t1 - t0,
                    "vllm_over_m3lab": (t2 - t1) / max(m3lab_s, 1e-9), "same_schedule": diff is None,
                    "first_divergence": diff, "measured_on": "this machine (wall time)"}


def _device_us(coster: StepCoster, records: list, prompt, modes: tuple) -> tuple[dict, list]:
    """Device µs of each record's step under each mode: the coster times each distinct step key once, weighted by
    how many steps share it (its per-op totals and the sensitivity table count every step). Along a decode
    stretch the key (decode count, bucket of the mean context) can only step up, so its boundaries are found by
    bisection instead of keying every step (``tests/test_serving_estimate.py`` checks it against every step).
    Returns ({mode: µs per record}, the coster's key of each record's step, None where nothing ran)."""
    keys: list = [None] * len(records)
    first: dict = {}
    for i, k in stretch_runs(records):
        if k - i == 1:
            st = records[i].engine_step(prompt, i) if records[i].scheduled else None
            keys[i] = coster.key(st) if st is not None else None
            if st is not None:
                first.setdefault(keys[i], st)
        else:
            _stretch_keys(coster, records[i].stretch, i, k, keys, first)
    counts: dict = {}
    for key in keys:
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    out = {}
    for mode in modes:
        t = {key: coster.time_us(st, mode, weight=counts[key]) for key, st in first.items()}
        out[mode] = np.array([t[key] if key is not None else 0.0 for key in keys])
    return out, keys


def _stretch_keys(coster: StepCoster, stretch: tuple, i: int, k: int, keys: list, first: dict) -> None:
    """Keys of records ``i .. k - 1``, one decode stretch (requests ``ids`` computed ``c0 + j`` before step j)."""
    ids, c0, j0 = stretch
    n = len(ids)

    def step(j: int) -> EngineStep:
        return EngineStep(np.ones(n, np.int64), c0 + j + 1, decode_mask=np.ones(n, bool))

    def fill(lo: int, hi: int, klo, khi) -> None:            # keys[lo] = klo and keys[hi] = khi are known
        if klo == khi:
            keys[lo:hi + 1] = [klo] * (hi - lo + 1)
            return
        if hi - lo == 1:
            keys[lo], keys[hi] = klo, khi
            return
        mid = (lo + hi) // 2
        st = step(j0 + mid - i)
        kmid = coster.key(st)
        first.setdefault(kmid, st)
        fill(lo, mid, klo, kmid)
        fill(mid, hi, kmid, khi)

    s_lo, s_hi = step(j0), step(j0 + k - 1 - i)
    k_lo, k_hi = coster.key(s_lo), coster.key(s_hi)
    first.setdefault(k_lo, s_lo)
    first.setdefault(k_hi, s_hi)
    fill(i, k - 1, k_lo, k_hi)


def _host_sensitivity(run: BenchRun) -> list[dict]:
    rows = []
    for f in HOST_SCALES:
        s = run.retime(f).summary() if f != 1.0 else run.summary()
        rows.append({"host_scale": f, "ttft_s": s["ttft_s"], "tpot_ms": s["tpot_ms"], "itl_ms": s["itl_ms"],
                     "output_tokens_per_s_per_gpu": s["output_tokens_per_s_per_gpu"]})
    return rows


def _label(hw, cal, mode: str, op_overrides) -> str:
    """The cost label of ``mode``'s figures: the hardware profile and calibration, and any per-op overrides."""
    label = cost_label(hw, None if mode == "ceiling" else cal)
    if mode == "calibrated" and op_overrides:
        label += "; per-op overrides: " + "; ".join(o.label or o.name for o in op_overrides)
    return label


def estimate(deployment, *, calibration="default", routing=None, engine: str = "m3lab",
             progress: bool = False, op_overrides=()) -> ServingEstimate:
    """Estimate serving ``deployment`` (a :class:`~m3lab.spec.serving.Deployment` with a fixed-length workload;
    see the module docstring). ``calibration``: "default" (the hardware's shipped one, if any), None (ceiling
    only), a shipped name, a CSV path or a Calibration. ``routing``: the MoE routing model (None: balanced).
    ``engine``: ``m3lab`` (the step generator) or ``vllm`` (vLLM's own scheduler runs the schedule; the estimate
    then says how much slower it is and whether both agree). ``progress``: a bar on long runs. ``op_overrides``:
    per-op overrides of the calibrated cost (:mod:`m3lab.cost.overrides`; their labels join the estimate's)."""
    from m3lab.cost.model import resolve_calibration

    d = deployment.validate()
    m, hw, plan, q, wl = d.model, d.hardware, d.plan, d.quant, d.workload
    spec_tokens = d.serving.spec_tokens
    accept_len, accept_source = acceptance(d)
    contents = fixed_contents(d, what="the serving estimate")
    limits = d.scheduler_limits()
    cal = resolve_calibration(hw, calibration)
    coster = StepCoster(d, cal, routing, op_overrides=tuple(op_overrides))  # vLLM refusing it stops here
    plan = coster.plan                     # local widths as vLLM runs it (index q replicated under indexer CP)
    cap = capacity(m, plan, q, hw, isl=wl.isl, osl=wl.osl, gpu_memory_utilization=limits.gpu_memory_utilization,
                   spec_tokens=spec_tokens)
    cfg = scheduler_config(d, block_size=block_size_of(m))
    cfg = cfg.replace(num_kv_blocks=_kv_blocks(cap, cfg, wl.isl, wl.osl))
    outputs = fake_outputs(d, accept_len)
    conc = wl.concurrency
    t0 = time.perf_counter()
    records = simulate_records(cfg, contents, conc, outputs=outputs, progress=progress)
    m3lab_s = time.perf_counter() - t0
    check = None
    if engine != "m3lab":
        records, check = _engine_check(cfg, contents, conc, outputs, records, m3lab_s, progress)
    modes = ("ceiling",) + (("calibrated",) if cal is not None else ())
    host = step_host_us(m.layers)
    steps = engine_steps(records, contents.prompt, per_record=False)
    device, keys = _device_us(coster, records, contents.prompt, modes)
    runs, results = {}, {}
    for mode in modes:
        runs[mode] = time_records(records, cfg, contents, device[mode], max_concurrency=conc,
                                  host_us=host if mode == "calibrated" else None, gpus=plan.world, engine=engine,
                                  seconds=m3lab_s, steps=steps)
        results[mode] = _figures(runs[mode], mode, _label(hw, cal, mode, op_overrides))
    top = runs["calibrated" if cal is not None else "ceiling"]
    config = {"deployment": d.name, "deployment_key": d.key(), "model": m.name, "hardware": hw.name, "tp": plan.tp,
              "ep": plan.ep, "gpus": plan.world, "quant": q.name, "kv_dtype": q.kv_dtype, "index_dtype": q.index_dtype,
              "index_topk_freq": d.index_sharing_freq, "isl": wl.isl, "osl": wl.osl, "concurrency": conc,
              "num_requests": wl.num_prompts, "steady_state": not any("steady state" in n for n in top.notes),
              "max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
              "num_kv_blocks": cfg.num_kv_blocks, "prefix_caching": cfg.prefix_caching,
              "async_scheduling": cfg.async_scheduling, "spec_method": d.serving.spec_method,
              "spec_tokens": spec_tokens, "accept_len": accept_len, "accept_len_source": accept_source,
              "acceptance_model": ACCEPTANCE_MODEL if spec_tokens else None, "engine": engine,
              "steps": top.config["steps"], "schedule_s": m3lab_s,
              "calibration": cal.name if cal is not None else None,
              "op_overrides": [o.name for o in op_overrides] if cal is not None else [],
              "routing": "balanced" if routing is None else str(routing)}
    return ServingEstimate(config=config, capacity=cap, results=results, runs=runs, coster=coster,
                           notes=list(top.notes) + _kv_dtype_hint(d, plan, cap, limits), host_sensitivity=_host_sensitivity(runs["calibrated"])
                           if "calibrated" in runs else [], engine_check=check, step_keys=keys,
                           deployment=d)


def _kv_dtype_hint(d, plan, cap, limits) -> list[str]:
    """A one-line hint when the KV cache holds fewer than C whole sequences and an fp8 KV cache would hold more."""
    wl, q = d.workload, d.quant
    if cap.max_concurrency >= wl.concurrency or q.kv_dtype == "fp8":
        return []
    fp8 = capacity(d.model, plan, q.with_cache(kv_dtype="fp8"), d.hardware, isl=wl.isl, osl=wl.osl,
                   gpu_memory_utilization=limits.gpu_memory_utilization, spec_tokens=d.serving.spec_tokens)
    if fp8.max_concurrency <= cap.max_concurrency:
        return []
    return [f"with an fp8 KV cache (--kv-dtype fp8, or --set kv_dtype=fp8) about {fp8.max_concurrency} whole "
            f"sequences fit instead of {cap.max_concurrency}"]


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
    """:func:`compare_with_measured` against the published measurement of exactly this deployment (every field of
    the record, vLLM's switches included: :func:`m3lab.published.measurement_for`), or the estimate alone when
    none exists."""
    from m3lab.published import measurement_for

    found = measurement_for(est.deployment)
    return compare_with_measured(est, found["figures"] if found else None)


def comparison_title(est: ServingEstimate) -> str:
    """The title of the :func:`compare_with_published` figure: says "measured" only when a measurement exists."""
    from m3lab.published import measurement_for

    c = est.config
    case = (f"{c['deployment']}: {c['model']} {c['quant']} TP{c['tp']} c={c['concurrency']}, {c['isl']} in / "
            f"{c['osl']} out")
    found = measurement_for(est.deployment)
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


def add_published(table: pd.DataFrame, deployment) -> pd.DataFrame:
    """``table`` (from :func:`sweep` of ``deployment``) plus a row for every concurrency of it that has a published
    measurement of exactly that deployment (source names who measured it, on what)."""
    from m3lab.published import measurement_for

    rows = []
    for c in sorted(set(table["concurrency"])):
        found = measurement_for(deployment.with_settings({"concurrency": int(c)}))
        if found:
            rows.append({"source": f"measured ({found['hardware'].upper()}, published)", "concurrency": int(c),
                         **found["figures"]})
    return pd.concat([table, pd.DataFrame(rows)], ignore_index=True) if rows else table
