"""The cached scheduler (prefix hits, KV capacity, preemption, queues) and the timed serving run."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from m3lab.cache.agentic import generate
from m3lab.cache.replay import M3LabKVCache, blocks_for_tokens
from m3lab.cache.scheduler import CachedScheduler
from m3lab.cache.serving import cached_serving, spec_steps
from m3lab.cache.trace import fixed_length
from m3lab.errors import M3LabError
from m3lab.spec.serving import make_deployment
from m3lab.cli.main import app
from m3lab.workload.scheduler import Scheduler, SchedulerConfig, Workload


def _run(trace, capacity_tokens, concurrency=3, **cfg):
    kv = M3LabKVCache(blocks_for_tokens(capacity_tokens, trace.block_size), trace.block_size)
    sched = CachedScheduler(trace, kv, SchedulerConfig(**cfg), step_time=lambda s: 1e-3 * (1 + s.num_tokens / 512),
                            concurrency=concurrency)
    steps = [run.step for run in sched.runs(sched.workload())]
    return sched, kv, steps


def test_without_sharing_it_schedules_like_the_base_scheduler():
    tr = fixed_length(12, 700, 9, block_size=128)
    sched, kv, steps = _run(tr, 10**7, concurrency=4, max_num_batched_tokens=1024)
    base = list(Scheduler(SchedulerConfig(max_num_batched_tokens=1024)).steps(
        Workload(isl=700, osl=9, concurrency=4, num_requests=12)))
    assert [s.new_tokens.tolist() for s in steps] == [s.new_tokens.tolist() for s in base]
    assert kv.stats.hits == 0 and sched.last_state.finished == 12


def test_prefix_hits_shorten_prefills_and_blocks_come_back():
    tr = generate(sessions=6, seed=4, turns_median=5, block_size=128)
    sched, kv, steps = _run(tr, 10**8)
    assert sched.last_state.finished == len(tr) and sched.last_state.preemptions == 0
    prefill = sum(int(s.new_tokens[~s.decode_mask].sum()) for s in steps)
    assert prefill == int((tr.prompt - sched.hit_tokens).sum())       # hits were not recomputed
    assert sched.hit_tokens.sum() > 0.5 * tr.prompt.sum()
    assert kv.num_used == 0 and kv.usage == 0                          # every block came back
    assert kv.num_cached > 0                                           # ... and stayed cached (lazy eviction)


def test_turns_wait_for_their_predecessor_and_think():
    tr = generate(sessions=3, seed=1, turns_median=4)
    sched, _, _ = _run(tr, 10**8)
    waits = np.flatnonzero(tr.after >= 0)
    assert (sched.arrived[waits] >= sched.arrived[tr.after[waits]] + tr.think_s[waits]).all()


def test_small_capacity_preempts_and_still_finishes():
    tr = fixed_length(10, 1000, 700)
    sched, kv, _ = _run(tr, 4 * 1100, concurrency=10)
    assert sched.last_state.finished == 10 and sched.last_state.preemptions > 0
    assert kv.stats.preempted_requests > 0 and kv.stats.preempted_hits > 0   # recomputed from its own cached blocks
    assert max(r["waiting"] for r in sched.timeline) > 0 and max(r["kv_usage"] for r in sched.timeline) > 0.9
    assert _run(tr, 10**7, concurrency=10)[0].last_state.preemptions == 0


def test_smaller_cache_lower_hit_rate():
    tr = generate(sessions=6, seed=4, turns_median=5, max_context=100_000)
    rates, evicted = [], []
    for tokens in (10**8, 200_000, 120_000):
        kv = _run(tr, tokens, concurrency=6)[1]
        rates.append(kv.stats.hit_rate)
        evicted.append(kv.evicted_blocks)
    assert rates[0] > rates[1] > rates[2] and evicted[0] == 0 < evicted[1] < evicted[2]


def test_a_request_that_never_fits_is_an_error():
    from m3lab.errors import M3LabError
    tr = fixed_length(2, 4000, 4)
    with pytest.raises(M3LabError, match="cannot make progress"):
        _run(tr, 2000)


def test_spec_steps():
    assert spec_steps(np.array([1, 444]), 0, None).tolist() == [1, 444]
    assert spec_steps(np.array([1, 444]), 3, 2.7).tolist() == [1, 1 + 165]


def test_timed_serving_run_reports_distributions():
    tr = generate(sessions=4, seed=2, turns_median=4)
    dep = make_deployment(None, model="minimax-m3", hardware="mi355x", tp=4, quant="mxfp4", concurrency=4,
                          workload="agentx")
    spec = dep.with_settings({"spec_tokens": 3, "accept_len": 2.7, "accept_dataset": "assumed"})
    run = cached_serving(spec, trace=tr)
    s = run.summary()
    for key in ("ttft_p50_s", "tpot_p50_ms", "prefix_cache_hit_rate", "kv_cache_usage", "output_tokens_per_s_per_gpu"):
        assert s[key] is not None and np.isfinite(s[key]) and s[key] >= 0, key
    assert s["ttft_p50_s"] <= s["ttft_p90_s"] <= s["ttft_p99_s"]
    assert s["tpot_p50_ms"] <= s["tpot_p90_ms"] <= s["tpot_p99_ms"]
    assert 0.5 < s["prefix_cache_hit_rate"] < 1 and 0 < s["kv_cache_usage"] <= s["kv_cache_usage_peak"] <= 1
    assert s["accept_len"] == 2.7 and s["accept_len_source"] == "assumed"
    with pytest.raises(M3LabError, match="agentic"):   # a chat benchmark's acceptance is not agentic traffic's
        spec.with_settings({"accept_dataset": "MT-Bench"})
    with pytest.raises(M3LabError, match="accept_len"):
        cached_serving(dep.with_settings({"spec_tokens": 3}), trace=tr)
    assert run.requests["finish_s"].notna().all() and len(run.timeline) > 0
    small = cached_serving(spec, trace=tr, capacity_tokens=int((tr.prompt + tr.output).max()) + 1024).summary()
    assert small["prefix_cache_hit_rate"] < s["prefix_cache_hit_rate"]


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
                                   "mxfp4", "--spec-tokens", "3", "--accept-len", "2.7", "--set", "accept_dataset=assumed",
                                   "--workload", "agentx", "--concurrency", "2", "--json"])
    assert out.exit_code == 0, out.output
    s = json.loads(out.output)
    for key in ("ttft_p50_s", "tpot_p50_ms", "prefix_cache_hit_rate", "kv_cache_usage", "output_tokens_per_s_per_gpu"):
        assert isinstance(s[key], float) and s[key] >= 0, key
    assert s["sessions"] == 2 and s["tp"] == 4 and s["quant"] == "mxfp4"
    assert s["accept_len_source"] == "assumed"
    bad = CliRunner().invoke(app, ["estimate", "--workload", "agentx", "--isl", "100", "--pd", "1:1"])
    assert bad.exit_code == 2 and "--isl, --pd do not apply to --workload agentx" in bad.output
    unsourced = CliRunner().invoke(app, ["estimate", "--workload", "agentx", "--spec-tokens", "3"])
    assert unsourced.exit_code == 2 and "accept_len" in unsourced.output


def test_open_loop_uses_the_trace_arrival_times():
    from m3lab.cache.trace import MOONCAKE_SYNTHETIC, read_mooncake
    tr = read_mooncake(MOONCAKE_SYNTHETIC, limit=40)
    kv = M3LabKVCache(blocks_for_tokens(4_000_000, 128), 128)
    sched = CachedScheduler(tr, kv, step_time=lambda s: 0.02, open_loop=True)
    for _ in sched.runs(sched.workload()):
        pass
    assert sched.last_state.finished == 40
    assert np.allclose(sched.arrived, tr.arrival_s)                  # each joined the queue at its timestamp
    assert sched.last_state.clock >= tr.arrival_s.max()


def test_capacity_per_rank_comes_from_the_memory_model():
    from m3lab.cache.capacity import cache_capacity
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
    from m3lab.cache.serving import CoarseStepTime
    from m3lab.serving.step_cost import StepCoster
    from m3lab.spec.serving import make_deployment
    from m3lab.workload.step import EngineStep

    coster = StepCoster(make_deployment(model="minimax-m3", hardware="mi355x", quant="mxfp4", tp=4,
                                        spec_method="eagle3", spec_tokens=3, accept_len=2.7))
    coarse = CoarseStepTime(coster, "ceiling")
    rng = np.random.default_rng(0)
    for _ in range(6):
        nd = int(rng.integers(1, 28))
        ctx = rng.integers(20_000, 600_000, nd)
        step = EngineStep(np.r_[np.ones(nd, np.int64), [3000]], np.r_[ctx, [150_000]],
                          decode_mask=np.r_[np.ones(nd, bool), [False]])
        exact = coster.time_us(step, "ceiling") * 1e-6
        assert abs(coarse(step) / exact - 1) < 0.15
