"""``m3lab pd-plan`` and ``m3lab estimate --pd P:D``: JSON output, figures, bad input (one line, exit 2)."""
import json

import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app
from m3lab.serving.disagg import pd_estimate
from m3lab.spec.memory import kv_bytes_per_token
from m3lab.spec.model import load_model
from m3lab.spec.plan import ParallelPlan

runner = CliRunner()


def test_pd_plan_json():
    res = runner.invoke(app, ["pd-plan", "--model", "minimax-m3", "--prefill-tp", "4", "--decode-tp", "8",
                              "--isl", "8192", "--kv-dtype", "fp8", "--kv-link-gbps", "50", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    per_rank = kv_bytes_per_token(load_model("minimax-m3"), "fp8", "bf16", ParallelPlan(tp=8))
    assert out["bytes_per_request"] == 8192 * 8 * per_rank
    assert out["transfer_s"] == out["max_bytes_sent_per_prefill_rank"] / 50e9
    assert len(out["layers"]) == 60 + 57


def test_pd_plan_bad_input_is_one_line_exit_2():
    res = runner.invoke(app, ["pd-plan", "--model", "minimax-m3", "--prefill-tp", "4", "--decode-tp", "4",
                              "--isl", "8192", "--decode-layout", "nhd"])
    assert res.exit_code == 2 and "layout" in res.output and "Traceback" not in res.output


def test_estimate_pd_prints_the_four_figures():
    res = runner.invoke(app, ["estimate", "--model", "minimax-m3", "--hardware", "mi355x", "--tp", "4",
                              "--quant", "mxfp8", "--isl", "2048", "--osl", "32", "--concurrency", "8",
                              "--num-requests", "16", "--pd", "2:1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for key in ("total_tokens_per_s_per_gpu", "output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms"):
        assert out[key] > 0 and out["ceiling"][key] > 0
    assert out["gpus"] == 12 and out["pd"] == "2:1"
    assert out["total_tokens_per_s_per_gpu"] == pytest.approx(out["output_tokens_per_s_per_gpu"] * (2048 + 32) / 32)
    bad = runner.invoke(app, ["estimate", "--model", "minimax-m3", "--hardware", "mi355x", "--tp", "4",
                              "--isl", "2048", "--osl", "32", "--concurrency", "8", "--pd", "2-1"])
    assert bad.exit_code == 2 and "pd" in bad.output


def test_pd_ttft_includes_the_handoff_and_tpot_is_a_decode_step():
    from m3lab.spec.serving import make_deployment

    kw = dict(model="minimax-m3", hardware="mi355x", tp=4, quant="mxfp8", isl=4096, osl=16, concurrency=1,
              num_prompts=2, pd="1:1")
    slow = pd_estimate(make_deployment(None, kv_link_gbps=1, **kw), calibration=None)
    fast = pd_estimate(make_deployment(None, kv_link_gbps=1000, **kw), calibration=None)
    assert slow["ttft_s"] - fast["ttft_s"] == pytest.approx(
        (slow["kv_handoff_ms"] - fast["kv_handoff_ms"]) / 1e3, rel=1e-6)
    assert slow["tpot_ms"] == pytest.approx(fast["tpot_ms"], rel=1e-9)
    assert fast["ttft_s"] > fast["prefill_s"] > 0
