"""Agentic serving (m3lab.serving.cached): sessions on one engine of the step generator on a clock, prefix hits,
KV capacity, preemption, speculative decoding, long contexts in the step cost, the CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from m3lab.cache.agentic import generate
from m3lab.serving.cached import CoarseStepTime, acceptance_sensitivity, cached_serving
from m3lab.cache.trace import fixed_length
from m3lab.cli.main import app
from m3lab.errors import M3LabError
from m3lab.spec.serving import make_deployment

# MXFP4 experts with AITER on: AITER's MXFP4 MoE (with it off vLLM emulates them: tests/test_experts_emulation.py)
DEP = make_deployment(None, model="minimax-m3", hardware="mi355x", tp=4, quant="mxfp4", aiter=1, concurrency=3,
                      workload="agentx")


def test_prefix_hits_shorten_prefills_and_every_turn_finishes():
    tr = generate(sessions=6, seed=4, turns_median=5, block_size=128)
    run = cached_serving(DEP, trace=tr, calibration=None)
    s, req = run.summary(), run.requests
    assert req["finish_s"].notna().all() and s["preemptions"] == 0
    assert req["hit_tokens"].sum() > 0.5 * tr.prompt.sum() and 0.5 < s["prefix_cache_hit_rate"] < 1
    assert (req["hit_tokens"] % 128 == 0).all() and (req["hit_tokens"] < req["prompt_tokens"]).all()


def test_turns_wait_for_their_predecessor_and_think():
    tr = generate(sessions=3, seed=1, turns_median=4)
    req = cached_serving(DEP, trace=tr, calibration=None).requests
    waits = np.flatnonzero(tr.after >= 0)
    arrived, finish = req["arrival_s"].to_numpy(), req["finish_s"].to_numpy()
    assert np.allclose(arrived[waits], finish[tr.after[waits]] + tr.think_s[waits])
    assert (req["ttft_s"] > 0).all()


def test_at_most_concurrency_sessions_are_active():
    tr = generate(sessions=7, seed=3, turns_median=3)
    req = cached_serving(DEP, trace=tr, calibration=None).requests
    span = req.groupby("session").agg(start=("arrival_s", "min"), end=("finish_s", "max"))
    for t in np.unique(span["start"]):
        assert ((span["start"] <= t) & (span["end"] > t + 1e-9)).sum() <= DEP.workload.concurrency


def test_small_capacity_preempts_and_still_finishes():
    tr = fixed_length(10, 1000, 700)
    run = cached_serving(DEP.with_settings({"concurrency": 10}), trace=tr, calibration=None,
                         capacity_tokens=4 * 1792)
    assert run.summary()["preemptions"] > 0 and run.requests["finish_s"].notna().all()
    assert run.cache_stats["preempted_requests"] > 0 and run.cache_stats["preempted_hits"] > 0   # own blocks


def test_speculative_decoding_runs_exact_drafts_and_names_its_acceptance():
    tr = generate(sessions=4, seed=2, turns_median=4)
    dep = DEP.with_settings({"concurrency": 4})
    plain = cached_serving(dep, trace=tr).summary()
    spec = dep.with_settings({"spec_tokens": 3})                 # EAGLE3, no acceptance given
    s = cached_serving(spec, trace=tr).summary()
    for key in ("ttft_p50_s", "tpot_p50_ms", "prefix_cache_hit_rate", "kv_cache_usage", "output_tokens_per_s_per_gpu"):
        assert s[key] is not None and np.isfinite(s[key]) and s[key] >= 0, key
    assert s["ttft_p50_s"] <= s["ttft_p90_s"] <= s["ttft_p99_s"] and s["tpot_p50_ms"] <= s["tpot_p90_ms"]
    assert s["accept_len"] == 2.0 and s["accept_len_source"].startswith("assumed")
    assert s["tpot_p50_ms"] < plain["tpot_p50_ms"]              # fewer verification steps per token
    higher = cached_serving(spec, trace=tr, accept_len=3.0).summary()
    assert higher["tpot_p50_ms"] < s["tpot_p50_ms"] and higher["accept_len_source"].startswith("what-if")
    rows = acceptance_sensitivity(s, [3.0])                      # first order, against the exact what-if
    assert rows[0]["tpot_p50_ms"] == pytest.approx(higher["tpot_p50_ms"], rel=0.3)
    with pytest.raises(M3LabError, match="agentic"):   # a chat benchmark's acceptance is not agentic traffic's
        spec.with_settings({"accept_len": 2.7, "accept_dataset": "MT-Bench"})
    small = cached_serving(spec, trace=tr, capacity_tokens=int((tr.prompt + tr.output).max()) + 1024).summary()
    assert small["prefix_cache_hit_rate"] < s["prefix_cache_hit_rate"]


def test_doubling_every_context_raises_decode_step_time_on_indexer_layers():
    """The agentic estimate's step cost reads each request's index keys: twice the context, more indexer time."""
    from m3lab.serving.step_cost import StepCoster
    from m3lab.workload.step import EngineStep

    dep = DEP.with_settings({"spec_tokens": 3})
    times = {}
    for ctx in (70_000, 140_000):
        coster = StepCoster(dep, None)
        step = EngineStep(np.ones(16, np.int64), np.full(16, ctx), decode_mask=np.ones(16, bool))
        total = CoarseStepTime(coster, "ceiling")(step)
        ops = coster.op_totals("ceiling").set_index("op")
        times[ctx] = (total, ops.loc["indexer", "t_us"], ops.loc["indexer", "bytes_kv"])
    assert times[140_000][1] > 1.5 * times[70_000][1] and times[140_000][2] > 1.8 * times[70_000][2]
    assert times[140_000][0] > times[70_000][0]


def test_cache_sim_cli(tmp_path):
    rows = [{"timestamp": i, "input_length": 1500, "output_length": 10, "hash_ids": [1, 2, 3]} for i in range(5)]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = CliRunner().invoke(app, ["cache-sim", "--trace", str(path), "--json"])
    assert out.exit_code == 0, out.output
    s = json.loads(out.output)
    assert s["requests"] == 5 and s["peak_kv_usage"] is None and s["evicted_blocks"] == 0
    assert s["hit_rate_tokens"] == pytest.approx(4 * 11 * 128 / (5 * 1500))
    assert {"hit_rate_blocks", "evicted_blocks"} <= set(s)
    fin = json.loads(CliRunner().invoke(app, ["cache-sim", "--trace", str(path), "--capacity-tokens", "4000",
                                              "--json"]).output)
    assert fin["peak_kv_usage"] > 0
    path.write_text(path.read_text() + '{"timestamp": 1}\n')
    bad = CliRunner().invoke(app, ["cache-sim", "--trace", str(path)])
    assert bad.exit_code == 2 and "m.jsonl:6:" in bad.output
    skip = CliRunner().invoke(app, ["cache-sim", "--trace", str(path), "--skip-invalid"])
    assert skip.exit_code == 0 and "skipped 1 malformed line" in skip.output
    assert CliRunner().invoke(app, ["cache-sim", "--trace", str(path), "--engine", "vllm"]).exit_code == 2


def test_estimate_cli_agentx_workload():
    out = CliRunner().invoke(app, ["estimate", "--model", "minimax-m3", "--hardware", "mi355x", "--tp", "4", "--quant",
                                   "mxfp4", "--set", "aiter=1", "--spec-tokens", "3", "--workload", "agentx",
                                   "--concurrency", "2", "--json"])
    assert out.exit_code == 0, out.output
    s = json.loads(out.output)
    for key in ("ttft_p50_s", "tpot_p50_ms", "prefix_cache_hit_rate", "kv_cache_usage", "output_tokens_per_s_per_gpu"):
        assert isinstance(s[key], float) and s[key] >= 0, key
    assert s["sessions"] == 2 and s["tp"] == 4 and s["quant"] == "mxfp4" and s["spec_method"] == "eagle3"
    assert s["accept_len"] == 2.0 and "assumed" in s["accept_len_source"]
    assert [r["accept_len"] for r in s["accept_len_sensitivity"]] == [1.5, 2.7]
    bad = CliRunner().invoke(app, ["estimate", "--workload", "agentx", "--isl", "100", "--pd", "1:1"])
    assert bad.exit_code == 2 and "--isl, --pd do not apply to --workload agentx" in bad.output


def test_open_loop_uses_the_trace_arrival_times():
    from m3lab.cache.trace import MOONCAKE_SYNTHETIC, read_mooncake
    tr = read_mooncake(MOONCAKE_SYNTHETIC, limit=40)
    req = cached_serving(DEP, trace=tr, calibration=None, open_loop=True).requests
    assert np.allclose(req["arrival_s"], tr.arrival_s) and req["finish_s"].notna().all()


def test_capacity_per_rank_comes_from_the_memory_model():
    from m3lab.serving.cache_capacity import cache_capacity
    from m3lab.serving.capacity import RESERVE_BYTES
    from m3lab.spec.hardware import load_hardware
    from m3lab.spec.memory import kv_bytes, weight_bytes_per_gpu
    from m3lab.spec.model import load_model
    from m3lab.spec.plan import ParallelPlan
    from m3lab.spec.quant import load_quant

    m, hw, q = load_model("minimax-m3"), load_hardware("mi355x"), load_quant("mxfp4")
    plan = ParallelPlan(tp=4).validate(m)
    cap = cache_capacity(m, plan, q, hw, gpu_memory_utilization=0.9)
    free = 0.9 * hw.hbm_bytes - weight_bytes_per_gpu(m, plan, q) - RESERVE_BYTES
    per_token = kv_bytes(m, q.kv_dtype, q.index_dtype, plan).total
    assert cap.block_size == 128 and cap.kv_bytes_per_token_per_gpu == per_token
    assert 0 <= free - cap.num_blocks * 128 * per_token < 128 * per_token          # whole blocks of what is left
    assert cache_capacity(m, plan, q, hw, gpu_memory_utilization=0.5).num_blocks < cap.num_blocks
    assert cap.with_tokens(1_000_000).num_blocks == 1_000_000 // 128


def test_coarse_step_times_stay_close_to_the_cost_model():
    from m3lab.serving.step_cost import StepCoster
    from m3lab.workload.step import EngineStep

    coster = StepCoster(DEP.with_settings({"spec_tokens": 3, "accept_len": 2.7, "accept_dataset": "assumed"}))
    coarse = CoarseStepTime(coster, "ceiling")
    rng = np.random.default_rng(0)
    for _ in range(8):
        nd, npre = int(rng.integers(0, 28)), int(rng.integers(1, 4))
        pn, pc = rng.integers(1, 6000, npre), rng.integers(10_000, 400_000, npre)
        step = EngineStep(np.r_[np.ones(nd, np.int64), pn], np.r_[rng.integers(20_000, 600_000, nd), np.maximum(pc, pn)],
                          decode_mask=np.r_[np.ones(nd, bool), np.zeros(npre, bool)])
        exact = coster.time_us(step, "ceiling") * 1e-6
        assert abs(coarse(step) / exact - 1) < 0.15
