"""A P:D deployment served as vLLM serves it: prefill and decode instances, the proxy, the KV hand-off.

``vllm bench serve --max-concurrency C`` against vLLM's disaggregated-serving proxy (vLLM's repository, not the
wheel: ``examples/online_serving/disaggregated_serving/disagg_proxy_demo.py`` ``Proxy.create_completion`` with
``RoundRobinSchedulingPolicy``, and ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``
``_handle_completions``): the proxy sends each request, with ``max_tokens=1``, to the next prefill instance in
round-robin order; when that response returns it sends the request to the next decode instance in round-robin
order and streams the decode instance's tokens to the client (the prefill's token is dropped).

Each instance is one vLLM engine (:class:`~m3lab.serving.timed_engine.TimedEngine`: the proven step generator
on a clock, host time included) with its role's scheduler limits and KV blocks (:func:`m3lab.workload.deployed.
scheduler_config` with ``role=``): a prefill instance batches prompts within its token budget like any engine;
a finished prefill keeps its KV blocks (the connector's ``delay_free_blocks``) until the decode instance has read
them. The hand-off of each request is the busiest rank's bytes of the exact geometry (:func:`m3lab.pd.geometry.
pd_plan`) over the record's link (GB/s per GPU), one transfer at a time per prefill and per decode instance. The
decode instance then admits the request when a slot and KV are free, with the prompt's KV loaded but its last
token (vLLM's scheduler recomputes it: ``_update_waiting_for_remote_kv``), and produces every output token.

Modelled order (an approximation, named): the transfer runs before the decode instance admits the request; vLLM
admits first (allocating the blocks), then pulls the KV, and frees the prefill side's blocks when the pull is done.
Both orders give the same TTFT when the decode side has room; under decode pressure vLLM's pull starts after the
wait, so the decode side's blocks are reserved a hand-off later and the prefill side's released a hand-off later
than modelled here.

TTFT per request = ``queueing_s`` (waiting at a prefill instance before its first chunk, plus waiting at the decode
instance after the hand-off) + ``prefill_s`` (first chunk to the prefill's response) + ``handoff_s`` (link wait
and transfer) + ``first_decode_s`` (the decode instance's first step to the first token reaching the client).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from m3lab.arith import ceil_div
from m3lab.serving.bench_load import BURST_SHARE_LIMIT, bench_metrics
from m3lab.serving.progress import late_progress
from m3lab.serving.timed_engine import TimedEngine, run_engines
from m3lab.workload.deployed import scheduler_config
from m3lab.workload.requests import FakeOutputs, UniqueContents
from m3lab.workload.scheduler import Scheduler

PARTS = ("queueing_s", "prefill_s", "handoff_s", "first_decode_s")
#: A note says queueing dominates when it is at least this share of the median TTFT.
QUEUEING_DOMINATES = 0.5


@dataclass
class PDSetup:
    """The pieces of one simulated P:D deployment (see :func:`simulate`)."""

    prefill_cfg: object
    decode_cfg: object
    isl: int
    osl: int
    num_prompts: int
    concurrency: int
    prefill_instances: int
    decode_instances: int
    handoff_s: float
    outputs: FakeOutputs
    gpus: int


class _Run:
    """The proxy and the client of one simulation: routing, hand-offs, the closed loop, per-request times."""

    def __init__(self, s: PDSetup, pre: list, dec: list):
        self.s, self.pre, self.dec = s, pre, dec
        n = s.num_prompts
        self.t = {k: np.full(n, np.nan) for k in ("send", "pre_sched", "pre_out", "kv_at", "dec_sched", "first",
                                                  "finish")}
        self.held_on = np.full(n, -1)           # prefill instance of each request
        self.decode_on = np.full(n, -1)         # decode instance of each request
        self.next_req = self.done = 0
        self.rr_pre = self.rr_dec = 0
        self.send_free = [0.0] * s.prefill_instances
        self.recv_free = [0.0] * s.decode_instances
        self.chunks: list = []
        self.held, self.peak_held = 0, 0

    def send(self, t: float) -> None:
        if self.next_req >= self.s.num_prompts:
            return
        rid, self.next_req = self.next_req, self.next_req + 1
        self.t["send"][rid], self.held_on[rid] = t, self.rr_pre
        self.pre[self.rr_pre].push(t, rid)
        self.rr_pre = (self.rr_pre + 1) % len(self.pre)

    def on_output(self, engine: TimedEngine, out) -> None:
        t = self.t
        role, i = engine.tag
        if role == "prefill":
            for rid, ts in out.admitted:
                t["pre_sched"][rid] = ts
            for rid, ts in out.finished:          # the prefill response is back at the proxy
                t["pre_out"][rid] = ts
                j = self.rr_dec
                self.rr_dec = (self.rr_dec + 1) % len(self.dec)
                start = max(ts, self.send_free[i], self.recv_free[j])
                end = self.send_free[i] = self.recv_free[j] = start + self.s.handoff_s
                t["kv_at"][rid], self.decode_on[rid] = end, j
                self.held += 1
                self.peak_held = max(self.peak_held, self.held)
                self.dec[j].push(end, rid, external=self.s.isl - 1)
            return
        for rid, ts in out.admitted:               # the decode side admits: the prefill side may free the KV
            t["dec_sched"][rid] = ts
            self.pre[self.held_on[rid]].release(ts, rid)
            self.held -= 1
        for rid, n, ts in out.chunks:
            self.chunks.append((rid, ts))
            if np.isnan(t["first"][rid]):
                t["first"][rid] = ts
        for rid, ts in out.finished:
            t["finish"][rid] = ts
            self.done += 1
            self.send(ts)


def _engines(s: PDSetup, costers: tuple, host_us) -> tuple[list, list]:
    pre_contents = UniqueContents([s.isl] * s.num_prompts, [1] * s.num_prompts)
    dec_contents = UniqueContents([s.isl] * s.num_prompts, [s.osl] * s.num_prompts)
    pre, dec = [], []
    for role, n, cfg, contents, outputs, out in (("prefill", s.prefill_instances, s.prefill_cfg, pre_contents,
                                                  FakeOutputs(), pre),
                                                 ("decode", s.decode_instances, s.decode_cfg, dec_contents,
                                                  s.outputs, dec)):
        for i in range(n):
            core = Scheduler(cfg, outputs=outputs).engine(contents)
            core.hold_finished_kv = role == "prefill"
            out.append(TimedEngine(core, costers[role == "decode"], host_us, name=f"{role}{i}", tag=(role, i)))
    return pre, dec


def simulate(s: PDSetup, prefill_step_us, decode_step_us, host_us=None, *, progress: bool = False) -> dict:
    """Run the P:D deployment (module docstring); returns per-request times, vllm bench's metrics and the load
    of both pools."""
    pre, dec = _engines(s, (prefill_step_us, decode_step_us), host_us)
    run = _Run(s, pre, dec)
    for _ in range(s.concurrency):
        run.send(0.0)
    with late_progress("P/D (m3lab)", s.num_prompts, progress) as bar:
        run_engines(pre + dec, run.on_output, lambda: run.done >= s.num_prompts,
                    progress=lambda: bar.update(run.done))
    return _figures(s, run, pre, dec)


def _figures(s: PDSetup, run: _Run, pre: list, dec: list) -> dict:
    t = run.t
    ch = np.array(run.chunks, float).reshape(-1, 2)
    order = np.lexsort((ch[:, 1], ch[:, 0]))
    duration = float(np.nanmax(t["finish"]))
    raw = bench_metrics(np.full(s.num_prompts, s.isl), np.full(s.num_prompts, s.osl), t["send"],
                        ch[order, 0].astype(np.int64), ch[order, 1], duration)
    waits = {"prefill": t["pre_sched"] - t["send"], "decode": t["dec_sched"] - t["kv_at"]}
    parts = {"queueing_s": waits["prefill"] + waits["decode"], "prefill_s": t["pre_out"] - t["pre_sched"],
             "handoff_s": t["kv_at"] - t["pre_out"], "first_decode_s": t["first"] - t["dec_sched"]}
    ttft = t["first"] - t["send"]
    busy = [np.sum([r[1] - r[0] for r in e.rows]) / max(duration, 1e-12) for e in pre]
    dec_batch = [len(r.scheduled) for e in dec for r in e.records]
    out = {"ttft_s": raw["median_ttft_ms"] / 1e3, "ttft_mean_s": raw["mean_ttft_ms"] / 1e3,
           "ttft_p90_s": raw["p90_ttft_ms"] / 1e3, "ttft_p99_s": raw["p99_ttft_ms"] / 1e3,
           "tpot_ms": raw["mean_tpot_ms"], "tpot_median_ms": raw["median_tpot_ms"], "itl_ms": raw["mean_itl_ms"],
           **{k: float(np.median(v)) for k, v in parts.items()},
           **{f"queueing_{k}_s": float(np.median(v)) for k, v in waits.items()},
           "ttft_parts_mean_s": {k: float(np.mean(v)) for k, v in parts.items()},
           "output_tokens_per_s_per_gpu": raw["output_throughput"] / s.gpus,
           "total_tokens_per_s_per_gpu": raw["total_token_throughput"] / s.gpus, "makespan_s": duration,
           "prefill_utilisation": float(np.mean(busy)), "mean_decode_batch": float(np.mean(dec_batch)),
           "peak_prefill_kv_held_requests": run.peak_held,
           "prefill_kv_usage_peak": max((r.kv_usage or 0.0) for e in pre for r in e.records),
           "decode_kv_usage_peak": max((r.kv_usage or 0.0) for e in dec for r in e.records),
           "prefill_blocked": any(e.was_blocked for e in pre),
           "decode_preemptions": sum(len(r.preempted) for e in dec for r in e.records)}
    out["notes"] = _notes(s, out, ttft)
    out["requests"] = {**{k: v for k, v in t.items()}, **parts, "ttft": ttft, "prefill_instance": run.held_on,
                       "decode_instance": run.decode_on,
                       "tpot_ms": (t["finish"] - t["first"]) / max(s.osl - 1, 1) * 1e3}
    out["engines"] = {e.name: e.steps_table() for e in pre + dec}
    return out


def _notes(s: PDSetup, f: dict, ttft: np.ndarray) -> list[str]:
    notes = []
    if f["queueing_s"] >= QUEUEING_DOMINATES * f["ttft_s"]:
        if f["queueing_decode_s"] >= f["queueing_prefill_s"]:
            room = s.decode_instances * min(s.decode_cfg.max_num_seqs, whole_requests(s.decode_cfg, s.isl + s.osl))
            why = (f"mostly waiting for a decode slot ({f['queueing_decode_s']:.2f} s median): the decode instances "
                   f"hold at most {room} requests at once (slots and KV), concurrency is {s.concurrency}")
        else:
            why = (f"mostly waiting at a prefill instance ({f['queueing_prefill_s']:.2f} s median): "
                   f"{s.prefill_instances} instances of {s.prefill_cfg.max_num_batched_tokens} tokens per step "
                   f"for prompts of {s.isl}")
        notes.append(f"queueing is {f['queueing_s']:.2f} s of the median TTFT {f['ttft_s']:.2f} s, {why}")
    if f["prefill_blocked"]:
        notes.append(f"prefill instances waited for KV held by requests not yet admitted by a decode instance (peak "
                     f"{f['peak_prefill_kv_held_requests']} held)")
    if f["decode_preemptions"]:
        notes.append(f"{f['decode_preemptions']} preemptions on the decode side: admitted requests grow past its KV "
                     "(vLLM reserves the known sequence, not the outputs to come); victims recompute there")
    if s.concurrency > BURST_SHARE_LIMIT * s.num_prompts:
        notes.append(f"num_prompts {s.num_prompts} < {1 / BURST_SHARE_LIMIT:g} x concurrency {s.concurrency}: the run "
                     "is mostly its start-up burst, not steady state")
    return notes


def whole_requests(cfg, tokens: int) -> int:
    """Whole requests of ``tokens`` the config's KV blocks hold (null block excluded)."""
    if cfg.num_kv_blocks is None:
        return cfg.max_num_seqs
    return (cfg.num_kv_blocks - 1) // ceil_div(tokens + cfg.lookahead_tokens, cfg.block_size)


def setup(deployment, *, prefill_blocks: int, decode_blocks: int, block_size: int, handoff_s: float,
          outputs: FakeOutputs) -> PDSetup:
    """The :class:`PDSetup` of a P/D ``deployment`` (role limits from the record, KV blocks per instance given)."""
    d, wl = deployment, deployment.workload
    pcfg = scheduler_config(d, role="prefill", block_size=block_size, num_kv_blocks=prefill_blocks)
    dcfg = scheduler_config(d, role="decode", block_size=block_size, num_kv_blocks=decode_blocks)
    return PDSetup(pcfg, dcfg, wl.isl, wl.osl, wl.num_prompts, wl.concurrency, d.pd.prefill.instances,
                   d.pd.decode.instances, handoff_s, outputs, d.gpus)


__all__ = ["PARTS", "PDSetup", "setup", "simulate", "whole_requests"]
