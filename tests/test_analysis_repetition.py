"""Repetition estimate: per-op totals over layers and steps, shares and ranks."""
import random

import pytest

from m3lab.analysis.repetition import by_kind, repetition, small_ops
from m3lab.cost.model import cost_optable
from m3lab.errors import M3LabError
from m3lab.optable import build_optable
from m3lab.spec.hardware import load_hardware
from m3lab.spec.plan import ParallelPlan
from m3lab.workload.step import EngineStep


def test_one_step_repetition():
    batch = random.randint(1, 64)
    ot = build_optable("minimax-m3", ParallelPlan(tp=4), "mxfp8", EngineStep.decode(batch, random.randint(100, 9000)))
    costed = cost_optable(ot, load_hardware("mi355x"), "default")
    rep = repetition(costed, output_tokens=batch, active_requests=batch)
    assert rep["share"].sum() == pytest.approx(1.0)
    assert rep["us_per_step"].sum() == pytest.approx(costed["t_us"].sum())
    assert list(rep["rank"]) == list(range(1, len(rep) + 1))
    row = rep.set_index("op").loc["router"]
    assert row["calls_per_step"] == 57 and row["us_per_call"] * 57 == pytest.approx(row["us_per_step"])
    moe = rep.set_index("op").loc["moe_gate_up"]
    assert moe["ms_per_1k_output_tokens"] == pytest.approx(moe["us_per_step"] / batch)  # µs/token = ms/1k tokens
    assert by_kind(rep)["share"].sum() == pytest.approx(1.0)
    assert set(small_ops(rep)["op"]) <= set(rep["op"])
    with pytest.raises(M3LabError, match="output_tokens"):
        repetition(costed, output_tokens=0, active_requests=1)


def test_run_repetition_from_an_estimate():
    from m3lab.serving.estimate import estimate
    from m3lab.spec.serving import make_deployment

    est = estimate(make_deployment(None, model="minimax-m3", hardware="mi355x", tp=4, quant="mxfp8", isl=1024, osl=17,
                                   concurrency=2, num_prompts=2))
    totals = est.op_totals()
    steps = est.steps["repeat"].sum()
    rep = repetition(totals, output_tokens=2 * 17, active_requests=2, steps=steps)
    assert rep["us_per_step"].sum() * steps / 1e6 == pytest.approx(est.results["calibrated"]["device_s"], rel=1e-6)
