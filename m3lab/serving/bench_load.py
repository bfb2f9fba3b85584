"""``vllm bench serve --max-concurrency C --num-prompts N --request-rate inf`` on the step sequence: load, time, metrics.

The load (``vllm/benchmarks/serve.py``, ``benchmark``): all N requests are created at once and pass a semaphore of
C, so C are sent at the start and each completion sends the next, N in all (default ``VLLM_BENCH_NUM_PROMPTS``, as
vllm bench's). The step sequence is vLLM's (:meth:`m3lab.workload.scheduler.Scheduler.records`, or vLLM's own
scheduler with ``engine="vllm"``: the same records, slower), requests added before the ``schedule()`` call that
follows the completion they wait for (a client with no round trip).

Time (:func:`m3lab.serving.timeline.step_timeline`): each executed step costs ``step_us(step)`` µs of device time
and ``host_us(step)`` µs of CPU time (ready, issue, after: schedule + input preparation before the device starts it,
launches while it runs, output processing after it), ordered as sync or async scheduling runs the calls. A step's
tokens reach the client when its outputs are processed.

Metrics (:func:`bench_metrics`) exactly as ``calculate_metrics`` in ``vllm/benchmarks/serve.py`` computes them
from per-request send / first-token / token / finish times: TTFT from send to the first token (server-side
queueing included), TPOT = (latency - TTFT) / (output tokens - 1) for requests with more than one token, ITL
between streamed chunks (one chunk per step: spec decoding streams 1 + accepted tokens at once), E2EL, request /
output / total token throughput over the run's duration. The result's ``raw`` has the keys of ``vllm bench serve
--save-result`` (readable by :func:`m3lab.serving.vllm_bench.parse_bench_result`).
"""
from __future__ import annotations

import time
from itertools import chain
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from m3lab.arith import ceil_div
from m3lab.errors import M3LabError
from m3lab.serving.progress import late_progress
from m3lab.serving.timeline import call_order, host_columns, step_timeline, timeline_arrays
from m3lab.spec.traffic import VLLM_BENCH_NUM_PROMPTS
from m3lab.vllm.scheduler_judge import Judge, warm_up
from m3lab.workload.requests import ClosedLoop, FakeOutputs, RequestContents, StepRecord, UniqueContents
from m3lab.workload.scheduler import Scheduler, SchedulerConfig
from m3lab.workload.step import EngineStep

#: Percentiles reported beside mean and median (vllm bench's ``--metric-percentiles 90,99``).
PERCENTILES = (90, 99)
ENGINES = ("m3lab", "vllm")
METRICS = ("ttft", "tpot", "itl", "e2el")

StepUs = Callable[[EngineStep], float]
#: host µs of a step: (ready, issue, after) or (before, after) (:mod:`m3lab.serving.timeline`)
HostUs = Callable[[EngineStep], tuple]


def _stats(values: list | np.ndarray, name: str, scale: float, percentiles) -> dict:
    """mean / median / std / pXX of ``values`` (s) in ms, as vllm bench (``np.percentile``; 0 when empty)."""
    v = np.asarray(values, float) if len(values) else np.zeros(1)
    out = {f"mean_{name}_ms": float(np.mean(v)) * scale, f"median_{name}_ms": float(np.median(v)) * scale,
           f"std_{name}_ms": float(np.std(v)) * scale}
    values_at = np.percentile(v, list(percentiles)) if len(percentiles) else []   # one partition for all of them
    for p, at in zip(percentiles, values_at):
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(at) * scale
    return out


def bench_metrics(prompt_lens, output_lens, send_s, chunk_rid, chunk_s, duration_s: float,
                  percentiles=PERCENTILES) -> dict:
    """vllm bench's metrics (``calculate_metrics``) of N completed requests: ``send_s`` [N], and every streamed
    chunk as (``chunk_rid``, ``chunk_s``) sorted by request, then time (each request has at least one). Returns the
    keys of ``vllm bench serve --save-result`` (latencies in ms, throughputs per second over ``duration_s``)."""
    out_lens = np.asarray(output_lens, np.int64)
    send = np.asarray(send_s, float)
    rid, t = np.asarray(chunk_rid, np.int64), np.asarray(chunk_s, float)
    first = t[np.searchsorted(rid, np.arange(len(send)))]
    last = t[np.searchsorted(rid, np.arange(len(send)), side="right") - 1]
    ttft, e2el = first - send, last - send
    more = out_lens > 1
    tpot = (e2el[more] - ttft[more]) / (out_lens[more] - 1)
    same = rid[1:] == rid[:-1]
    itl = (t[1:] - t[:-1])[same]
    n_in, n_out = int(np.sum(prompt_lens)), int(out_lens.sum())
    raw = {"duration": duration_s, "completed": len(out_lens), "failed": 0, "total_input_tokens": n_in,
           "total_output_tokens": n_out, "request_throughput": len(out_lens) / duration_s,
           "output_throughput": n_out / duration_s, "total_token_throughput": (n_in + n_out) / duration_s}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        raw.update(_stats(values, name, 1e3, percentiles))
    return raw


@dataclass
class BenchRun:
    """A simulated ``vllm bench serve`` run: ``raw`` (its --save-result keys), per request and per step tables."""

    raw: dict
    requests: pd.DataFrame = field(repr=False)   # send_s, first_scheduled_s, first_token_s, finish_s, ttft_s, ...
    steps: pd.DataFrame = field(repr=False)      # per step: call, start_s, end_s, output_s, times, tokens, counts
    notes: list
    config: dict
    seconds: float = 0.0                         # wall time the simulation took
    records: list = field(default_factory=list, repr=False)   # the StepRecords, one per row of ``steps``
    contents: RequestContents | None = field(default=None, repr=False)
    columns: dict = field(default_factory=dict, repr=False)   # per-step columns that do not depend on time
    index: dict = field(default_factory=dict, repr=False)     # chunk_index(records)

    def summary(self) -> dict:
        """The headline figures (s and ms as named), per GPU throughputs, ``queueing_s`` (median wait before the
        first scheduled chunk), ``prefill_s`` (median first chunk to first token) and the notes."""
        r, gpus = self.raw, self.config["gpus"]
        req = self.requests
        out = {"ttft_s": r["median_ttft_ms"] / 1e3, "ttft_mean_s": r["mean_ttft_ms"] / 1e3,
               **{f"ttft_p{p}_s": r[f"p{p}_ttft_ms"] / 1e3 for p in self.config["percentiles"]},
               "tpot_ms": r["mean_tpot_ms"], "tpot_median_ms": r["median_tpot_ms"],
               **{f"tpot_p{p}_ms": r[f"p{p}_tpot_ms"] for p in self.config["percentiles"]},
               "itl_ms": r["mean_itl_ms"], "itl_median_ms": r["median_itl_ms"],
               "e2el_s": r["median_e2el_ms"] / 1e3, "e2el_mean_s": r["mean_e2el_ms"] / 1e3,
               "queueing_s": float(req["queueing_s"].median()),
               "prefill_s": float((req["first_token_s"] - req["first_scheduled_s"]).median()),
               "output_tokens_per_s": r["output_throughput"], "total_tokens_per_s": r["total_token_throughput"],
               "output_tokens_per_s_per_gpu": r["output_throughput"] / gpus,
               "total_tokens_per_s_per_gpu": r["total_token_throughput"] / gpus,
               "request_throughput": r["request_throughput"], "duration_s": r["duration"], "notes": list(self.notes)}
        return {**out, **self.config}

    def retime(self, host_scale: float = 1.0, device_us: np.ndarray | None = None) -> BenchRun:
        """The same schedule with every host time multiplied by ``host_scale`` and, when given, other device µs
        per step (e.g. the cost model under another value of an assumption)."""
        st = self.steps
        host = np.column_stack([st["host_ready_us"], st["host_issue_us"], st["host_after_us"]]) * host_scale
        notes = [n for n in self.notes if not n.startswith("TTFT p")]
        device = st["device_us"].to_numpy() if device_us is None else np.asarray(device_us, float)
        return _assemble(self.records, device, host, self.contents, self.config, notes, self.seconds,
                         self.columns, self.index)

    def output_rate(self, device_us: np.ndarray) -> float:
        """Output tokens/s per GPU of :meth:`retime` ``(1.0, device_us)``, the same figure of its summary, without
        the run's other metrics and tables (what a sensitivity table re-times many times)."""
        st = self.steps
        host = np.column_stack([st["host_ready_us"], st["host_issue_us"], st["host_after_us"]])
        start, _, out = timeline_arrays(self.records, device_us, host, self.index.get("call_order"))
        finish = _per_request(self.index, out, start, len(self.contents), self.config["max_concurrency"])["finish"]
        n_out = int(np.asarray(self.contents.max_tokens, np.int64).sum())
        return n_out / float(finish.max()) / self.config["gpus"]


#: A run whose start-up burst (the C requests sent at once) is more than this share of its N requests never
#: reaches steady state: its median request is one of the burst.
BURST_SHARE_LIMIT = 0.5


def _notes(cfg: SchedulerConfig, contents: RequestContents, concurrency: int, records: list) -> list[str]:
    """One line per reason C requests cannot run at once (slots, KV), preemptions seen, and a too-short run."""
    notes = []
    if concurrency > cfg.max_num_seqs:
        notes.append(f"max_num_seqs {cfg.max_num_seqs} < concurrency {concurrency}: at most {cfg.max_num_seqs} "
                     "requests run at once, the others wait in the server's queue (inside TTFT)")
    if cfg.num_kv_blocks is not None:
        per_req = float(np.mean(ceil_div(contents.prompt + contents.max_tokens, cfg.block_size)))
        fits = int((cfg.num_kv_blocks - 1) // per_req)
        if fits < min(concurrency, cfg.max_num_seqs):
            notes.append(f"the KV cache ({cfg.num_kv_blocks - 1} blocks of {cfg.block_size}) holds about {fits} "
                         f"whole sequences, not {concurrency}: admission waits for KV (inside TTFT)")
    pre = sum(len(r.preempted) for r in records)
    if pre:
        notes.append(f"{pre} preemptions: victims recompute their prompt and outputs")
    if concurrency > BURST_SHARE_LIMIT * len(contents):
        notes.append(f"num_prompts {len(contents)} < {1 / BURST_SHARE_LIMIT:g} x concurrency {concurrency}: the run "
                     "is mostly its start-up burst, not steady state (TTFT and throughput are start-up figures)")
    return notes


def _burst_note(req: pd.DataFrame, concurrency: int, percentiles) -> list[str]:
    """A note for each TTFT percentile that the start-up burst (requests sent at 0) sets: most requests at or
    above it were sent at once."""
    notes = []
    ttft, burst = req["ttft_s"].to_numpy(), (req["send_s"] == 0).to_numpy()
    for p in percentiles:
        top = ttft >= np.percentile(ttft, p)
        if burst[top].mean() >= 0.5 and not burst.all():
            notes.append(f"TTFT p{p} is the start-up burst's: {int(burst[top].sum())} of the {int(top.sum())} "
                         f"requests at or above it are among the first {concurrency}, sent at once")
    return notes


def chunk_index(records: list) -> dict:
    """Which request each streamed chunk and each scheduled entry belongs to, in record order, and the order
    that sorts the chunks by request then time (outputs reach the client in record order), computed once per
    schedule (and the records' :func:`~m3lab.serving.timeline.call_order`)."""
    counts = np.fromiter((len(r.emitted) for r in records), np.int64, len(records))
    chunk_rid = np.fromiter(chain.from_iterable(r.emitted for r in records), np.int64, int(counts.sum()))
    order = np.argsort(chunk_rid, kind="stable")
    scount = np.fromiter((len(r.scheduled) for r in records), np.int64, len(records))
    sched_rid = np.fromiter(chain.from_iterable(r.scheduled for r in records), np.int64, int(scount.sum()))
    return {"counts": counts, "order": order, "chunk_rid": chunk_rid[order], "scount": scount,
            "sched_rid": sched_rid, "call_order": call_order(records)}


def _per_request(index: dict, out_s: np.ndarray, start_s: np.ndarray, n: int, concurrency: int) -> dict:
    """Send, first-token, finish and first-scheduled times of the ``n`` requests, and every streamed chunk as flat
    arrays (``chunk_rid``, ``chunk_s``) sorted by request then time, from each step's output and start time [R]."""
    chunk_rid = index["chunk_rid"]
    chunk_s = np.repeat(out_s, index["counts"])[index["order"]]
    first_at = np.searchsorted(chunk_rid, np.arange(n))
    last_at = np.searchsorted(chunk_rid, np.arange(n), side="right") - 1
    if (last_at < first_at).any():
        raise M3LabError("a request never streamed a token in the step sequence", field="records")
    first_sched = np.full(n, np.inf)
    np.minimum.at(first_sched, index["sched_rid"], np.repeat(start_s, index["scount"]))
    finish = chunk_s[last_at]
    # the semaphore of vllm bench: C sent at 0, then request C + k when the k-th completion arrives
    send = np.zeros(n)
    send[concurrency:] = np.sort(finish)[:max(n - concurrency, 0)]
    return {"send": send, "first": chunk_s[first_at], "finish": finish, "first_sched": first_sched,
            "chunk_rid": chunk_rid, "chunk_s": chunk_s}


def simulate_records(cfg: SchedulerConfig, contents: RequestContents, concurrency: int, *, engine: str = "m3lab",
                     outputs: FakeOutputs | None = None, progress: bool = False) -> list[StepRecord]:
    """The closed-loop step records from m3lab's generator or vLLM's own scheduler (``engine="vllm"``);
    ``progress``: a bar over finished requests once the run has taken a few seconds."""
    if engine not in ENGINES:
        raise M3LabError(f"unknown engine {engine!r}", field="engine", hint=f"choose one of {', '.join(ENGINES)}")
    arrivals = ClosedLoop(len(contents), concurrency)
    if engine == "m3lab":
        with late_progress("schedule (m3lab)", len(contents), progress) as bar:
            return Scheduler(cfg, outputs=outputs).records(contents, arrivals, on_finish=bar.update)
    if cfg.num_kv_blocks is None:                      # vLLM needs a finite pool: one that holds every request
        need = int(ceil_div(contents.prompt + contents.max_tokens + 8 * (cfg.spec_tokens + 1), cfg.block_size).sum())
        cfg = cfg.replace(num_kv_blocks=need + 2)
    return Judge(cfg, contents, outputs or FakeOutputs(), arrivals=arrivals).run(progress=progress)


def _assemble(records: list, device: np.ndarray, host: np.ndarray, contents: RequestContents, config: dict,
              notes: list, seconds: float, columns: dict, index: dict) -> BenchRun:
    """The timeline (plus ``columns`` per step), per-request times and vllm bench's metrics of timed records."""
    tl = step_timeline(records, device, host, index.get("call_order"))
    for name, values in columns.items():
        tl[name] = values
    tl["t_ms"] = (tl["end_s"] - tl["start_s"]) * 1e3
    conc = config["max_concurrency"]
    req = _per_request(index, tl["output_s"].to_numpy(), tl["start_s"].to_numpy(), len(contents), conc)
    duration = float(req["finish"].max())
    raw = bench_metrics(contents.prompt, contents.max_tokens, req["send"], req["chunk_rid"], req["chunk_s"],
                        duration, config["percentiles"])
    requests = pd.DataFrame({"request": np.arange(len(contents)), "prompt_tokens": contents.prompt,
                             "output_tokens": contents.max_tokens, "send_s": req["send"],
                             "first_scheduled_s": req["first_sched"], "first_token_s": req["first"],
                             "finish_s": req["finish"]})
    requests["queueing_s"] = requests["first_scheduled_s"] - requests["send_s"]
    requests["ttft_s"] = requests["first_token_s"] - requests["send_s"]
    requests["e2el_s"] = requests["finish_s"] - requests["send_s"]
    requests["tpot_ms"] = np.where(requests["output_tokens"] > 1, (requests["e2el_s"] - requests["ttft_s"])
                                   / np.maximum(requests["output_tokens"] - 1, 1) * 1e3, np.nan)
    notes = list(notes) + _burst_note(requests, conc, config["percentiles"])
    return BenchRun(raw, requests, tl, notes, config, seconds, records, contents, columns, index)


def stretch_runs(records: list) -> list[tuple[int, int]]:
    """``[start, end)`` index ranges of the records: each decode stretch's records together (they share their
    stretch arrays), every other record alone."""
    out, i, n = [], 0, len(records)
    while i < n:
        st = records[i].stretch
        k = i + 1
        if st is not None:
            while k < n and records[k].stretch is not None and records[k].stretch[0] is st[0]:
                k += 1
        out.append((i, k))
        i = k
    return out


def engine_steps(records: list, prompt, *, per_record: bool = True) -> list:
    """Each record as the cost model takes it (:meth:`~m3lab.workload.requests.StepRecord.engine_step`); None for
    a record that scheduled nothing (it only preempted). ``per_record=False``: a stretch's records share its first
    step (what host time and the step counts need: the same requests, one token each)."""
    if per_record:
        return [r.engine_step(prompt, i) if r.scheduled else None for i, r in enumerate(records)]
    out = []
    for i, k in stretch_runs(records):
        r = records[i]
        out.extend([r.engine_step(prompt, i) if r.scheduled else None] * (k - i))
    return out


def time_records(records: list, cfg: SchedulerConfig, contents: RequestContents, step_us, *, max_concurrency: int,
                 host_us: HostUs | None = None, gpus: int = 1, engine: str = "m3lab", percentiles=PERCENTILES,
                 seconds: float = 0.0, steps: list | None = None) -> BenchRun:
    """Time closed-loop ``records`` of ``contents`` (from :func:`simulate_records`): device µs per step from
    ``step_us`` (a callable of an :class:`EngineStep`, or the values per record), host µs from ``host_us``
    (default none), and vllm bench's metrics. ``steps``: :func:`engine_steps` of the records (per record when
    ``step_us`` is a callable), when at hand."""
    if steps is None:
        steps = engine_steps(records, contents.prompt, per_record=callable(step_us))
    if callable(step_us):
        device = np.array([float(step_us(s)) if s is not None else 0.0 for s in steps])
    else:
        device = np.asarray(step_us, float)
    host = np.array([host_us(s) if s is not None and host_us is not None else (0.0, 0.0, 0.0) for s in steps],
                    float)
    host = host_columns(host.reshape(len(steps), -1) if len(steps) else np.zeros((0, 3)))
    config = {"engine": engine, "max_concurrency": int(max_concurrency), "num_prompts": len(contents), "gpus": gpus,
              "async_scheduling": cfg.async_scheduling, "max_num_seqs": cfg.max_num_seqs,
              "max_num_batched_tokens": cfg.max_num_batched_tokens, "num_kv_blocks": cfg.num_kv_blocks,
              "steps": int(sum(1 for s in steps if s is not None)), "percentiles": tuple(percentiles)}
    columns = {"index": np.arange(len(records)), "repeat": np.ones(len(records), np.int64),
               "tokens": [r.num_tokens for r in records],
               "decodes": [s.num_decodes if s is not None else 0 for s in steps],
               "prefill_tokens": [s.num_prefill_tokens if s is not None else 0 for s in steps],
               "running": [r.running for r in records], "waiting": [r.waiting for r in records],
               "kv_usage": [r.kv_usage for r in records]}
    return _assemble(records, device, host, contents, config, _notes(cfg, contents, int(max_concurrency), records),
                     seconds, columns, chunk_index(records))


def bench_load(cfg: SchedulerConfig, contents: RequestContents, step_us: StepUs, *, max_concurrency: int,
               host_us: HostUs | None = None, gpus: int = 1, engine: str = "m3lab",
               outputs: FakeOutputs | None = None, percentiles=PERCENTILES, progress: bool = False) -> BenchRun:
    """``vllm bench serve --max-concurrency C --num-prompts len(contents) --request-rate inf`` (module docstring).

    ``step_us(step)``: device µs of an :class:`EngineStep`; ``host_us(step)``: host µs (ready, issue, after) or
    (before, after) (default none; :mod:`m3lab.serving.timeline`); ``gpus``: the deployment's GPU count (per-GPU
    throughputs); ``engine``: ``m3lab`` (the step generator) or ``vllm`` (vLLM's own scheduler: the same
    records, slower); ``progress``: show a bar on long runs."""
    if not isinstance(max_concurrency, (int, np.integer)) or max_concurrency < 1:
        raise M3LabError(f"max_concurrency={max_concurrency!r} must be a positive integer", field="max_concurrency")
    if not isinstance(gpus, (int, np.integer)) or gpus < 1:
        raise M3LabError(f"gpus={gpus!r} must be a positive integer", field="gpus")
    t0 = time.perf_counter()
    records = simulate_records(cfg, contents, int(max_concurrency), engine=engine, outputs=outputs,
                               progress=progress)
    return time_records(records, cfg, contents, step_us, max_concurrency=int(max_concurrency), host_us=host_us,
                        gpus=int(gpus), engine=engine, percentiles=percentiles, seconds=time.perf_counter() - t0)


def fixed_lengths(isl: int, osl: int, num_prompts: int = VLLM_BENCH_NUM_PROMPTS) -> UniqueContents:
    """``--dataset-name random --random-input-len isl --random-output-len osl --ignore-eos`` with range ratio 0."""
    return UniqueContents(np.full(num_prompts, isl), np.full(num_prompts, osl))


def compare_engines(isl: int = 8192, osl: int = 1024, concurrency: int = 32, num_prompts: int = 128,
                    cfg: SchedulerConfig | None = None) -> dict:
    """Wall time of the same run through m3lab's generator and vLLM's own scheduler (a toy step time: the
    schedule, not the cost model, is what is timed), and whether their metrics agree exactly."""
    cfg = cfg or SchedulerConfig()
    contents = fixed_lengths(isl, osl, num_prompts)

    def toy(step):
        return 5000.0 + 2.0 * step.num_tokens


    t0 = time.perf_counter()
    warm_up()
    import_s = time.perf_counter() - t0
    runs = {e: bench_load(cfg, contents, toy, max_concurrency=concurrency, engine=e, progress=e == "vllm")
            for e in ENGINES}
    return {"isl": isl, "osl": osl, "concurrency": concurrency, "num_prompts": num_prompts,
            "steps": runs["m3lab"].config["steps"], "m3lab_s": runs["m3lab"].seconds, "vllm_s": runs["vllm"].seconds,
            "vllm_import_s": import_s,
            "vllm_over_m3lab": runs["vllm"].seconds / runs["m3lab"].seconds,
            "same_metrics": runs["m3lab"].raw == runs["vllm"].raw}


def main(argv: list[str] | None = None) -> None:
    """``python -m m3lab.serving.bench_load [ISL OSL CONCURRENCY NUM_PROMPTS]``: how much slower vLLM's scheduler is."""
    import sys

    args = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    r = compare_engines(*args)
    print(f"vllm bench serve {r['isl']}/{r['osl']} c={r['concurrency']} n={r['num_prompts']}: {r['steps']} steps; "
          f"m3lab {r['m3lab_s']:.2f} s, vLLM's scheduler {r['vllm_s']:.2f} s ({r['vllm_over_m3lab']:.1f}x slower, "
          f"after {r['vllm_import_s']:.1f} s to import and build vLLM; measured on this machine); "
          f"same metrics: {r['same_metrics']}")


if __name__ == "__main__":
    main()
