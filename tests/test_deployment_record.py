"""The Deployment record: every field keys the caches, one settings vocabulary (m3lab, vLLM env vars, vLLM flags),
vLLM's own defaults, derived names for changed presets, and the entry points that take it."""
import dataclasses
import inspect
import json

import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app
from m3lab.errors import M3LabError
from m3lab.serving import step_cost
from m3lab.serving.estimate import estimate
from m3lab.spec import settings as vocab
from m3lab.spec.limits import VLLM_GPU_MEMORY_UTILIZATION, VLLM_SERVE_BATCH_DEFAULTS, vllm_batch_defaults
from m3lab.spec.serving import default_deployment, load_preset, make_deployment, parse_vllm
from m3lab.spec.traffic import VLLM_BENCH_NUM_PROMPTS

# one value per key, different from the default deployment's (validity is not needed for the key)
OTHER = {
    "model": "minimax-m3-mxfp8", "hardware": "h200", "quant": "mxfp4", "kv_dtype": "fp8", "index_dtype": "fp8",
    "index_topk_freq": 4, "enable_expert_parallel": 1, "pd": "2:1", "kv_link_gbps": 100,
    "tp": 8, "ep": 2, "dp": 2, "role": "decode", "fused_shared_expert": 1, "indexer_cp": 1,
    "aiter": 1, "aiter_linear": 0, "aiter_moe": 0, "aiter_custom_ar": 0, "aiter_mha": 0,
    "aiter_unified_attention": 1, "aiter_triton_gemm": 0, "skinny_gemm": 0, "shuffle_kv_cache": 1,
    "model_runner_v2": 1, "monokernel": 1, "moe_backend": "triton", "spec_method": "eagle3", "spec_tokens": 3,
    "spec_model": "draft/x", "cudagraph_mode": "PIECEWISE", "max_model_len": 65536,
    "max_num_seqs": 64, "max_num_batched_tokens": 4096, "chunked_prefill": 0, "gpu_memory_utilization": 0.8,
    "prefix_caching": 0, "async_scheduling": 0, "accept_len": 2.5, "accept_dataset": "MT-Bench", "draft_cost": 0.1,
    "workload": "agentx", "isl": 4096, "osl": 512, "concurrency": 64, "num_prompts": 100, "request_rate": 2.0,
    "sessions": 7, "trace": "t.jsonl", "seed": 3,
    **{f"{r}_{f}": v for r in ("prefill", "decode") for f, v in (("instances", 2), ("tp", 8), ("ep", 2),
                                                                 ("max_num_seqs", 8), ("max_num_batched_tokens", 512),
                                                                 ("layout", "aiter"))},
}


def test_every_field_of_the_record_changes_its_key():
    assert set(OTHER) == set(vocab.keys()), "a new record field needs a value here"
    base = default_deployment()
    keys = {base.key()}
    for key, value in OTHER.items():
        changed = vocab.apply(base, {key: value})
        assert changed.key() != base.key(), key
        keys.add(changed.key())
    assert len(keys) == len(OTHER) + 1
    assert dataclasses.replace(base, name="x", description="y").key() == base.key()  # names are not results
    assert make_deployment().key() == base.key()                                    # stable for equal fields


def _decode_ms(d) -> float:
    est = estimate(d, calibration=None)
    return est.results["ceiling"]["tpot_ms"]


@pytest.mark.parametrize("change", [{"kv_dtype": "fp8"}, {"index_dtype": "fp8"}, {"index_topk_freq": 4}])
def test_estimates_differing_in_one_cache_field_differ_in_either_order(change, monkeypatch):
    # AITER + the shuffled layout: an fp8 index cache serves (through the MSA indexer; vLLM refuses it otherwise)
    base = make_deployment("mxfp8-tp4-optimised", isl=2048, osl=16, concurrency=2, num_prompts=4, index_topk_freq=1)
    other = base.with_settings(change)
    runs = []
    for order in ((base, other), (other, base)):
        step_cost._OPTABLE_CACHE.clear()
        runs.append({d.key(): _decode_ms(d) for d in order})
    assert runs[0] == runs[1]                                     # the call order does not matter
    assert runs[0][base.key()] != runs[0][other.key()]            # and the field does
    # planted: an OpTable cache keyed on names alone (model and quant) hands the first deployment's tables on
    monkeypatch.setattr(step_cost, "stable_key", lambda model, plan, quant, *what_runs: (model.name, plan, quant.name))
    step_cost._OPTABLE_CACHE.clear()
    first, second = _decode_ms(base), _decode_ms(other)
    assert first == second


def test_settings_take_vllm_env_and_flag_names():
    d = default_deployment().with_settings({
        "VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1",
        "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1", "--max-num-seqs": "128", "--kv-cache-dtype": "fp8",
        "--no-enable-prefix-caching": "1", "--max-concurrency": "64", "index_topk_freq": "4",
        "--enable-expert-parallel": "true"})
    assert d.serving.aiter and d.plan.fused_shared_expert and d.serving.shuffle_kv_cache
    assert d.limits.max_num_seqs == 128 and d.quant.kv_dtype == "fp8" and d.limits.prefix_caching is False
    assert d.workload.concurrency == 64 and d.model.sparse.index_topk_freq == 4 and d.plan.ep == 4
    with pytest.raises(M3LabError, match="did you mean max_num_seqs"):
        d.with_settings({"max_num_seq": "3"})
    res = CliRunner().invoke(app, ["estimate", "--set", "VLLM_ROCM_USE_AITR=1"])
    assert res.exit_code == 2 and "VLLM_ROCM_USE_AITER" in res.output


def test_defaults_are_vllms():
    from m3lab.spec.hardware import list_hardware, load_hardware
    from m3lab.vllm_src.imports import vllm_module

    for name in VLLM_SERVE_BATCH_DEFAULTS:
        assert vllm_batch_defaults(load_hardware(name)) == VLLM_SERVE_BATCH_DEFAULTS[name], name
    assert set(VLLM_SERVE_BATCH_DEFAULTS) == set(list_hardware())
    cache = vllm_module("vllm.config.cache").CacheConfig
    assert cache().gpu_memory_utilization == VLLM_GPU_MEMORY_UTILIZATION
    assert vllm_module("vllm.benchmarks.datasets.datasets").DEFAULT_NUM_PROMPTS == VLLM_BENCH_NUM_PROMPTS
    limits = default_deployment().scheduler_limits()
    assert (limits.max_num_seqs, limits.max_num_batched_tokens) == (1024, 16384)   # vllm serve on a 288 GB MI355X
    assert default_deployment().settings()["max_num_batched_tokens"] == 16384


def test_limits_round_trip_through_vllm_flags():
    d = load_preset("mxfp8-tp4-optimised").with_settings({"max_num_seqs": 128, "max_num_batched_tokens": 4096,
                                                          "gpu_memory_utilization": 0.85, "prefix_caching": 0,
                                                          "async_scheduling": 0})
    env, args = d.to_vllm()
    assert "--no-enable-prefix-caching" in args and args[args.index("--max-num-seqs") + 1] == "128"
    back = parse_vllm(env, args, model=d.model.name, hardware=d.hardware.name, quant=d.quant.name)
    assert back.limits == d.limits and back.serving == d.serving and back.plan == d.plan


def test_a_changed_preset_is_named_for_what_changed():
    assert make_deployment("mxfp4-tp2", tp=8).name == "mxfp4-tp2+tp=8"
    assert make_deployment("mxfp4-tp2", tp=2, isl=4096).name == "mxfp4-tp2"       # traffic and no-ops keep it
    out = CliRunner().invoke(app, ["vllm", "plan", "--preset", "mxfp4-tp2", "--tp", "8", "--json"])
    assert out.exit_code == 0, out.output
    p = json.loads(out.output)
    assert p["name"] == "mxfp4-tp2+tp=8" and "mxfp4-tp2-c" not in out.output
    assert "deployment=mxfp4-tp2+tp=8" in " ".join(p["bench_argv"])


def test_entry_points_take_a_deployment():
    from m3lab.serving.cached import cached_serving
    from m3lab.serving.step_cost import cost_step
    from m3lab.serving.disagg import pd_estimate
    from m3lab.spec.memory import memory_facts
    from m3lab.analysis.shapes import shape_histograms

    for fn in (estimate, pd_estimate, cached_serving, cost_step, shape_histograms, memory_facts):
        assert next(iter(inspect.signature(fn).parameters)) == "deployment", fn.__name__
    with pytest.raises(M3LabError, match="fixed-length"):
        estimate(make_deployment(None, workload="agentx"))
    with pytest.raises(M3LabError, match="request_rate"):
        estimate(make_deployment(None, request_rate=4))


def test_help_shows_readable_metavars():
    for cmd in (["estimate"], ["shapes"], ["model"], ["fastpaths"], ["vllm", "plan"]):
        text = CliRunner().invoke(app, [*cmd, "--help"], env={"COLUMNS": "200"}).output
        assert "--set KEY=VALUE" in text and "--preset" in text and "<list" not in text, cmd
