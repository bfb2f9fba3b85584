"""Serving estimates: the MISSION headline against the ceiling (issue 4, item 1), memory limits, spec decode,
P/D disaggregation."""
import random

import pytest

from m3lab.errors import M3LabError
from m3lab.published import HEADLINE_MXFP8_TP4_C32 as HEADLINE
from m3lab.serving.capacity import capacity
from m3lab.serving.estimate import compare_with_measured, estimate
from m3lab.spec.hardware import load_hardware
from m3lab.spec.model import load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.serving import make_deployment

def _dep(model, hardware, num_requests=None, **kw):
    return make_deployment(None, model=model, hardware=hardware, num_prompts=num_requests, **kw)


MEASURED = {"output_tokens_per_s_per_gpu": 342.4, "ttft_s": 0.67, "tpot_ms": 22.1}


@pytest.mark.slow
def test_headline_ceiling_bounds_the_measurement():
    """MXFP8, TP4, 8K/1K, concurrency 32 on MI355X: ceiling >= 342.4 tok/s/GPU, efficiency in [0.2, 0.9]."""
    h = HEADLINE
    est = estimate(_dep(h["model"], h["hardware"], tp=h["tp"], quant=h["quant"], isl=h["isl"], osl=h["osl"],
                        concurrency=h["concurrency"]))
    table = compare_with_measured(est, MEASURED)
    print("\n" + table.to_string(index=False))
    ceiling = est.results["ceiling"]["output_tokens_per_s_per_gpu"]
    assert ceiling >= 342.4
    assert 0.2 <= 342.4 / ceiling <= 0.9
    assert est.kind == "calibrated" and "aiter-mi355x" in est.summary()["label"]
    cal = est.results["calibrated"]
    assert cal["output_tokens_per_s_per_gpu"] < ceiling and cal["tpot_ms"] > est.results["ceiling"]["tpot_ms"]


def test_small_run_consistency():
    isl, osl, conc = random.choice([512, 1024, 3000]), random.randint(8, 40), random.randint(1, 6)
    est = estimate(_dep("minimax-m3", "mi355x", tp=4, quant="mxfp8", isl=isl, osl=osl, concurrency=conc,
                        num_requests=2 * conc))
    s = est.summary()
    assert s["kind"] == "calibrated" and set(s["ceiling"]) >= {"output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms"}
    for res in est.results.values():
        span = res["makespan_s"]
        assert res["output_tokens_per_s_per_gpu"] == pytest.approx(2 * conc * osl / span / 4)
        assert res["ttft_s"] > 0 and res["tpot_ms"] > 0
    req = est.requests
    assert req["finish_s"].notna().all() and (req["finish_s"] >= req["first_token_s"]).all()
    # the step timeline covers every output token of every request
    assert (est.steps["repeat"] * est.steps["decodes"]).sum() == 2 * conc * (osl - 1)
    # an uncalibrated hardware reports the ceiling
    h200 = estimate(_dep("minimax-m3", "h200", tp=8, quant="fp8", isl=isl, osl=osl, concurrency=conc, num_requests=conc))
    assert h200.kind == "ceiling" and "uncalibrated bound" in h200.summary()["label"]


def test_speculative_decoding_and_its_checks():
    kw = dict(tp=4, quant="mxfp8", isl=1024, osl=33, concurrency=2, num_requests=2)
    base = estimate(_dep("minimax-m3", "mi355x", **kw), calibration=None)
    spec = estimate(_dep("minimax-m3", "mi355x", spec_tokens=3, accept_len=2.7, **kw), calibration=None)
    # a request needs ceil(32 / 2.7) = 12 verification steps instead of 32, each wider (K + 1 = 4 tokens)
    assert (spec.steps["repeat"] * spec.steps["decodes"]).sum() == 2 * 12
    assert (base.steps["repeat"] * base.steps["decodes"]).sum() == 2 * 32
    per_step = lambda e: e.results["ceiling"]["tpot_ms"] * 32 / ((e.steps["repeat"] * (e.steps["decodes"] > 0)).sum())  # noqa: E731
    assert per_step(spec) > per_step(base)  # more experts touched and a draft to run
    assert "draft_model" in set(spec.op_totals("ceiling")["op"])
    with pytest.raises(M3LabError, match="accept_len"):
        estimate(_dep("minimax-m3", "mi355x", spec_tokens=3, accept_len=5, **kw))
    with pytest.raises(M3LabError, match="spec_tokens"):
        estimate(_dep("minimax-m3", "mi355x", accept_len=2.0, **kw))


def test_kv_capacity_and_bad_inputs():
    m, hw = load_model("minimax-m3"), load_hardware("mi355x")
    cap = capacity(m, ParallelPlan(tp=4), "bf16", hw, isl=100_000, osl=1000)
    assert cap.kv_capacity_tokens % 128 == 0 and cap.max_concurrency >= 1
    assert cap.weight_bytes_per_gpu > 200e9  # bf16 M3 at TP4: ~213 GB per GPU
    with pytest.raises(M3LabError, match="largest that fits"):
        estimate(_dep("minimax-m3", "mi355x", tp=4, quant="bf16", isl=100_000, osl=1000,
                      concurrency=cap.max_concurrency + 1, gpu_memory_utilization=0.9))
    with pytest.raises(M3LabError, match="unknown hardware"):
        estimate(_dep("minimax-m3", "mi999", tp=4, isl=10, osl=10, concurrency=1))
    with pytest.raises(M3LabError, match="leave no room"):
        capacity(m, ParallelPlan(tp=1), "bf16", hw, isl=10, osl=10)


def test_disaggregation_table():
    from m3lab.serving.disagg import disaggregated

    df = disaggregated(_dep("minimax-m3", "mi355x", tp=4, quant="mxfp8", isl=2048, osl=64, concurrency=8),
                       ratios=((1, 1), (1, 3)), calibration=None)
    assert list(df["ratio"]) == ["1:1", "1:3"]
    assert (df["kv_handoff_ms"] > 0).all() and (df["ttft_s"] > df["kv_handoff_ms"] / 1e3).all()
    assert df["decode_req_per_s"].iloc[1] == pytest.approx(3 * df["decode_req_per_s"].iloc[0])
    rate = df[["prefill_req_per_s", "decode_req_per_s"]].min(axis=1)
    gpus = (df["prefill"] + df["decode"]) * 4
    assert df["output_tokens_per_s_per_gpu"].to_list() == pytest.approx((rate * 64 / gpus).to_list())
