"""Serving a session workload end to end: sessions on one engine of the proven step generator, on a clock.

:func:`cached_serving` serves a trace (default: the AgentX-like generator, :mod:`m3lab.cache.agentic`) on one
replica as vLLM does: the step generator (:mod:`m3lab.workload.scheduler`, proven equal to vLLM's scheduler) with
the deployment's limits, prefix caching on the trace's block keys (:class:`~m3lab.workload.requests.KeyContents`)
in a KV pool per rank from the hardware memory (:mod:`m3lab.serving.cache_capacity`; vLLM's LRU eviction or another
policy), speculative decoding with exact drafts (the record's method and k; acceptance from the record, or for
agentic traffic without one the named assumption :data:`m3lab.workload.deployed.ASSUMED_AGENTIC_ACCEPT_LEN`), new
turns' content prefilled in chunks that share steps with the running decodes. It runs on a clock
(:class:`~m3lab.serving.timed_engine.TimedEngine`: each step's device time from the cost model, whose indexer and
sparse-attention bytes grow with each request's context, and its host time overlapped as the engine's async
scheduling allows) driven by the sessions (:class:`~m3lab.cache.sessions.Sessions`: turns wait for their
predecessor and think).

It returns per-request TTFT and TPOT (p50 / p90 / p99), the prefix-cache hit rate as vLLM counts it, KV cache
usage as vLLM reports it (time-weighted mean and peak of ``1 - free / (blocks - 1)``), queue lengths over time,
and output tokens/s/GPU over the run. TTFT = first token - arrival; TPOT = (last token - first token) /
(output - 1) for requests with more than one output token (vllm bench's definitions).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from m3lab.cache.agentic import generate
from m3lab.cache.replay import M3LabKVCache
from m3lab.cache.sessions import Sessions
from m3lab.cache.trace import Trace, read_trace
from m3lab.cost.host_time import step_host_us
from m3lab.cost.model import cost_label, resolve_calibration
from m3lab.errors import M3LabError
from m3lab.serving.cache_capacity import cache_capacity
from m3lab.serving.progress import late_progress
from m3lab.serving.step_cost import StepCoster
from m3lab.serving.timed_engine import TimedEngine, run_engines
from m3lab.workload.deployed import (ACCEPTANCE_MODEL, AGENTIC_ACCEPT_LEN_RANGE, acceptance, fake_outputs,
                                     scheduler_config)
from m3lab.workload.requests import KeyContents
from m3lab.workload.scheduler import Scheduler
from m3lab.workload.step import EngineStep

DEFAULT_SESSIONS_PER_SLOT = 1   # sessions simulated per concurrent session slot when the record names none
STEP_QUANTUM = 1.25         # steps are costed at contexts / chunks / decode counts (> 8) rounded to 25% apart:
                            # a session run has tens of thousands of distinct steps, each new one costs an OpTable;
                            # on 60 random M3 TP4 steps: median 4%, max 12% from the exact StepCoster time
LOG_QUANTUM = math.log(STEP_QUANTUM)


class CoarseStepTime:
    """Step time (s) from a :class:`~m3lab.serving.step_cost.StepCoster`, memoised on a coarse key: decode count
    (exact up to 8, then ``STEP_QUANTUM`` apart), mean decode context, and the prefill rows' total tokens and
    attention work (sum of chunk x context: what the indexer and attention read) each ``STEP_QUANTUM`` apart; the
    coster times one representative step per key, its prefill rows as one chunk of the same tokens and work."""

    def __init__(self, coster, mode: str):
        self.coster, self.mode = coster, mode
        self.memo: dict = {}

    @staticmethod
    def _b(x: float) -> int:
        return int(round(math.log(max(float(x), 1.0)) / LOG_QUANTUM))

    @staticmethod
    def _u(b: int) -> int:
        return max(int(round(STEP_QUANTUM ** b)), 1)

    def __call__(self, step) -> float:
        dec, ctx = step.is_decode.tolist(), step.context_lens.tolist()
        if all(dec):                # decodes only (the common step)
            dctx, pre = ctx, []
        else:
            new = step.new_tokens.tolist()
            dctx = [c for c, d in zip(ctx, dec) if d]
            pre = [(n, c) for n, c, d in zip(new, ctx, dec) if not d]
        nd = len(dctx)
        b = self._b
        key = (nd if nd <= 8 else -b(nd), b(sum(dctx) / nd) if nd else 0,
               (b(sum(n for n, _ in pre)), b(sum(n * c for n, c in pre))) if pre else None)
        t = self.memo.get(key)
        if t is None:
            t = self.memo[key] = self.coster.time_us(self._representative(key), self.mode) * 1e-6
        return t

    def _representative(self, key: tuple):
        nd_key, kd, pre = key
        n_dec = nd_key if nd_key >= 0 else self._u(-nd_key)
        new, ctx = [1] * n_dec, [self._u(kd)] * n_dec
        if pre is not None:
            n = self._u(pre[0])
            new.append(n)
            ctx.append(max(int(round(STEP_QUANTUM ** pre[1] / n)), n))
        return EngineStep(np.asarray(new, np.int64), np.asarray(ctx, np.int64),
                          decode_mask=np.arange(len(new)) < n_dec)


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


def _trace_of(d, trace: Trace | None, block_size: int) -> Trace:
    """The trace to serve: ``trace`` when given, else the deployment's workload (agentx sessions or a file)."""
    wl = d.workload
    if wl.kind == "fixed":
        raise M3LabError("the agentic estimate serves sessions or a trace, not a fixed-length workload",
                         field="workload", hint="set workload=agentx (or workload=trace trace=PATH)")
    if trace is None and wl.kind == "agentx":
        trace = generate(sessions=wl.sessions or DEFAULT_SESSIONS_PER_SLOT * wl.concurrency, seed=wl.seed,
                         block_size=block_size)
    elif trace is None:
        trace = read_trace(wl.trace, "mooncake", block_size)
    if trace.block_size != block_size:
        raise M3LabError(f"the trace is keyed in {trace.block_size}-token blocks but {d.model.name} uses {block_size}",
                         field="block_size")
    return trace


class _OnCache(Scheduler):
    """The step generator on a given KV cache (its eviction policy)."""

    def __init__(self, config, cache, outputs):
        super().__init__(config, outputs=outputs)
        self.cache = cache

    def make_pool(self):
        return self.cache


class _Observer:
    """One timeline row per executed step: time, queue, KV usage, cached blocks, evictions, preemptions, hits."""

    def __init__(self, kv):
        self.kv, self.rows, self.preemptions = kv, [], 0

    def __call__(self, engine, rec, start_s: float) -> None:
        kv = self.kv
        self.preemptions += len(rec.preempted)
        self.rows.append({"step": len(self.rows), "time_s": start_s, "running": rec.running, "waiting": rec.waiting,
                          "tokens": rec.num_tokens, "kv_usage": kv.usage, "cached_blocks": kv.num_cached,
                          "evicted_blocks": kv.evicted_blocks, "preemptions": self.preemptions,
                          "hit_tokens": kv.stats.hits, "query_tokens": kv.stats.queries})


@dataclass
class _Setup:
    """What one agentic run is made of (see :func:`cached_serving`)."""

    d: object
    trace: Trace
    cap: object
    cal: object
    coster: object
    cfg: object
    kv: M3LabKVCache
    accept_len: float | None
    accept_source: str | None

    @property
    def mode(self) -> str:
        return "calibrated" if self.cal is not None else "ceiling"


def _setup(deployment, trace, calibration, policy: str, capacity_tokens, accept_len) -> _Setup:
    d = deployment.validate()
    limits = d.scheduler_limits()
    source_len, source = acceptance(d)
    if accept_len is not None and d.serving.spec_tokens:
        source = f"what-if {accept_len} (assumed)"
    if not limits.prefix_caching:
        raise M3LabError("the agentic estimate models vLLM's prefix caching; prefix_caching=0 is not modelled",
                         field="prefix_caching", hint="leave prefix caching on (vLLM's default)")
    cap = cache_capacity(d.model, d.plan, d.quant, d.hardware, gpu_memory_utilization=limits.gpu_memory_utilization,
                         spec_tokens=d.serving.spec_tokens)
    if capacity_tokens is not None:
        cap = cap.with_tokens(capacity_tokens)
    trace = _trace_of(d, trace, cap.block_size)
    cal = resolve_calibration(d.hardware, calibration)
    cfg = scheduler_config(d, block_size=cap.block_size, num_kv_blocks=cap.num_blocks)
    return _Setup(d, trace, cap, cal, StepCoster(d, cal), cfg, M3LabKVCache(cap.num_blocks, cap.block_size, policy),
                  source_len if accept_len is None else accept_len, source)


def _serve(su: _Setup, open_loop: bool, progress: bool) -> tuple:
    """Run the sessions on one engine: (engine, observer, sessions, first token s [N], finish s [N])."""
    tr = su.trace
    core = _OnCache(su.cfg, su.kv, fake_outputs(su.d, su.accept_len)).engine(
        KeyContents(tr.keys, tr.prompt, tr.output, tr.block_size))
    observer, step_time = _Observer(su.kv), CoarseStepTime(su.coster, su.mode)
    engine = TimedEngine(core, lambda st: step_time(st) * 1e6,
                         step_host_us(su.d.model.layers) if su.cal is not None else None, observe=observer)
    sessions = Sessions(tr, su.d.workload.concurrency, open_loop=open_loop)
    sessions.start(engine)
    first, finish = [math.nan] * len(tr), np.full(len(tr), np.nan)

    def on_output(e, out) -> None:
        for rid, _, t in out.chunks:
            if math.isnan(first[rid]):
                first[rid] = t
        for rid, t in out.finished:
            finish[rid] = t
            sessions.on_finished(e, rid, t)

    with late_progress("agentic sessions (m3lab)", len(tr), progress) as bar:
        run_engines([engine], on_output, lambda: sessions.done, progress=lambda: bar.update(sessions.finished))
    return engine, observer, sessions, np.asarray(first, float), finish


def _requests(su: _Setup, engine, sessions: Sessions, first: np.ndarray, finish: np.ndarray) -> pd.DataFrame:
    tr, n = su.trace, len(su.trace)
    hit = np.zeros(n, np.int64)
    for rec in engine.records:
        for rid, h, resumed in rec.admitted:
            if not resumed:
                hit[rid] = h
    sched = np.array([engine.first_scheduled.get(i, np.nan) for i in range(n)])
    out = tr.output.astype(float)
    tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), np.nan)
    return pd.DataFrame({"request": np.arange(n), "session": tr.session, "prompt_tokens": tr.prompt,
                         "output_tokens": tr.output, "hit_tokens": hit, "arrival_s": sessions.arrived,
                         "first_scheduled_s": sched, "first_token_s": first, "finish_s": finish,
                         "ttft_s": first - sessions.arrived, "queueing_s": sched - sessions.arrived,
                         "prefill_s": first - sched, "tpot_ms": tpot * 1e3})


def _summary(su: _Setup, req: pd.DataFrame, tl: pd.DataFrame, observer, sessions: Sessions, policy: str) -> dict:
    d, tr, cap, kv = su.d, su.trace, su.cap, su.kv
    makespan = float(req["finish_s"].max()) if len(tr) else 0.0
    ttft, tpot = req["ttft_s"].to_numpy(), req["tpot_ms"].to_numpy()
    dt = np.diff(np.append(tl["time_s"].to_numpy(), makespan)) if len(tl) else np.zeros(0)
    usage = tl["kv_usage"].to_numpy(float) if len(tl) else np.zeros(0)
    conc, gpus, tail = d.workload.concurrency, d.plan.world, sessions.tail_share(makespan)
    notes = [f"the last {100 * tail:.0f}% of the run has fewer than {conc} active sessions (the {tr.num_sessions} "
             "sessions ran out): raise sessions for a steadier load"] if tail > 0.25 else []
    per_gpu = (lambda tokens: float(tokens / makespan / gpus) if makespan else None)
    return {
        "workload": tr.meta.get("format", "trace"), "sessions": tr.num_sessions, "requests": len(tr),
        "concurrency": conc, "kind": su.mode, "label": cost_label(d.hardware, su.cal),
        "output_tokens_per_s_per_gpu": per_gpu(tr.output.sum()),
        "total_tokens_per_s_per_gpu": per_gpu(tr.output.sum() + tr.prompt.sum()),
        "ttft_p50_s": _pct(ttft, 50), "ttft_p90_s": _pct(ttft, 90), "ttft_p99_s": _pct(ttft, 99),
        "tpot_p50_ms": _pct(tpot, 50), "tpot_p90_ms": _pct(tpot, 90), "tpot_p99_ms": _pct(tpot, 99),
        "ttft_s": _pct(ttft, 50), "ttft_mean_s": float(np.nanmean(ttft)) if np.isfinite(ttft).any() else None,
        "tpot_ms": float(np.nanmean(tpot)) if np.isfinite(tpot).any() else None, "tpot_median_ms": _pct(tpot, 50),
        "queueing_s": _pct(req["queueing_s"].to_numpy(), 50), "prefix_cache_hit_rate": kv.stats.hit_rate,
        "kv_cache_usage": float((usage * dt).sum() / dt.sum()) if dt.sum() else 0.0,
        "kv_cache_usage_peak": float(usage.max()) if len(usage) else 0.0,
        "preemptions": int(observer.preemptions), "evicted_blocks": int(kv.evicted_blocks), "makespan_s": makespan,
        "steps": len(tl), "kv_capacity_tokens": cap.kv_capacity_tokens,
        "kv_bytes_per_token_per_gpu": cap.kv_bytes_per_token_per_gpu, "weight_gb_per_gpu": cap.weight_bytes_per_gpu / 1e9,
        "gpu_memory_utilization": d.scheduler_limits().gpu_memory_utilization, "num_requests": len(tr),
        "kv_blocks": cap.num_blocks, "block_size": cap.block_size, "policy": policy,
        "median_input_tokens": float(np.median(tr.prompt)), "median_output_tokens": float(np.median(tr.output)),
        "spec_method": d.serving.spec_method, "spec_tokens": d.serving.spec_tokens, "accept_len": su.accept_len,
        "accept_len_source": su.accept_source,
        "acceptance_model": ACCEPTANCE_MODEL if d.serving.spec_tokens else None, "notes": notes,
        "distinct_steps_costed": su.coster.distinct_steps}


def cached_serving(deployment, *, trace: Trace | None = None, calibration="default", policy: str = "lru",
                   capacity_tokens: int | None = None, open_loop: bool = False, accept_len: float | None = None,
                   progress: bool = False) -> CachedServing:
    """Serve ``deployment``'s agentic workload (``workload.sessions`` AgentX-like sessions from ``workload.seed``,
    ``workload.concurrency`` of them at a time, or the Mooncake trace at ``workload.trace``; ``trace``: a Trace
    to serve instead; ``open_loop``: its own arrival times). ``policy``: the eviction policy; ``capacity_tokens``:
    a what-if KV pool per GPU; ``accept_len``: a what-if acceptance (default: the record's or the named
    assumption); ``progress``: a bar on long runs."""
    su = _setup(deployment, trace, calibration, policy, capacity_tokens, accept_len)
    engine, observer, sessions, first, finish = _serve(su, open_loop, progress)
    req = _requests(su, engine, sessions, first, finish)
    tl = pd.DataFrame(observer.rows)
    d, cfg = su.d, su.cfg
    config = {"deployment": d.name, "deployment_key": d.key(), "model": d.model.name, "hardware": d.hardware.name,
              "tp": d.plan.tp, "ep": d.plan.ep, "gpus": d.plan.world, "quant": d.quant.name,
              "kv_dtype": d.quant.kv_dtype, "index_dtype": d.quant.index_dtype, "index_topk_freq": d.index_sharing_freq,
              "concurrency": d.workload.concurrency, "seed": d.workload.seed, "trace": su.trace.source,
              "max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
              "async_scheduling": cfg.async_scheduling, "calibration": su.cal.name if su.cal is not None else None}
    return CachedServing(config, _summary(su, req, tl, observer, sessions, policy), req, tl, su.kv.stats.as_dict())


def acceptance_sensitivity(summary: dict, lengths=None) -> list[dict]:
    """First-order sensitivity of an agentic run to the acceptance length: a request needs about (output - 1) / A
    verification steps, so at A' its TPOT scales by A / A' and the output throughput by A' / A, step times held
    (:func:`cached_serving` with ``accept_len=A'`` runs it exactly). ``lengths``: the A' values (default the
    assumption's range, :data:`m3lab.workload.deployed.AGENTIC_ACCEPT_LEN_RANGE`)."""
    a = summary.get("accept_len")
    if not summary.get("spec_tokens") or a is None:
        return []
    rows = []
    for a2 in (lengths or AGENTIC_ACCEPT_LEN_RANGE):
        f = a / a2
        rows.append({"accept_len": a2, "tpot_p50_ms": summary["tpot_p50_ms"] * f, "tpot_ms": summary["tpot_ms"] * f,
                     "output_tokens_per_s_per_gpu": summary["output_tokens_per_s_per_gpu"] / f,
                     "method": "first order: verification steps per token scale as 1/A, step times held"})
    return rows


def estimate_workload(deployment, *, calibration="default", progress: bool = False) -> dict:
    """What ``m3lab estimate --workload agentx`` prints: :func:`cached_serving` of ``deployment``, its summary with
    the run's configuration and the acceptance sensitivity (speculative decoding)."""
    run = cached_serving(deployment, calibration=calibration, progress=progress)
    s = run.summary()
    return {**s, "accept_len_sensitivity": acceptance_sensitivity(s), **run.config}
