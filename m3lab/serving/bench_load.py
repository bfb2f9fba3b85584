"""``vllm bench serve --max-concurrency C --num-prompts N --request-rate inf`` on the step sequence: load, time, metrics.

The load (``vllm/benchmarks/serve.py``, ``benchmark``): all N requests are created at once and pass a semaphore of
C, so C are sent at the start and each completion sends the next, N in all (default ``DEFAULT_NUM_PROMPTS``, as
vllm bench's). The step sequence is vLLM's (:meth:`m3lab.workload.scheduler.Scheduler.records`, or vLLM's own
scheduler with ``engine="vllm"``: the same records, slower), requests added before the ``schedule()`` call that
follows the completion they wait for (a client with no round trip).

Time (:func:`step_timeline`): each executed step costs ``step_us(step)`` µs of device time and
``host_us(step) = (before, after)`` µs of CPU time: scheduling + input preparation + launch before the device
runs it, output processing after. Sync scheduling runs them in series (``EngineCore.step``); async scheduling
(vLLM 0.33.0's default, ``EngineCore.step_with_batch_queue``) schedules and launches step n+1 while step n runs
and processes step n's outputs after launching step n+1, as the batch queue orders those calls. A step's tokens
reach the client when its outputs are processed.

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

from m3lab.errors import M3LabError
from m3lab.workload.requests import ClosedLoop, FakeOutputs, RequestContents, StepRecord, UniqueContents
from m3lab.workload.scheduler import MIN_REQUESTS_PER_SLOT, Scheduler, SchedulerConfig
from m3lab.workload.step import EngineStep

#: ``--num-prompts`` default of vllm bench (``DEFAULT_NUM_PROMPTS``, vllm/benchmarks/datasets/datasets.py).
DEFAULT_NUM_PROMPTS = 1000
#: Percentiles reported beside mean and median (vllm bench's ``--metric-percentiles 90,99``).
PERCENTILES = (90, 99)
ENGINES = ("m3lab", "vllm")
METRICS = ("ttft", "tpot", "itl", "e2el")

StepUs = Callable[[EngineStep], float]
HostUs = Callable[[EngineStep], "tuple[float, float]"]


def step_timeline(records: list[StepRecord], device_us: np.ndarray, host_us: np.ndarray) -> pd.DataFrame:
    """Start, end and output time (s) of each record from its device time [R] and host (before, after) [R, 2] in µs.

    Walks the ``schedule()`` calls in order: a call that scheduled a step spends its host-before time, then the
    device starts it when free; outputs applied after call c (``record.applied == c + 1``) wait for their step
    to end, then spend its host-after time. Sync and async differ only in where the records say outputs were
    applied (the same call in sync, one call later in async), and in sync the device waits for the CPU. A step
    whose outputs were never applied (in flight when the last request finished) has ``output_s`` NaN."""
    n = len(records)
    start, end, out = np.zeros(n), np.zeros(n), np.full(n, np.nan)
    by_call = sorted(range(n), key=lambda i: records[i].call)
    applied = [i for i in range(n) if records[i].applied is not None]   # the last may still be in flight at the end
    by_applied = sorted(applied, key=lambda i: (records[i].applied, records[i].call))
    cpu = gpu = 0.0
    j, m = 0, len(by_applied)
    for i in by_call + [None]:
        c = records[i].call if i is not None else None
        while j < m and (c is None or records[by_applied[j]].applied <= c):
            k = by_applied[j]
            cpu = max(cpu, end[k]) + host_us[k, 1] * 1e-6
            out[k] = cpu
            j += 1
        if i is None:
            break
        cpu += host_us[i, 0] * 1e-6
        start[i] = max(gpu, cpu)
        end[i] = gpu = start[i] + device_us[i] * 1e-6
    return pd.DataFrame({"call": [r.call for r in records], "start_s": start, "end_s": end, "output_s": out,
                         "device_us": device_us, "host_before_us": host_us[:, 0], "host_after_us": host_us[:, 1]})


def _stats(values: list | np.ndarray, name: str, scale: float, percentiles) -> dict:
    """mean / median / std / pXX of ``values`` (s) in ms, as vllm bench (``np.percentile``; 0 when empty)."""
    v = np.asarray(values, float) if len(values) else np.zeros(1)
    out = {f"mean_{name}_ms": float(np.mean(v)) * scale, f"median_{name}_ms": float(np.median(v)) * scale,
           f"std_{name}_ms": float(np.std(v)) * scale}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(v, p)) * scale
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
    requests: pd.DataFrame = field(repr=False)   # send_s, first_token_s, finish_s, ttft_s, e2el_s, tpot_ms, ...
    steps: pd.DataFrame = field(repr=False)      # per step: call, start_s, end_s, output_s, times, tokens, counts
    notes: list
    config: dict
    seconds: float = 0.0                         # wall time the simulation took
    records: list = field(default_factory=list, repr=False)   # the StepRecords, one per row of ``steps``

    def summary(self) -> dict:
        """The headline figures (s and ms as named), per GPU throughputs, ``queueing_s`` and the notes."""
        r, gpus = self.raw, self.config["gpus"]
        out = {"ttft_s": r["median_ttft_ms"] / 1e3, "ttft_mean_s": r["mean_ttft_ms"] / 1e3,
               **{f"ttft_p{p}_s": r[f"p{p}_ttft_ms"] / 1e3 for p in PERCENTILES},
               "tpot_ms": r["mean_tpot_ms"], "tpot_median_ms": r["median_tpot_ms"],
               **{f"tpot_p{p}_ms": r[f"p{p}_tpot_ms"] for p in PERCENTILES},
               "itl_ms": r["mean_itl_ms"], "itl_median_ms": r["median_itl_ms"],
               "e2el_s": r["median_e2el_ms"] / 1e3, "e2el_mean_s": r["mean_e2el_ms"] / 1e3,
               "queueing_s": float(self.requests["queueing_s"].median()),
               "output_tokens_per_s": r["output_throughput"], "total_tokens_per_s": r["total_token_throughput"],
               "output_tokens_per_s_per_gpu": r["output_throughput"] / gpus,
               "total_tokens_per_s_per_gpu": r["total_token_throughput"] / gpus,
               "request_throughput": r["request_throughput"], "duration_s": r["duration"], "notes": list(self.notes)}
        return {**out, **self.config}


def _notes(cfg: SchedulerConfig, contents: RequestContents, concurrency: int, records: list) -> list[str]:
    """One line per reason C requests cannot run at once (slots, KV), preemptions seen, and a too-short run."""
    notes = []
    if concurrency > cfg.max_num_seqs:
        notes.append(f"max_num_seqs {cfg.max_num_seqs} < concurrency {concurrency}: at most {cfg.max_num_seqs} "
                     "requests run at once, the others wait in the server's queue (inside TTFT)")
    if cfg.num_kv_blocks is not None:
        per_req = float(np.mean(-(-(contents.prompt + contents.max_tokens) // cfg.block_size)))
        fits = int((cfg.num_kv_blocks - 1) // per_req)
        if fits < min(concurrency, cfg.max_num_seqs):
            notes.append(f"the KV cache ({cfg.num_kv_blocks - 1} blocks of {cfg.block_size}) holds about {fits} "
                         f"whole sequences, not {concurrency}: admission waits for KV (inside TTFT)")
    pre = sum(len(r.preempted) for r in records)
    if pre:
        notes.append(f"{pre} preemptions: victims recompute their prompt and outputs")
    if len(contents) < MIN_REQUESTS_PER_SLOT * concurrency:
        notes.append(f"num_prompts {len(contents)} < {MIN_REQUESTS_PER_SLOT} x concurrency {concurrency}: the run is "
                     "mostly its start-up burst, not steady state (TTFT and throughput are start-up figures)")
    return notes


def _per_request(records: list, tl: pd.DataFrame, contents: RequestContents, concurrency: int) -> dict:
    """Send, first-token, finish and first-scheduled times per request, and every streamed chunk as flat arrays
    (``chunk_rid``, ``chunk_s``) sorted by request then time."""
    n = len(contents)
    out_s, start_s = tl["output_s"].to_numpy(), tl["start_s"].to_numpy()
    counts = np.fromiter((len(r.emitted) for r in records), np.int64, len(records))
    chunk_rid = np.fromiter(chain.from_iterable(r.emitted for r in records), np.int64, int(counts.sum()))
    chunk_s = np.repeat(out_s, counts)
    order = np.lexsort((chunk_s, chunk_rid))
    chunk_rid, chunk_s = chunk_rid[order], chunk_s[order]
    first_at = np.searchsorted(chunk_rid, np.arange(n))
    last_at = np.searchsorted(chunk_rid, np.arange(n), side="right") - 1
    if (last_at < first_at).any():
        raise M3LabError("a request never streamed a token in the step sequence", field="records")
    scount = np.fromiter((len(r.scheduled) for r in records), np.int64, len(records))
    sched_rid = np.fromiter(chain.from_iterable(r.scheduled for r in records), np.int64, int(scount.sum()))
    first_sched = np.full(n, np.inf)
    np.minimum.at(first_sched, sched_rid, np.repeat(start_s, scount))
    finish = chunk_s[last_at]
    # the semaphore of vllm bench: C sent at 0, then request C + k when the k-th completion arrives
    send = np.zeros(n)
    send[concurrency:] = np.sort(finish)[:max(n - concurrency, 0)]
    return {"send": send, "first": chunk_s[first_at], "finish": finish, "first_sched": first_sched,
            "chunk_rid": chunk_rid, "chunk_s": chunk_s}


def simulate_records(cfg: SchedulerConfig, contents: RequestContents, concurrency: int, *, engine: str = "m3lab",
                     outputs: FakeOutputs | None = None, progress: bool = False) -> list[StepRecord]:
    """The closed-loop step records from m3lab's generator or vLLM's own scheduler (``engine="vllm"``, with a
    progress bar when ``progress``)."""
    if engine not in ENGINES:
        raise M3LabError(f"unknown engine {engine!r}", field="engine", hint=f"choose one of {', '.join(ENGINES)}")
    arrivals = ClosedLoop(len(contents), concurrency)
    if engine == "m3lab":
        return Scheduler(cfg, outputs=outputs).records(contents, arrivals)
    from m3lab.vllm.scheduler_judge import Judge       # heavy, optional (vLLM)
    if cfg.num_kv_blocks is None:                      # vLLM needs a finite pool: one that holds every request
        need = int((-(-(contents.prompt + contents.max_tokens + 8 * (cfg.spec_tokens + 1)) // cfg.block_size)).sum())
        cfg = cfg.replace(num_kv_blocks=need + 2)
    return Judge(cfg, contents, outputs or FakeOutputs(), arrivals=arrivals).run(progress=progress)


def bench_load(cfg: SchedulerConfig, contents: RequestContents, step_us: StepUs, *, max_concurrency: int,
               host_us: HostUs | None = None, gpus: int = 1, engine: str = "m3lab",
               outputs: FakeOutputs | None = None, percentiles=PERCENTILES, progress: bool = False) -> BenchRun:
    """``vllm bench serve --max-concurrency C --num-prompts len(contents) --request-rate inf`` (module docstring).

    ``step_us(step)``: device µs of an :class:`EngineStep`; ``host_us(step)``: (before, after) host µs (default
    none); ``gpus``: the deployment's GPU count (per-GPU throughputs); ``engine``: ``m3lab`` (the step
    generator) or ``vllm`` (vLLM's own scheduler: the same records, slower; ``progress`` shows a bar)."""
    if not isinstance(max_concurrency, (int, np.integer)) or max_concurrency < 1:
        raise M3LabError(f"max_concurrency={max_concurrency!r} must be a positive integer", field="max_concurrency")
    if not isinstance(gpus, (int, np.integer)) or gpus < 1:
        raise M3LabError(f"gpus={gpus!r} must be a positive integer", field="gpus")
    t0 = time.perf_counter()
    records = simulate_records(cfg, contents, int(max_concurrency), engine=engine, outputs=outputs,
                               progress=progress)
    prompt = contents.prompt
    steps = [r.engine_step(prompt, i) if r.scheduled else None for i, r in enumerate(records)]
    device = np.array([float(step_us(s)) if s is not None else 0.0 for s in steps])
    host = np.array([tuple(host_us(s)) if s is not None and host_us is not None else (0.0, 0.0) for s in steps],
                    float).reshape(len(steps), 2)
    tl = step_timeline(records, device, host)
    tl["tokens"] = [r.num_tokens for r in records]
    tl["running"], tl["waiting"] = [r.running for r in records], [r.waiting for r in records]
    tl["kv_usage"] = [r.kv_usage for r in records]
    req = _per_request(records, tl, contents, int(max_concurrency))
    duration = float(req["finish"].max())
    raw = bench_metrics(prompt, contents.max_tokens, req["send"], req["chunk_rid"], req["chunk_s"], duration,
                        percentiles)
    requests = pd.DataFrame({"request": np.arange(len(contents)), "prompt_tokens": prompt,
                             "output_tokens": contents.max_tokens, "send_s": req["send"],
                             "first_scheduled_s": req["first_sched"], "first_token_s": req["first"],
                             "finish_s": req["finish"]})
    requests["queueing_s"] = requests["first_scheduled_s"] - requests["send_s"]
    requests["ttft_s"] = requests["first_token_s"] - requests["send_s"]
    requests["e2el_s"] = requests["finish_s"] - requests["send_s"]
    requests["tpot_ms"] = np.where(requests["output_tokens"] > 1, (requests["e2el_s"] - requests["ttft_s"])
                                   / np.maximum(requests["output_tokens"] - 1, 1) * 1e3, np.nan)
    config = {"engine": engine, "max_concurrency": int(max_concurrency), "num_prompts": len(contents), "gpus": gpus,
              "async_scheduling": cfg.async_scheduling, "max_num_seqs": cfg.max_num_seqs,
              "max_num_batched_tokens": cfg.max_num_batched_tokens, "num_kv_blocks": cfg.num_kv_blocks,
              "steps": int(sum(1 for s in steps if s is not None))}
    return BenchRun(raw, requests, tl, _notes(cfg, contents, int(max_concurrency), records), config,
                    time.perf_counter() - t0, records)


def fixed_lengths(isl: int, osl: int, num_prompts: int = DEFAULT_NUM_PROMPTS) -> UniqueContents:
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

    from m3lab.vllm.scheduler_judge import warm_up     # heavy, optional (vLLM)

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
