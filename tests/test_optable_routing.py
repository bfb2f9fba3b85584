"""Routing models: expected loads, active experts, Zipf skew, recorded statistics."""
import numpy as np
import pytest

from m3lab.errors import M3LabError
from m3lab.optable.routing import balanced, make_routing, recorded, zipf


def test_balanced():
    r = balanced(128, 4)
    assert r.q.sum() == pytest.approx(4)
    assert r.counts([128])[0] == pytest.approx(np.full(128, 4.0))
    assert r.active_experts([1])[0] == pytest.approx(4.0)
    assert r.active_experts([100000])[0] == pytest.approx(128.0)
    assert r.routed_tokens([10], ep=8)[0] == pytest.approx(10 * 4 / 8)


def test_zipf_skew_and_cap():
    r = zipf(128, 4, 1.2)
    assert r.q.sum() == pytest.approx(4) and r.q.max() <= 1.0 and r.q[0] >= r.q[-1]
    assert r.max_load([1000])[0] > balanced(128, 4).max_load([1000])[0]
    assert make_routing(0.0, 128, 4).q == pytest.approx(balanced(128, 4).q)
    assert make_routing("zipf:1.2", 128, 4).q == pytest.approx(r.q)


def test_recorded():
    counts = np.random.default_rng().integers(1, 100, size=(3, 16))
    r = recorded(counts, 2)
    assert r.q.sum() == pytest.approx(2) and r.experts == 16
    with pytest.raises(M3LabError, match="counts"):
        recorded([-1, 2], 1)
    with pytest.raises(M3LabError, match="routing"):
        make_routing("uniformish", 16, 2)
