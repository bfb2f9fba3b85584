"""Engines on a clock (m3lab.serving.timed_engine) and P/D served as vLLM serves it (m3lab.serving.pd_sim)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app
from m3lab.serving.bench_load import bench_load, fixed_lengths
from m3lab.serving.timed_engine import TimedEngine, run_engines
from m3lab.spec.serving import make_deployment
from m3lab.workload.requests import FakeOutputs
from m3lab.workload.scheduler import Scheduler, SchedulerConfig


def step_us(step):
    return 4000.0 + 2.0 * step.num_tokens + 20.0 * step.num_reqs


def host_us(step):
    return 300.0, 900.0 if not step.is_decode.all() else 150.0, 200.0


def _closed_loop(cfg, contents, conc, outputs=None, horizon=None):
    """vllm bench's closed loop on a TimedEngine: each finish sends the next request at its output time."""
    engine = TimedEngine(Scheduler(cfg, outputs=outputs).engine(contents), step_us, host_us)
    state = {"next": conc, "done": 0}
    chunks = []
    for rid in range(conc):
        engine.push(0.0, rid)

    def on_output(e, out):
        chunks.extend(out.chunks)
        for _, t in out.finished:
            state["done"] += 1
            if state["next"] < len(contents):
                e.push(t, state["next"])
                state["next"] += 1

    if horizon is None:
        run_engines([engine], on_output, lambda: state["done"] >= len(contents))
    else:                       # a horizon a few steps ahead: stretches are cut short, the result must not change
        while state["done"] < len(contents):
            on_output(engine, engine.call(engine.tl.cpu + horizon))
    return engine, chunks


@pytest.mark.parametrize("cfg", [SchedulerConfig(max_num_batched_tokens=512, block_size=16, num_kv_blocks=300),
                                 SchedulerConfig(max_num_batched_tokens=512, async_scheduling=False),
                                 SchedulerConfig(max_num_batched_tokens=256, block_size=16, num_kv_blocks=200,
                                                 spec_method="mtp", spec_tokens=2, prefix_caching=True)],
                         ids=["async", "sync", "mtp"])
@pytest.mark.parametrize("horizon", [None, 0.05])
def test_a_closed_loop_on_a_clock_is_bench_loads(cfg, horizon):
    """Pushing each next request at the finish time reproduces vllm bench's closed loop step for step, with the
    same times (decode stretches included, with or without a horizon cutting them)."""
    contents = fixed_lengths(300, 40, 24)
    outputs = FakeOutputs(p=0.7)
    ref = bench_load(cfg, contents, step_us, max_concurrency=5, host_us=host_us, outputs=outputs)
    engine, chunks = _closed_loop(cfg, contents, 5, outputs, horizon)
    assert [r.key() for r in engine.records] == [r.key() for r in ref.records if r.scheduled]
    rows = np.array(engine.rows)
    st = ref.steps[[bool(r.scheduled) for r in ref.records]]
    assert np.allclose(rows[:, 0], st["start_s"]) and np.allclose(rows[:, 1], st["end_s"])
    first = {}
    for rid, _, t in chunks:
        first.setdefault(rid, t)
    assert np.allclose([first[i] for i in range(len(contents))], ref.requests["first_token_s"])
    if cfg.spec_method is None and horizon is None:
        assert any(a.scheduled is b.scheduled for a, b in zip(engine.records, engine.records[1:]))  # stretched


def test_arrivals_at_times_wait_for_their_time_and_an_idle_engine_sleeps():
    contents = fixed_lengths(100, 5, 3)
    engine = TimedEngine(Scheduler(SchedulerConfig()).engine(contents), step_us)
    for rid, t in enumerate((0.0, 0.5, 2.0)):
        engine.push(t, rid)
    done = []
    run_engines([engine], lambda e, out: done.extend(out.finished), lambda: len(done) == 3)
    for rid, t in enumerate((0.0, 0.5, 2.0)):
        assert engine.first_scheduled[rid] >= t
    assert engine.first_scheduled[2] == pytest.approx(2.0)               # nothing ran between: it slept


# ---- P/D ---------------------------------------------------------------------------------------------------
PD = dict(model="minimax-m3", hardware="mi355x", tp=4, quant="mxfp8", isl=2048, osl=32, pd="2:1")


def test_pd_ttft_is_its_four_parts_and_the_proxy_routes_round_robin():
    from m3lab.serving.disagg import pd_serving

    run = pd_serving(make_deployment(**PD, concurrency=8, num_prompts=24), calibration=None)
    req = run.requests
    parts = req["queueing_s"] + req["prefill_s"] + req["handoff_s"] + req["first_decode_s"]
    assert np.allclose(parts, req["ttft_s"]) and (req[["prefill_s", "first_decode_s"]] > 0).all().all()
    s = run.summary()
    assert (req["handoff_s"] >= s["kv_handoff_ms"] / 1e3 - 1e-12).all()          # the link takes its time
    assert sum(s["ttft_parts_mean_s"].values()) == pytest.approx(s["ttft_mean_s"])
    # vLLM's proxy: round robin over prefill instances in send order, over decode instances in response order
    assert (req["prefill_instance"] == req["request"] % 2).all() and (req["decode_instance"] == 0).all()
    assert set(run.engines) == {"prefill0", "prefill1", "decode0"}
    two = pd_serving(make_deployment(**{**PD, "pd": "1:2"}, concurrency=8, num_prompts=24), calibration=None)
    order = two.requests.sort_values("prefill_done_s")["decode_instance"].to_numpy()
    assert (order == np.arange(len(order)) % 2).all()
    assert s["routing"].startswith("round robin") and s["prefill_max_num_batched_tokens"] > 2048


def test_pd_notes_when_queueing_dominates_and_prefill_kv_is_held():
    from m3lab.serving.disagg import pd_estimate

    # one decode instance of 4 slots: requests wait for a decode slot while their KV stays on the prefill side
    d = make_deployment(**PD, concurrency=16, num_prompts=48).with_settings({"decode_max_num_seqs": 4})
    s = pd_estimate(d, calibration=None)
    assert s["decode_max_num_seqs"] == 4 and s["queueing_decode_s"] > s["queueing_prefill_s"]
    assert any("mostly waiting for a decode slot" in n for n in s["notes"])
    assert s["peak_prefill_kv_held_requests"] > 4


def test_pd_prefill_batches_prompts_within_its_token_budget():
    from m3lab.serving.disagg import pd_serving

    run = pd_serving(make_deployment(**PD, concurrency=8, num_prompts=16), calibration=None)
    steps = run.engines["prefill0"]
    assert steps["tokens"].max() > 2048 and (steps["tokens"] <= run.summary()["prefill_max_num_batched_tokens"]).all()


def test_estimate_pd_json_reports_ttft_and_its_parts():
    out = CliRunner().invoke(app, ["estimate", "--model", "minimax-m3", "--hardware", "mi355x", "--tp", "4",
                                   "--quant", "mxfp8", "--isl", "2048", "--osl", "32", "--pd", "2:1",
                                   "--concurrency", "64", "--num-prompts", "128", "--json"])
    assert out.exit_code == 0, out.output
    s = json.loads(out.stdout)
    for key in ("ttft_s", "queueing_s", "prefill_s", "handoff_s", "first_decode_s", "tpot_ms", "notes"):
        assert key in s and key in s["ceiling"] or key == "notes", key
    assert s["pd"] == "2:1" and s["gpus"] == 12
