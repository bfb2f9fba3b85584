"""Per-op overrides of the calibrated cost (m3lab.cost.overrides): an override re-costs only the rows of its
(vLLM op, path), a scale of 0 is the cost itself, moving its scale afterwards is exact, and every cache of costs
keys on it. A planted override that reaches past its op is caught."""
import numpy as np
import pytest

from m3lab.cost import overrides as ovm
from m3lab.cost.model import cost_optable, resolve_calibration
from m3lab.cost.overrides import OpOverride, overrides_key, rescaled_efficiency
from m3lab.optable import build_optable
from m3lab.optable.dispatch import OP_DECISION
from m3lab.serving.breakdown import decode_step
from m3lab.serving.dispatch import dispatch_for
from m3lab.serving.estimate import estimate
from m3lab.serving.step_cost import StepCoster
from m3lab.spec.serving import make_deployment

D = make_deployment("mxfp8-tp4-baseline", {"isl": 2048, "osl": 64, "concurrency": 8, "num_prompts": 16})


def _twice(rows):
    return np.full(len(rows.idx), 2.0)


TWICE = OpOverride("twice", ("experts",), "triton_mxfp8", _twice, kinds=("grouped_gemm",), label="test: 2x")


@pytest.fixture(scope="module")
def table():
    step = decode_step(D, 8, 2048 + 32)
    return build_optable(D.model, D.plan, D.quant, step, None, dispatch_for(D))


def _cost(table, ovs=()):
    return cost_optable(table, D.hardware, resolve_calibration(D.hardware, "default"), tuple(ovs))


def _moved(base, new) -> set:
    """vLLM ops of the rows whose time changed."""
    diff = ~np.isclose(base["t_us"].to_numpy(float), new["t_us"].to_numpy(float), rtol=1e-12, atol=0.0)
    return {OP_DECISION.get(o, o) for o in base.loc[diff, "op"]}


def test_an_override_recosts_only_the_rows_of_its_op(table):
    base, new = _cost(table), _cost(table, [TWICE])
    assert _moved(base, new) == {"experts"}
    hit = new["override"] == "twice"
    assert hit.any() and set(new.loc[hit, "kind"]) == {"grouped_gemm"}
    assert new.loc[hit, "t_us"].to_numpy() == pytest.approx(2 * base.loc[hit, "t_us"].to_numpy())   # no floor
    assert all("test: 2x" in s for s in new.loc[hit, "source"])
    # an override on a path this deployment does not run touches nothing
    assert _moved(base, _cost(table, [OpOverride("aiter", ("experts",), "aiter_", _twice)])) == set()


def test_a_planted_override_that_reaches_past_its_op_is_caught(table, monkeypatch):
    base = _cost(table)
    monkeypatch.setattr(ovm, "_vllm_op", lambda cols, n: np.full(n, "experts", dtype=object))   # every row "experts"
    wide = OpOverride("wide", ("experts",), "", _twice)
    assert _moved(base, _cost(table, [wide])) - {"experts"}


def test_scale_zero_is_the_cost_and_a_moved_scale_is_exact(table):
    base = _cost(table)
    zero = _cost(table, [OpOverride("twice", TWICE.ops, TWICE.path, _twice, kinds=TWICE.kinds, scale=0.0)])
    assert np.array_equal(base["t_us"].to_numpy(), zero["t_us"].to_numpy())
    half = _cost(table, [OpOverride("twice", TWICE.ops, TWICE.path, _twice, kinds=TWICE.kinds, scale=0.5)])
    rows = {c: _cost(table, [TWICE])[c].to_numpy() for c in ("efficiency", "override", "override_ratio")}
    assert rescaled_efficiency(rows, "twice", 1.0, 0.5) == pytest.approx(half["efficiency"].to_numpy())


def test_a_replacement_costs_the_rows_by_another_paths_source(table):
    swap = OpOverride("swap", ("attention",), "triton_sparse", path_as="aiter_sparse_pa", kinds=("attention",))
    new = _cost(table, [swap])
    hit = new["override"] == "swap"
    assert hit.any() and not any("sparse_attention" == s for s in new.loc[hit, "source"])
    assert _moved(_cost(table), new) <= {"attention"}


def test_every_cache_of_costs_keys_on_the_overrides():
    plain, over = StepCoster(D, resolve_calibration(D.hardware, "default")), \
        StepCoster(D, resolve_calibration(D.hardware, "default"), op_overrides=(TWICE,))
    assert plain.cost_key != over.cost_key and overrides_key(()) == ""
    assert overrides_key([TWICE]) != overrides_key([OpOverride(**{**TWICE.__dict__, "scale": 0.5})])
    a, b = estimate(D), estimate(D, op_overrides=(TWICE,))
    fig = "output_tokens_per_s_per_gpu"
    assert b.results["calibrated"][fig] < a.results["calibrated"][fig]
    assert b.results["ceiling"][fig] == a.results["ceiling"][fig]          # the ceiling is the rows' roofline
    assert "test: 2x" in b.results["calibrated"]["label"] and b.config["op_overrides"] == ["twice"]
    assert estimate(D).results["calibrated"][fig] == a.results["calibrated"][fig]   # no override leaks into a cache
