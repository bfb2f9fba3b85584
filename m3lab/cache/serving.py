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


def _trace_of(d, trace: Trace | None, block_size: int) -> Trace:
    """The trace to serve: ``trace`` when given, else the deployment's workload (agentx sessions or a file)."""
    wl = d.workload
    if wl.kind == "fixed":
        raise M3LabError("the agentic estimate serves sessions or a trace, not a fixed-length workload",
                         field="workload", hint="set workload=agentx (or workload=trace trace=PATH)")
    if trace is None and wl.kind == "agentx":
        from m3lab.cache.agentic import generate
        trace = generate(sessions=wl.sessions or DEFAULT_SESSIONS_PER_SLOT * wl.concurrency, seed=wl.seed,
                         block_size=block_size)
    elif trace is None:
        from m3lab.cache.trace import read_trace
        trace = read_trace(wl.trace, "mooncake", block_size)
    if trace.block_size != block_size:
        raise M3LabError(f"the trace is keyed in {trace.block_size}-token blocks but {d.model.name} uses {block_size}",
                         field="block_size")
    return trace


def cached_serving(deployment, *, trace: Trace | None = None, calibration="default", policy: str = "lru",
                   capacity_tokens: int | None = None) -> CachedServing:
    """Serve ``deployment``'s agentic workload (``workload.sessions`` AgentX-like sessions from ``workload.seed``,
    ``workload.concurrency`` of them at a time, or the Mooncake trace at ``workload.trace``; ``trace``: a Trace
    to serve instead). ``policy``: the eviction policy; ``capacity_tokens``: a what-if KV pool per GPU."""
    from m3lab.cost.model import cost_label, resolve_calibration
    from m3lab.serving.step_cost import StepCoster
    from m3lab.workload.deployed import scheduler_config

    d = deployment.validate()
    m, hw, plan, q, wl = d.model, d.hardware, d.plan, d.quant, d.workload
    concurrency, limits = wl.concurrency, d.scheduler_limits()
    spec_tokens, accept_len = d.serving.spec_tokens, d.acceptance.accept_len
    if spec_tokens and accept_len is None:
        raise M3LabError(f"spec_tokens={spec_tokens} needs accept_len measured on this traffic", field="accept_len",
                         hint="set accept_len with accept_dataset=agentic, or accept_dataset=assumed")
    if not limits.prefix_caching:
        raise M3LabError("the agentic estimate models vLLM's prefix caching; prefix_caching=0 is not modelled",
                         field="prefix_caching", hint="leave prefix caching on (vLLM's default)")
    cap = cache_capacity(m, plan, q, hw, gpu_memory_utilization=limits.gpu_memory_utilization,
                         spec_tokens=spec_tokens)
    if capacity_tokens is not None:
        cap = cap.with_tokens(capacity_tokens)
    trace = _trace_of(d, trace, cap.block_size)
    cal = resolve_calibration(hw, calibration)
    calibration_name = cal.name if cal is not None else None
    mode = "calibrated" if cal is not None else "ceiling"
    coster = StepCoster(d, cal)
    steps = spec_steps(trace.output, spec_tokens, accept_len)
    kv = M3LabKVCache(cap.num_blocks, cap.block_size, policy, use_eagle=bool(spec_tokens))
    sched = CachedScheduler(trace, kv, scheduler_config(d, block_size=cap.block_size),
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
        "weight_gb_per_gpu": cap.weight_bytes_per_gpu / 1e9, "gpu_memory_utilization": limits.gpu_memory_utilization,
        "num_requests": n,
        "kv_blocks": cap.num_blocks, "block_size": cap.block_size, "policy": policy,
        "median_input_tokens": float(np.median(trace.prompt)), "median_output_tokens": float(np.median(trace.output)),
        "spec_tokens": spec_tokens, "accept_len": accept_len, "accept_len_source": d.acceptance.source(),
        "distinct_steps_costed": coster.distinct_steps,
    }
    requests = pd.DataFrame({"request": np.arange(n), "session": trace.session, "prompt_tokens": trace.prompt,
                             "output_tokens": trace.output, "hit_tokens": sched.hit_tokens, "arrival_s": sched.arrived,
                             "first_token_s": first, "finish_s": finish, "ttft_s": ttft, "tpot_ms": tpot * 1e3})
    config = {"deployment": d.name, "deployment_key": d.key(), "model": m.name, "hardware": hw.name, "tp": plan.tp,
              "ep": plan.ep, "gpus": gpus, "quant": q.name, "kv_dtype": q.kv_dtype, "index_dtype": q.index_dtype,
              "index_topk_freq": d.index_sharing_freq, "concurrency": concurrency, "seed": wl.seed,
              "trace": trace.source, "max_num_seqs": limits.max_num_seqs,
              "max_num_batched_tokens": limits.max_num_batched_tokens, "calibration": calibration_name}
    return CachedServing(config, summary, requests, tl, st.as_dict())


def estimate_workload(deployment, *, calibration="default") -> dict:
    """What ``m3lab estimate --workload agentx`` prints: :func:`cached_serving` of ``deployment``, its summary with
    the run's configuration."""
    run = cached_serving(deployment, calibration=calibration)
    return {**run.summary(), **run.config}
