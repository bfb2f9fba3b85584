"""The sensitivity table is exact for throughput (a planted re-run agrees), and the measured basis of the AMD
carry factor holds (the MI300X check)."""
import dataclasses

import pytest

from m3lab.cost import assumptions, peers
from m3lab.cost.sensitivity import format_sensitivity, sensitivity
from m3lab.serving.estimate import estimate
from m3lab.spec.hardware import load_hardware
from m3lab.spec.serving import make_deployment

D = make_deployment("mxfp8-tp4-baseline", {"concurrency": 8, "num_prompts": 16, "isl": 2048, "osl": 64})


@pytest.fixture(scope="module")
def base():
    est = estimate(D)
    return est, sensitivity(est)


@pytest.mark.parametrize("name, end", [("mxfp8_moe_vs_bf16_fused_moe", "low"), ("custom_allreduce_us", "high"),
                                       ("amd_vs_h200_fraction", "high")])
def test_the_table_equals_a_rerun_with_the_assumption_moved(base, monkeypatch, name, end):
    est, table = base
    row = table.set_index("assumption").loc[name]
    a = assumptions.ASSUMPTIONS[name]
    moved = dict(assumptions.ASSUMPTIONS, **{name: dataclasses.replace(a, value=getattr(a, end))})
    monkeypatch.setattr(assumptions, "ASSUMPTIONS", moved)
    rerun = estimate(D).results["calibrated"]["output_tokens_per_s_per_gpu"]
    assert rerun == pytest.approx(row[f"tok_s_at_{end}"], rel=1e-9)
    assert row[f"change_{end}_pct"] != 0


def test_table_is_sorted_and_names_every_assumption(base):
    _, table = base
    assert set(table["assumption"]) == set(assumptions.ASSUMPTIONS)
    assert list(table["swing_pct"]) == sorted(table["swing_pct"], reverse=True)
    untouched = table[table["assumption"].str.startswith("generic_")]
    assert (untouched["swing_pct"] == 0).all()   # no M3 row is costed without its vLLM decision
    assert max(len(line) for line in format_sensitivity(table).splitlines()) <= 80


def test_the_amd_carry_factor_is_what_the_mi300x_profile_shows():
    check = peers.amd_check()
    assert len(check) >= 2 and (check["ratio"] < 1).all()
    assert assumptions.ASSUMPTIONS["amd_vs_h200_fraction"].value == pytest.approx(check["ratio"].mean(), abs=0.05)


def test_peer_efficiencies_are_measured_fractions():
    for family in peers.FAMILIES:
        t = peers.peer_table(family)
        assert len(t) >= 2 and ((t["eff"] > 0) & (t["eff"] <= 1)).all(), family
    # interpolation stays inside the measured range and reproduces a measured point
    t = peers.peer_table("sparse_decode")
    pt = t[(t["B"] == 32) & (t["ctx"] == 8192) & (t["q"] == 1)].iloc[0]
    assert peers.efficiency("sparse_decode", 32, 8192, 1)[0] == pytest.approx(pt["eff"])
    far = peers.efficiency("sparse_decode", 10_000, 10**7, 1)[0]   # clamped to the largest measured point
    corner = t[(t["q"] == 1) & (t["B"] == t["B"].max()) & (t["ctx"] == t["ctx"].max())]["eff"].iloc[0]
    assert far == pytest.approx(corner)


def test_the_moe_peer_is_bounded_by_the_experts_the_benchmark_touched():
    # the benchmark's balanced routing (m3lab.bench.moe.route_call) gives each token distinct experts, so a call
    # touches more experts than the OpTable's balanced routing expects: the peer's bound and regime follow the call
    import torch

    from m3lab.bench import moe as bm

    t = peers.peer_table("fused_moe")
    assert len(t) >= 4
    for _, row in t.iterrows():
        tokens = peers._fields(row["shape"])["T"]
        ids = bm.route_call(tokens, "balanced", torch.device("cpu"))[1]
        touched = len(torch.unique(ids))
        assert row["rpe"] == pytest.approx(ids.numel() / touched, rel=1e-4), row["shape"]
        hbm = load_hardware(peers.PEER_HARDWARE).hbm_bw
        assert row["bound_us"] * 1e-6 * hbm >= touched * bm.expert_bytes("bf16"), row["shape"]
