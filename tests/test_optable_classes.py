"""``class_columns``: the OpTable reduced to one layer per structure class is exactly ``build_optable``'s rows of each
class's first layer, and ``calls`` x rows gives back the whole table's totals."""
import numpy as np
import pytest

from m3lab.optable import COLUMNS, build_optable
from m3lab.optable.builder import class_columns
from m3lab.serving.dispatch import dispatch_for
from m3lab.spec.serving import make_deployment
from m3lab.workload import EngineStep

TOTALS = ("flops", "bytes_compute", "bytes_weight", "bytes_kv", "bytes_comm")


def _random_step(rng) -> EngineStep:
    n_dec = int(rng.integers(0, 40))
    n_pre = int(rng.integers(0 if n_dec else 1, 3))
    new = [int(rng.integers(1, 5))] * n_dec + [int(x) for x in rng.integers(1, 3000, n_pre)]
    ctx = [int(x) for x in rng.integers(1, 120_000, n_dec)] + [n + int(rng.integers(0, 60_000)) for n in new[n_dec:]]
    return EngineStep(np.asarray(new, np.int64), np.asarray(ctx, np.int64),
                      decode_mask=np.asarray([True] * n_dec + [False] * n_pre))


@pytest.mark.parametrize("deployment", [
    dict(),                                                               # MXFP8 TP4, vLLM's defaults
    dict(preset="mxfp8-tp4-optimised"),                                   # index sharing, fused shared expert
    dict(preset="mxfp4-tp2"),                                             # 2 KV heads per rank, fp8 index
])
def test_class_rows_are_the_first_layer_of_each_class(deployment):
    d = make_deployment(**deployment)
    disp = dispatch_for(d)
    rng = np.random.default_rng(7)
    for _ in range(4):
        step = _random_step(rng)
        full = build_optable(d.model, d.plan, d.quant, step, None, disp)
        cols = class_columns(d.model, d.plan, d.quant, step, None, disp)
        assert list(cols) == list(COLUMNS) + ["calls"]
        firsts = sorted(set(int(x) for x in cols["layer"] if x >= 0))
        keep = full["layer"].isin(firsts).to_numpy() | (full["layer"] < 0).to_numpy()
        for c in COLUMNS:
            want = full[c].to_numpy()[keep]
            got = cols[c]
            if want.dtype == object:
                assert list(got) == list(want), c
            else:
                np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=c)
        calls = cols["calls"]
        assert calls[cols["layer"] < 0].tolist() == [1.0] * int((cols["layer"] < 0).sum())
        for c in TOTALS:   # every layer of a class has the class's rows: calls x rows = the whole table
            assert np.nansum(cols[c] * calls) == pytest.approx(np.nansum(full[c].to_numpy(float)), rel=1e-12), c
        per_class = {int(x): calls[i] for i, x in enumerate(cols["layer"]) if x >= 0}
        assert sum(per_class.values()) == d.model.layers
