"""Per-step host time (m3lab.cost.host_time): its data, its shape, and how async scheduling hides it."""
from __future__ import annotations

import pandas as pd
import pytest

from m3lab.cost import host_time as ht
from m3lab.errors import M3LabError
from m3lab.serving.bench_load import bench_load, fixed_lengths
from m3lab.workload.scheduler import SchedulerConfig

TRACE = "kineto/tracelens_vllm_prefilldecode_piecewise_graph_execution.json.gz"


def test_shipped_phases_are_the_traces(shared_dir):
    got = ht.kineto_host_phases(shared_dir / "data" / TRACE)
    shipped = pd.read_csv(ht.KINETO_CSV)
    pd.testing.assert_frame_equal(got, shipped, check_dtype=False)
    ph = shipped.set_index("phase")
    assert ph.loc["eager_attention", "calls"] == 24 and ph.loc["graph_launch", "calls"] == 25
    inside = ph.loc[["update_states", "prepare_inputs", "batch_dispatch", "slot_mappings", "attention_metadata",
                     "model_forward", "compute_logits", "logits_gather"], "total_us"].sum()
    assert inside <= ph.loc["execute_model", "total_us"]               # phases do not overlap


def test_every_constant_has_a_source_and_a_value():
    c, src = ht.constants(), ht.sources()
    for name, value in vars(c).items():
        assert value >= 0 and name in src, name
    assert c.schedule_per_request_us > 0 and c.update_per_request_us > 0
    assert c.eager_attention_us > c.piece_us > 0


def test_host_time_grows_with_the_step():
    small, big = ht.host_time(8, 8, layers=60), ht.host_time(128, 128, layers=60)
    assert big.schedule_us > small.schedule_us and big.update_us > small.update_us
    mixed = ht.host_time(128, 4096, layers=60, num_new=2, full_graph=False)
    assert mixed.launch_us > big.launch_us and mixed.prepare_us > big.prepare_us
    assert mixed.total_us == pytest.approx(mixed.before_us + mixed.after_us)
    half = ht.host_time(128, 128, layers=60, c=ht.constants().scaled(0.5))
    assert half.total_us == pytest.approx(big.total_us / 2)
    with pytest.raises(M3LabError, match="layers"):
        ht.host_time(4, 2, layers=60)


def test_async_scheduling_hides_host_time_that_sync_pays():
    host = ht.step_host_us(layers=60)
    lengths = fixed_lengths(256, 64, 16)
    tpot = {}
    for asy in (False, True):
        for with_host in (False, True):
            run = bench_load(SchedulerConfig(async_scheduling=asy), lengths, lambda s: 20_000.0, max_concurrency=8,
                             host_us=host if with_host else None)
            tpot[asy, with_host] = run.summary()["tpot_ms"]
    steady = next(st for st in (r.engine_step(lengths.prompt) for r in run.records)
                  if st.num_reqs == 8 and st.is_decode.all())                 # a step of 8 decodes
    ready, issue, after = host(steady)
    assert issue > 0                                             # the graph launch: it overlaps the device work
    assert tpot[False, True] == pytest.approx(tpot[False, False] + (ready + after) / 1e3, rel=0.02)
    assert tpot[True, True] == pytest.approx(tpot[True, False], rel=0.01)    # 20 ms device > host per step


def test_a_step_ends_no_earlier_than_its_last_launch():
    """Piecewise launches of a mixed step (60 layers: tens of ms of CPU) overlap the device; they delay the step
    only when they outlast its device work (and the timeline counts them once)."""
    from m3lab.serving.timeline import Timeline

    h = ht.host_time(40, 8192, layers=60, num_new=1, full_graph=False)
    assert h.issue_us > 10_000 and h.ready_us < h.issue_us
    for device_us, end_us in ((200_000.0, h.ready_us + 200_000.0), (5_000.0, h.ready_us + h.issue_us)):
        tl = Timeline()
        start, end = tl.step(device_us, h.ready_us, h.issue_us)
        assert start == pytest.approx(h.ready_us * 1e-6) and end == pytest.approx(end_us * 1e-6)


def test_the_scheduler_timing_measures_vllm():
    from m3lab.vllm.scheduler_timing import measure
    rows = measure(running=(1, 16), steps=30, admissions=8)
    assert set(rows["what"]) == {"decode_step", "add_request", "admission_step"}
    d = rows[rows["what"] == "decode_step"].set_index("running")
    assert d.loc[16, "schedule_us"] > d.loc[1, "schedule_us"] > 0
    assert set(ht.fit(rows)) == {"schedule_step_us", "schedule_per_request_us", "update_step_us",
                                 "update_per_request_us", "add_request_us", "admission_us"}
