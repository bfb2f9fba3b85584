"""Roofline cost per op over OpTable rows: ceiling terms, calibrated efficiency, floors, kernel-time."""
import random

import numpy as np
import pytest

from m3lab.cost.kernel_time import kernel_time
from m3lab.cost.model import cost_optable
from m3lab.optable import build_optable
from m3lab.spec.hardware import load_hardware
from m3lab.spec.plan import ParallelPlan
from m3lab.workload.step import EngineStep


@pytest.fixture(scope="module")
def mi355x():
    return load_hardware("mi355x")


def _step():
    return EngineStep.mixed(random.randint(1, 64), random.randint(200, 9000), random.randint(1, 4000))


def test_ceiling_is_the_roofline(mi355x):
    ot = build_optable("minimax-m3", ParallelPlan(tp=4), "mxfp8", _step())
    c = cost_optable(ot, mi355x, None)
    mem = ot[["bytes_compute", "bytes_weight", "bytes_kv"]].fillna(0).sum(axis=1)
    assert set(c["peak_dtype"]) == {"mxfp8", "bf16", "fp32"}  # the fp32 router at the fp32 matrix rate
    assert set(c.loc[c["peak_dtype"] == "fp32", "op"]) == {"router", "topk"}  # fp32 GEMM; fp32 scores
    peak = np.select([c["peak_dtype"] == "mxfp8", c["peak_dtype"] == "fp32"], [5.0e15, 1.573e14], 2.5e15)  # datasheet
    expect = np.maximum.reduce([ot["flops"].fillna(0) / peak, mem / 8.0e12, ot["bytes_comm"].fillna(0) / 537.6e9]) * 1e6
    assert np.allclose(c["t_us"], expect)
    assert (c["efficiency"] == 1).all() and (c["floor_us"] == 0).all()
    assert c["cost_label"].iloc[0].startswith("ceiling: uncalibrated bound")
    assert set(c.loc[c["kind"] == "allreduce", "bound"]) == {"comm"}


def test_fp32_peak_is_explicit(mi355x):
    import dataclasses

    from m3lab.cost.roofline import peak_flops
    from m3lab.errors import M3LabError

    assert mi355x.peak("fp32") == peak_flops(mi355x, "fp32") == 1.573e14 < mi355x.peak("bf16")
    bare = dataclasses.replace(mi355x, peak_flops={k: v for k, v in mi355x.peak_flops.items() if k != "fp32"})
    with pytest.raises(M3LabError, match="peak_flops.fp32"):
        peak_flops(bare, "fp32")
    with pytest.raises(M3LabError, match="fp32"):
        bare.peak("fp32")


def test_calibrated_is_slower_and_labelled(mi355x):
    ot = build_optable("minimax-m3", ParallelPlan(tp=4), "mxfp8", _step())
    ceil, cal = cost_optable(ot, mi355x, None), cost_optable(ot, mi355x, "default")
    assert (cal["t_us"] >= ceil["t_us"] - 1e-9).all()
    assert "aiter-mi355x" in cal["cost_label"].iloc[0]
    gemm = cal[cal["kind"] == "gemm"]
    assert (gemm["efficiency"] < 1).all() and (gemm["t_us"] >= gemm["floor_us"]).all()
    fused = cal[cal["op"].isin(["post_attn_norm", "rope", "moe_act"])]
    assert (fused["floor_us"] == 0).all()


def test_kernel_time_matches_measured_gemm(mi355x, shared_dir):
    """A GEMM from the AITER table: the calibrated prediction is within 20% of the measured µs."""
    import pandas as pd

    table = pd.read_csv(shared_dir / "data" / "aiter" / "a8w8_bpreshuffle_tuned_gemm_minimax_m3.csv")
    row = table.sample(1).iloc[0]
    res = kernel_time("mi355x", "gemm", m=int(row.M), n=int(row.N), k=int(row.K), quant="fp8")
    assert res["us"] == pytest.approx(row.us, rel=0.2)
    assert res["ceiling_us"] < row.us


def test_every_kind_has_a_cost_source_with_named_assumptions():
    from m3lab.cost.assumptions import ASSUMPTIONS
    from m3lab.cost.paths import KIND_COST
    from m3lab.cost.sources import SOURCES

    kinds = set()
    for model, quant in (("minimax-m3", "mxfp8"), ("qwen3.5-397b-a17b", "fp8"), ("glm-5.2", "mxfp4")):
        kinds |= set(build_optable(model, ParallelPlan(tp=4), quant, _step())["kind"])
    assert {"quant", "moe_align", "moe_sum", "linear_attention", "conv"} <= kinds
    assert kinds <= set(KIND_COST) and set(KIND_COST.values()) <= set(SOURCES)
    ot = build_optable("glm-5.2", ParallelPlan(tp=4), "mxfp4", _step())
    c = cost_optable(ot, load_hardware("mi355x"), "default")
    named = {t for terms in c["eff_terms"] for t in terms.split("+") if t} | set(c["floor_term"]) - {""}
    assert named and named <= set(ASSUMPTIONS)
