"""The decode-step breakdown (m3lab.serving.breakdown): shares, bytes against the OpTable, the CLI's JSON."""
import json

import numpy as np
import pytest

from m3lab.optable import build_optable
from m3lab.optable.dispatch import OP_DECISION
from m3lab.serving.breakdown import decode_step, decode_step_breakdown, format_breakdown
from m3lab.serving.dispatch import dispatch_for
from m3lab.spec.serving import load_preset


@pytest.fixture(scope="module", params=["mxfp8-tp4-baseline", "mxfp8-tp4-optimised"])
def case(request):
    d = load_preset(request.param)
    return d, decode_step_breakdown(d, batch=24, context=9000)


def test_shares_sum_to_one_and_every_row_has_a_kernel_path(case):
    _, t = case
    assert t["share"].sum() == pytest.approx(1.0)
    assert (t["us"] >= 0).all() and (t["share"] >= 0).all()
    resolved = t[t["path"] != ""]
    assert resolved["kernel"].str.len().gt(0).all()


def test_per_op_bytes_equal_the_optables_for_that_step(case):
    d, t = case
    ot = build_optable(d.model, d.plan, d.quant, decode_step(d, 24, 9000), None, dispatch_for(d))
    ot = ot.assign(group=[OP_DECISION.get(o, o) if isinstance(p, str) else o for o, p in zip(ot["op"], ot["path"])],
                   path=ot["path"].fillna(""))
    mem = ot[["bytes_compute", "bytes_weight", "bytes_kv"]].fillna(0).sum(axis=1)
    want = mem.groupby([ot["group"], ot["path"]]).sum()
    got = t.set_index(["op", "path"])["bytes"]
    assert set(got.index) == set(want.index)
    for key, v in want.items():
        assert got[key] == pytest.approx(v, rel=1e-12)
    assert t["flops"].sum() == pytest.approx(ot["flops"].fillna(0).sum())


def test_the_terminal_table_fits_80_columns(case):
    _, t = case
    text = format_breakdown(t, "a title that is long enough to be cut at eighty columns " * 3)
    assert max(len(line) for line in text.splitlines()) <= 80


def test_cli_breakdown_adds_decode_step_ops(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from m3lab.cli.main import app
    res = CliRunner().invoke(app, ["estimate", "--preset", "mxfp8-tp4-optimised", "--concurrency", "8",
                                   "--num-prompts", "40", "--osl", "64", "--breakdown", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    ops = out["decode_step_ops"]
    assert {"op", "kernel", "calls", "bytes", "flops", "us", "share"} <= set(ops[0])
    assert sum(o["share"] for o in ops) == pytest.approx(1.0)
    assert out["decode_step_point"]["batch"] >= 1 and np.isfinite(out["output_tokens_per_s_per_gpu"])


def test_breakdown_with_pd_is_refused_in_one_line():
    from typer.testing import CliRunner

    from m3lab.cli.main import app
    res = CliRunner().invoke(app, ["estimate", "--preset", "mxfp8-tp4-optimised", "--pd", "1:1", "--breakdown"])
    assert res.exit_code == 2 and "--breakdown" in res.output and "Traceback" not in res.output
