"""Serving estimates: the MISSION headline against the ceiling (issue 4, item 1), memory limits, spec decode,
P/D disaggregation."""
import random

import numpy as np

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
    # exact drafts: each verification emits 1 + accepted tokens (2.7 on average), so far fewer steps than 32
    verifies = sum(len(r.spec) for r in spec.runs["ceiling"].records)
    emitted = sum(n for r in spec.runs["ceiling"].records for n in r.emitted.values())
    assert emitted == 2 * 33 and 2 * 6 < verifies < 2 * 20
    assert (spec.steps["decodes"]).sum() < (base.steps["decodes"]).sum() == 2 * 32
    assert spec.config["accept_len_source"] == "assumed" and "chain" in spec.config["acceptance_model"]
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
    over = estimate(_dep("minimax-m3", "mi355x", tp=4, quant="bf16", isl=100_000, osl=1000,
                         concurrency=cap.max_concurrency + 2, num_requests=cap.max_concurrency + 2,
                         gpu_memory_utilization=0.9), calibration=None)
    assert any("KV cache" in n and "admission waits" in n for n in over.notes)   # queued, not refused
    with pytest.raises(M3LabError, match="one request"):      # within the model's context, beyond the KV cache
        estimate(_dep("minimax-m3", "mi355x", tp=4, quant="bf16", isl=1_000_000, osl=1000, concurrency=1,
                      gpu_memory_utilization=0.8))
    with pytest.raises(M3LabError, match="context of 1,048,576 tokens"):   # beyond the model's context
        estimate(_dep("minimax-m3", "mi355x", tp=4, quant="bf16", isl=5_000_000, osl=1000, concurrency=1))
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


# ---- acceptance: TTFT rises with concurrency because the scheduler says so ------------------------------------
def _preset_runs(name: str, concurrencies=(32, 64, 128), num_prompts: int = 300):
    """The records of each concurrency of preset ``name`` at 8K/1K, through the estimate's own path (its scheduler
    config and KV blocks), with a toy step time: 1 µs per token plus 20 µs per request row (no fitted term)."""
    from m3lab.serving.bench_load import bench_load
    from m3lab.serving.capacity import block_size_of
    from m3lab.serving.estimate import _kv_blocks
    from m3lab.spec.serving import load_preset
    from m3lab.workload.deployed import fake_outputs, fixed_contents, scheduler_config

    base = load_preset(name)
    if base.serving.spec_tokens:
        base = base.with_settings({"accept_len": 2.7, "accept_dataset": "MT-Bench"})
    runs = {}
    for c in concurrencies:
        d = base.with_settings({"isl": 8192, "osl": 1024, "concurrency": c, "num_prompts": num_prompts})
        cap = capacity(d.model, d.plan, d.quant, d.hardware, isl=8192, osl=1024)
        cfg = scheduler_config(d, block_size=block_size_of(d.model))
        cfg = cfg.replace(num_kv_blocks=_kv_blocks(cap, cfg, 8192, 1024))
        runs[c] = bench_load(cfg, fixed_contents(d), lambda s: s.num_tokens + 20.0 * s.num_reqs, max_concurrency=c,
                             outputs=fake_outputs(d))
    return runs


def _decodes_before_first_token(run) -> float:
    """Median, over requests sent after the start-up burst, of the decode rows in the steps that ran from its
    send until its first token reached the client (the work the engine did for others meanwhile)."""
    steps, req = run.steps, run.requests
    out_s, start_s = steps["output_s"].to_numpy(), steps["start_s"].to_numpy()
    dec = steps["decodes"].to_numpy()
    vals = []
    for send, first in zip(req["send_s"], req["first_token_s"]):
        if send > 0:
            vals.append(dec[(out_s > send) & (start_s < first)].sum())
    return float(np.median(vals))


@pytest.mark.parametrize("name", ["default", "mxfp8-tp4-baseline", "mxfp8-tp4-optimised", "mxfp4-tp2",
                                  "eagle3-mxfp8-tp4", "pd-mxfp8-prefill-tp4", "pd-mxfp8-decode-tp4"])
def test_ttft_rises_with_concurrency_because_the_scheduler_says_so(name):
    """Every step a new request waits through (the step in flight when it arrives, its prefill steps) carries the
    decodes of the others: more of them at higher concurrency. TTFT is the time of those steps (from send to the
    output of its first token), so it rises with any step cost that charges a request row."""
    runs = _preset_runs(name)
    work = [_decodes_before_first_token(runs[c]) for c in (32, 64, 128)]
    assert work[0] < work[1] < work[2], work
    ttft = [runs[c].summary()["ttft_s"] for c in (32, 64, 128)]
    assert ttft[0] < ttft[1] < ttft[2], ttft
    req = runs[128].requests
    assert np.allclose(req["ttft_s"], req["first_token_s"] - req["send_s"])    # nothing added to the steps' time


def test_the_h200_bf16_preset_cannot_serve_8k_1k():
    """The one preset left out above: its BF16 weights leave no KV on an H200 at TP4 (the estimate refuses)."""
    from m3lab.spec.serving import load_preset

    with pytest.raises(M3LabError, match="leave no room"):
        estimate(load_preset("h200-bf16-tp4"))


def test_stretch_step_keys_by_bisection_are_every_steps_keys():
    """The estimate keys a decode stretch's steps by bisection (the key only steps up along it): the same device
    times, step by step, as keying every step."""
    from m3lab.serving.bench_load import engine_steps, simulate_records
    from m3lab.serving.estimate import _device_us
    from m3lab.serving.step_cost import StepCoster
    from m3lab.workload.deployed import fixed_contents, scheduler_config

    d = _dep("minimax-m3", "mi355x", tp=4, quant="mxfp8", isl=3000, osl=700, concurrency=6, num_requests=14)
    contents = fixed_contents(d)
    records = simulate_records(scheduler_config(d), contents, 6)
    assert any(a.stretch is not None and b.stretch is not None for a, b in zip(records, records[1:]))
    coster = StepCoster(d)
    fast = _device_us(coster, records, contents.prompt, ("ceiling",))[0]["ceiling"]
    every = [coster.time_us(s, "ceiling") if s is not None else 0.0 for s in engine_steps(records, contents.prompt)]
    assert np.array_equal(fast, np.array(every))


def test_retimed_with_the_same_step_times_is_the_estimate():
    """ServingEstimate.retimed (for re-timing under another cost, e.g. the sensitivity table) reproduces the run."""
    est = estimate(_dep("minimax-m3", "mi355x", tp=4, quant="mxfp8", isl=2048, osl=40, concurrency=4,
                        num_requests=12))
    memo = est.coster._memo
    same = est.retimed(lambda key: memo[key]["calibrated"][0])
    assert same.raw == est.runs["calibrated"].raw
    slower = est.retimed(lambda key: 2 * memo[key]["calibrated"][0]).summary()
    assert slower["output_tokens_per_s_per_gpu"] < est.results["calibrated"]["output_tokens_per_s_per_gpu"]


def test_output_rate_is_the_retimed_runs_figure():
    """The sensitivity table's fast re-timing gives exactly the figure a whole re-timed run reports."""
    est = estimate(_dep("minimax-m3", "mi355x", tp=4, quant="mxfp8", isl=2048, osl=40, concurrency=4,
                        num_requests=12))
    memo = est.coster._memo
    for scale in (1.0, 0.5, 3.0):
        def key_us(key, scale=scale):
            return scale * memo[key]["calibrated"][0]
        whole = est.retimed(key_us).summary()["output_tokens_per_s_per_gpu"]
        assert est.retimed_rate(key_us) == whole
    assert est.retimed_rate(lambda key: memo[key]["calibrated"][0]) == \
        est.results["calibrated"]["output_tokens_per_s_per_gpu"]
