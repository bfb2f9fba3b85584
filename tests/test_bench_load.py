"""vllm bench's closed-loop load, the step timeline and the metrics (m3lab.serving.bench_load)."""
from __future__ import annotations

import numpy as np
import pytest

from m3lab.errors import M3LabError
from m3lab.serving.bench_load import bench_load, fixed_lengths, step_timeline
from m3lab.serving.vllm_bench import parse_bench_result
from m3lab.workload.requests import FakeOutputs, UniqueContents
from m3lab.workload.scheduler import SchedulerConfig


def step_us(step):
    """A toy device time: 4 ms + 2 µs per token + 20 µs per request."""
    return 4000.0 + 2.0 * step.num_tokens + 20.0 * step.num_reqs


def host_us(step):
    return 600.0, 300.0


MTP = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, block_size=16, num_kv_blocks=300,
                      spec_method="mtp", spec_tokens=3)


@pytest.mark.parametrize("cfg", [SchedulerConfig(async_scheduling=False), MTP], ids=["sync", "async-mtp"])
def test_metrics_are_vllm_bench_calculate_metrics(cfg):
    from m3lab.vllm_src.imports import vllm_module

    serve = vllm_module("vllm.benchmarks.serve")
    func = vllm_module("vllm.benchmarks.lib.endpoint_request_func")
    contents = UniqueContents([300, 40, 700, 90, 10, 250, 128, 64], [20, 1, 35, 12, 40, 3, 17, 9])
    run = bench_load(cfg, contents, step_us, max_concurrency=3, host_us=host_us, outputs=FakeOutputs(p=0.6))
    req, steps = run.requests, run.steps
    outs = []
    for i, row in req.iterrows():
        t = np.sort(steps["output_s"].to_numpy()[[i in r.emitted for r in run.records]])
        outs.append(func.RequestFuncOutput(success=True, latency=row.e2el_s, output_tokens=int(row.output_tokens),
                                           ttft=row.ttft_s, itl=list(np.diff(t)), prompt_len=int(row.prompt_tokens),
                                           start_time=row.send_s))
    m, _ = serve.calculate_metrics([], outs, run.raw["duration"], None, [90, 99], {})
    raw = run.raw
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std"):
            assert raw[f"{stat}_{name}_ms"] == pytest.approx(getattr(m, f"{stat}_{name}_ms"), rel=1e-9, abs=1e-9)
        for p, v in getattr(m, f"percentiles_{name}_ms"):
            assert raw[f"p{int(p)}_{name}_ms"] == pytest.approx(v, rel=1e-9, abs=1e-9)
    for key, attr in (("request_throughput", "request_throughput"), ("output_throughput", "output_throughput"),
                      ("total_token_throughput", "total_token_throughput"), ("total_output_tokens", "total_output"),
                      ("total_input_tokens", "total_input"), ("completed", "completed")):
        assert raw[key] == pytest.approx(getattr(m, attr), rel=1e-12), key
    assert parse_bench_result(raw).completed == len(contents)          # the --save-result reader takes it
    if cfg.spec_method:                                                  # drafts stream several tokens per chunk
        assert any(n > 1 for r in run.records for n in r.emitted.values())


def test_closed_loop_keeps_c_requests_in_flight():
    run = bench_load(SchedulerConfig(), fixed_lengths(500, 30, 40), step_us, max_concurrency=6)
    r = run.requests
    assert (r["send_s"].iloc[:6] == 0).all()
    finish = np.sort(r["finish_s"].to_numpy())
    assert np.array_equal(np.sort(r["send_s"].iloc[6:].to_numpy()), finish[:34])   # each completion sends one
    for t in np.unique(np.r_[r["send_s"], r["finish_s"]]):
        assert ((r["send_s"] <= t) & (r["finish_s"] > t)).sum() <= 6
    assert (r["queueing_s"] >= 0).all() and (r["ttft_s"] >= r["queueing_s"]).all()
    assert run.summary()["queueing_s"] == pytest.approx(float(r["queueing_s"].median()))


def test_sync_steps_run_in_series_async_overlaps_the_host():
    lengths = fixed_lengths(64, 200, 4)
    period = {}
    for asy in (False, True):
        run = bench_load(SchedulerConfig(async_scheduling=asy), lengths, lambda s: 5000.0, max_concurrency=4,
                         host_us=lambda s: (700.0, 400.0))
        st = run.steps
        gaps = np.diff(st["start_s"].to_numpy())[5:50]
        period[asy] = float(np.median(gaps))
    assert period[False] == pytest.approx((700 + 5000 + 400) * 1e-6)
    assert period[True] == pytest.approx(5000 * 1e-6)                 # the device never waits for the CPU


def test_step_timeline_when_the_host_is_the_bottleneck():
    from m3lab.workload.requests import StepRecord
    recs = [StepRecord(call=c, scheduled={0: 1}, computed={0: c}, spec={}, applied=c + 2) for c in range(6)]
    tl = step_timeline(recs, np.full(6, 100.0), np.tile([800.0, 500.0], (6, 1)))
    assert np.allclose(np.diff(tl["start_s"].to_numpy())[1:], 1300e-6)  # host before + after per call (the first
    assert tl["start_s"].iloc[0] == pytest.approx(800e-6)                # call applies no output)


def test_the_vllm_engine_gives_the_same_run():
    cfg = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=256, block_size=16, num_kv_blocks=90,
                          spec_method="mtp", spec_tokens=2)
    contents = UniqueContents([120, 300, 40, 200, 64, 500, 33, 90], [30, 12, 50, 7, 25, 40, 3, 60])
    ours = bench_load(cfg, contents, step_us, max_concurrency=4, host_us=host_us)
    theirs = bench_load(cfg, contents, step_us, max_concurrency=4, host_us=host_us, engine="vllm")
    assert ours.raw == theirs.raw and ours.config["engine"] == "m3lab" and theirs.config["engine"] == "vllm"


def test_notes_say_why_c_requests_cannot_run_at_once():
    slots = bench_load(SchedulerConfig(max_num_seqs=4), fixed_lengths(100, 10, 40), step_us, max_concurrency=8)
    assert any("max_num_seqs 4 < concurrency 8" in n for n in slots.notes)
    kv = bench_load(SchedulerConfig(block_size=16, num_kv_blocks=40), fixed_lengths(300, 50, 24), step_us,
                    max_concurrency=8)
    assert any("KV cache" in n for n in kv.notes)
    short = bench_load(SchedulerConfig(), fixed_lengths(100, 10, 10), step_us, max_concurrency=8)
    assert any("steady state" in n for n in short.notes)
    assert not bench_load(SchedulerConfig(), fixed_lengths(100, 10, 40), step_us, max_concurrency=8).notes
    with pytest.raises(M3LabError, match="max_concurrency"):
        bench_load(SchedulerConfig(), fixed_lengths(100, 10, 4), step_us, max_concurrency=0)


def test_ttft_rises_with_concurrency_through_the_schedule():
    """A fixed cost per token: more concurrent requests mean longer steps and more prefill contention."""
    ttft = [bench_load(SchedulerConfig(max_num_batched_tokens=2048), fixed_lengths(2048, 64, 4 * c), step_us,
                       max_concurrency=c).summary()["ttft_s"] for c in (2, 8, 32)]
    assert ttft[0] < ttft[1] < ttft[2]


def test_an_unlimited_pool_schedules_as_vllm_with_room_for_everything():
    contents = fixed_lengths(300, 20, 12)
    ours = bench_load(SchedulerConfig(max_num_batched_tokens=512), contents, step_us, max_concurrency=5)
    theirs = bench_load(SchedulerConfig(max_num_batched_tokens=512), contents, step_us, max_concurrency=5,
                        engine="vllm")
    assert ours.raw == theirs.raw and ours.config["num_kv_blocks"] is None
