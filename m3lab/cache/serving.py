"""Serving a session workload end to end: the cached scheduler timed by the cost model.

:func:`cached_serving` runs :class:`~m3lab.cache.scheduler.CachedScheduler` over a trace (default: the
AgentX-like generator, :mod:`m3lab.cache.agentic`) on one replica: KV capacity per rank from the
hardware memory, the weights and the KV + index bytes per token at ``gpu_memory_utilization``
(:mod:`m3lab.cache.capacity`), vLLM's prefix caching and preemption, and every step timed by
:class:`~m3lab.serving.step_cost.StepCoster` (calibrated where the hardware has a calibration, else the
ceiling). It returns per-request TTFT and TPOT (p50 / p90 / p99), the prefix-cache hit rate as vLLM counts
it, KV cache usage as vLLM reports it (time-weighted mean and peak of ``1 - free / (blocks - 1)``),
queue lengths over time, and output tokens/s/GPU over the run.

TTFT = first token - arrival in the waiting queue; TPOT = (last token - first token) / (output - 1) for
requests with more than one output token. With speculative decoding (``spec_tokens`` K, ``accept_len``
A), a request needs ``1 + ceil((output - 1) / A)`` decode steps, each verifying K + 1 tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from m3lab.cache.capacity import cache_capacity
from m3lab.cache.replay import M3LabKVCache
from m3lab.cache.scheduler import CachedScheduler
from m3lab.cache.trace import Trace
from m3lab.errors import M3LabError
from m3lab.workload.scheduler import SchedulerConfig

EAGLE3_ACCEPT_LEN = 2.7     # assumed tokens per verification step for EAGLE3 with K = 3 (bonus token included)
DEFAULT_SESSIONS_PER_SLOT = 1   # sessions simulated per concurrent session slot by default
STEP_QUANTUM = 1.25         # steps are costed at contexts / chunks / decode counts (> 8) rounded to 25% apart:
                            # a session run has tens of thousands of distinct steps, each new one costs an OpTable;
                            # on 60 random M3 TP4 steps: median 4%, max 12% from the exact StepCoster time


class CoarseStepTime:
    """Step time (s) from a :class:`~m3lab.serving.step_cost.StepCoster`, memoised on a coarse key: decode count
    (exact up to 8, then ``STEP_QUANTUM`` apart), mean decode context and each prefill chunk and context rounded
    ``STEP_QUANTUM`` apart; the coster times one representative step per key."""

    def __init__(self, coster, mode: str):
        self.coster, self.mode = coster, mode
        self.memo: dict = {}
        self.log_q = np.log(STEP_QUANTUM)

    def _b(self, x) -> np.ndarray:
        return np.rint(np.log(np.maximum(np.asarray(x, float), 1.0)) / self.log_q).astype(np.int64)

    def _u(self, b) -> np.ndarray:
        return np.maximum(np.rint(STEP_QUANTUM ** np.asarray(b, float)), 1).astype(np.int64)

    def __call__(self, step) -> float:
        dec = step.is_decode
        nd = int(dec.sum())
        nd_key = nd if nd <= 8 else -int(self._b(nd))
        kd = int(self._b(step.context_lens[dec].mean())) if nd else 0
        bn, bc = self._b(step.new_tokens[~dec]), self._b(step.context_lens[~dec])
        key = (nd_key, kd, tuple(sorted(zip(bn.tolist(), bc.tolist()))))
        t = self.memo.get(key)
        if t is None:
            from m3lab.workload.step import EngineStep
            n_dec = nd if nd <= 8 else int(self._u(-nd_key))
            pre_n, pre_c = self._u(bn), self._u(bc)
            new = np.concatenate([np.ones(n_dec, np.int64), pre_n])
            ctx = np.concatenate([np.full(n_dec, int(self._u(kd)) if nd else 1, np.int64), np.maximum(pre_c, pre_n)])
            rep = EngineStep(new, ctx, decode_mask=np.arange(len(new)) < n_dec)
            t = self.memo[key] = self.coster.time_us(rep, self.mode) * 1e-6
        return t


@dataclass
class CachedServing:
    """Result of :func:`cached_serving`."""

    config: dict
    summary_: dict
    requests: pd.DataFrame = field(repr=False)       # one row per request
    timeline: pd.DataFrame = field(repr=False)       # one row per engine step
    cache_stats: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return dict(self.summary_)


def _pct(x: np.ndarray, q: float) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if len(x) else None


def spec_steps(output: np.ndarray, spec_tokens: int, accept_len: float | None) -> np.ndarray:
    """Decode steps per request: ``output`` without speculation, else ``1 + ceil((output - 1) / A)``."""
    if not spec_tokens:
        return np.asarray(output, np.int64)
    if accept_len is None or not 1 <= accept_len <= spec_tokens + 1:
        raise M3LabError(f"accept_len={accept_len!r} must lie in [1, spec_tokens + 1 = {spec_tokens + 1}]",
                         field="accept_len")
    return 1 + np.ceil((np.asarray(output) - 1) / accept_len).astype(np.int64)


def cached_serving(model="minimax-m3", hardware="mi355x", *, tp: int = 4, ep: int = 1, quant="mxfp4",
                   kv_dtype: str | None = None, concurrency: int = 28, trace: Trace | None = None,
                   sessions: int | None = None, seed: int = 0, spec_tokens: int = 0, accept_len: float | None = None,
                   calibration="default", gpu_memory_utilization: float = 0.9, policy: str = "lru",
                   max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                   capacity_tokens: int | None = None) -> CachedServing:
    """Serve ``trace`` (default: ``sessions`` AgentX-like sessions, ``concurrency`` of them at a time)."""
    from m3lab.cost.model import cost_label, resolve_calibration
    from m3lab.serving.step_cost import StepCoster
    from m3lab.spec.hardware import load_hardware
    from m3lab.spec.model import load_model
    from m3lab.spec.plan import ParallelPlan
    from m3lab.spec.quant import load_quant

    m, hw = load_model(model), load_hardware(hardware)
    plan = ParallelPlan(tp=tp, ep=ep).validate(m)
    q = load_quant(quant)
    if kv_dtype is not None:
        q = q.with_cache(kv_dtype=kv_dtype)
    accept_source = "given"
    if spec_tokens and accept_len is None:
        if spec_tokens != 3:
            raise M3LabError("accept_len is needed with spec_tokens other than 3", field="accept_len",
                             hint="pass --accept-len A (mean tokens per verification step, bonus included)")
        accept_len, accept_source = EAGLE3_ACCEPT_LEN, "assumed"
    cap = cache_capacity(m, plan, q, hw, gpu_memory_utilization=gpu_memory_utilization, spec_tokens=spec_tokens)
    if capacity_tokens is not None:
        cap = cap.with_tokens(capacity_tokens)
    if trace is None:
        from m3lab.cache.agentic import generate
        trace = generate(sessions=sessions or DEFAULT_SESSIONS_PER_SLOT * concurrency, seed=seed,
                         block_size=cap.block_size)
    elif trace.block_size != cap.block_size:
        raise M3LabError(f"the trace is keyed in {trace.block_size}-token blocks but {m.name} uses {cap.block_size}",
                         field="block_size")
    cal = resolve_calibration(hw, calibration)
    calibration_name = cal.name if cal is not None else None
    mode = "calibrated" if cal is not None else "ceiling"
    coster = StepCoster(m, plan, q, hw, cal, None, spec_tokens=spec_tokens)
    steps = spec_steps(trace.output, spec_tokens, accept_len)
    kv = M3LabKVCache(cap.num_blocks, cap.block_size, policy, use_eagle=bool(spec_tokens))
    sched = CachedScheduler(trace, kv, SchedulerConfig(max_num_seqs=max_num_seqs,
                                                       max_num_batched_tokens=max_num_batched_tokens,
                                                       block_size=cap.block_size),
                            step_time=CoarseStepTime(coster, mode), concurrency=concurrency,
                            output_steps=steps, spec_tokens=spec_tokens)
    n = len(trace)
    first, finish = np.full(n, np.nan), np.full(n, np.nan)
    for run in sched.runs(sched.workload()):
        clock = sched.last_state.clock
        if run.step.first_token:
            first[list(run.step.first_token)] = clock
        if run.finished:
            finish[list(run.finished)] = clock
    state = sched.last_state
    makespan = state.clock
    ttft = first - sched.arrived
    out = trace.output.astype(float)
    tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), np.nan)
    tl = pd.DataFrame(sched.timeline)
    dt = np.diff(np.append(tl["time_s"].to_numpy(), makespan)) if len(tl) else np.zeros(0)
    usage = tl["kv_usage"].to_numpy(float) if len(tl) else np.zeros(0)
    st = kv.stats
    gpus = plan.world
    summary = {
        "workload": trace.meta.get("format", "trace"), "sessions": trace.num_sessions, "requests": n,
        "concurrency": concurrency, "kind": mode, "label": cost_label(hw, cal),
        "output_tokens_per_s_per_gpu": float(trace.output.sum() / makespan / gpus) if makespan else None,
        "total_tokens_per_s_per_gpu": float((trace.output.sum() + trace.prompt.sum()) / makespan / gpus)
        if makespan else None,
        "ttft_p50_s": _pct(ttft, 50), "ttft_p90_s": _pct(ttft, 90), "ttft_p99_s": _pct(ttft, 99),
        "tpot_p50_ms": _pct(tpot * 1e3, 50), "tpot_p90_ms": _pct(tpot * 1e3, 90), "tpot_p99_ms": _pct(tpot * 1e3, 99),
        "ttft_s": _pct(ttft, 50), "ttft_mean_s": float(np.nanmean(ttft)) if np.isfinite(ttft).any() else None,
        "tpot_ms": float(np.nanmean(tpot) * 1e3) if np.isfinite(tpot).any() else None,
        "tpot_median_ms": _pct(tpot * 1e3, 50),
        "prefix_cache_hit_rate": st.hit_rate, "kv_cache_usage": float((usage * dt).sum() / dt.sum()) if dt.sum() else 0.0,
        "kv_cache_usage_peak": float(usage.max()) if len(usage) else 0.0,
        "preemptions": int(state.preemptions), "evicted_blocks": int(kv.evicted_blocks),
        "makespan_s": float(makespan), "kv_capacity_tokens": cap.kv_capacity_tokens,
        "kv_bytes_per_token_per_gpu": cap.kv_bytes_per_token_per_gpu,
        "weight_gb_per_gpu": cap.weight_bytes_per_gpu / 1e9, "gpu_memory_utilization": gpu_memory_utilization,
        "num_requests": n,
        "kv_blocks": cap.num_blocks, "block_size": cap.block_size, "policy": policy,
        "median_input_tokens": float(np.median(trace.prompt)), "median_output_tokens": float(np.median(trace.output)),
        "spec_tokens": spec_tokens, "accept_len": accept_len, "accept_len_source": accept_source if spec_tokens else None,
        "distinct_steps_costed": coster.distinct_steps,
    }
    requests = pd.DataFrame({"request": np.arange(n), "session": trace.session, "prompt_tokens": trace.prompt,
                             "output_tokens": trace.output, "hit_tokens": sched.hit_tokens, "arrival_s": sched.arrived,
                             "first_token_s": first, "finish_s": finish, "ttft_s": ttft, "tpot_ms": tpot * 1e3})
    config = {"model": m.name, "hardware": hw.name, "tp": tp, "ep": ep, "gpus": gpus, "quant": q.name,
              "kv_dtype": q.kv_dtype, "concurrency": concurrency, "seed": seed, "trace": trace.source,
              "calibration": calibration_name}
    return CachedServing(config, summary, requests, tl, st.as_dict())


WORKLOADS = ("fixed", "agentx")


def estimate_workload(workload: str, model, hardware, **kwargs) -> dict:
    """What ``m3lab estimate --workload agentx`` prints: :func:`cached_serving` on AgentX-like sessions
    (``concurrency`` sessions at a time, as many sessions as slots unless ``sessions`` is given), its summary
    with the run's configuration."""
    if workload != "agentx":
        raise M3LabError(f"unknown workload {workload!r} for the cached serving run", field="workload",
                         hint=f"choose one of {', '.join(WORKLOADS)}")
    run = cached_serving(model, hardware, **kwargs)
    return {**run.summary(), **run.config}

