"""ServingConfig defaults are vLLM's; deployments render to vLLM's flags and parse back; presets are valid."""
import dataclasses
import os

import pytest

from m3lab.errors import M3LabError
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.serving import (ENV_FLAGS, FSE_ENV, PRESETS, V2_RUNNER_ENV, ServingConfig, deployment, list_presets,
                                load_preset, parse_vllm)
from m3lab.vllm.cite import Flag


def _vllm_default(name: str):
    """What vllm.envs returns for ``name`` with the variable unset."""
    from m3lab.vllm_src.imports import vllm_module
    envs = vllm_module("vllm.envs")
    saved = os.environ.pop(name, None)
    try:
        return envs.environment_variables[name]()
    finally:
        if saved is not None:
            os.environ[name] = saved


def test_every_env_default_equals_vllm_envs():
    s = ServingConfig()
    for field, var in ENV_FLAGS.items():
        assert _vllm_default(var) == getattr(s, field), var
        assert Flag(var, getattr(s, field)).line() > 0
    assert _vllm_default(FSE_ENV) is False  # ParallelPlan.fused_shared_expert renders it; vLLM's default is off
    assert _vllm_default(V2_RUNNER_ENV) is None and s.model_runner_v2 is None


def test_other_defaults_equal_vllm_config_defaults():
    from m3lab.vllm_src.imports import vllm_module
    kernel = vllm_module("vllm.config.kernel").KernelConfig
    attention = vllm_module("vllm.config.attention").AttentionConfig
    fields = {**kernel.__dataclass_fields__, **attention.__dataclass_fields__}
    s = ServingConfig()
    assert fields["monokernel"].default is s.monokernel is False
    assert fields["moe_backend"].default == s.moe_backend == "auto"
    assert fields["minimax_m3_indexer_cp"].default is ParallelPlan().indexer_cp is False
    assert fields["indexer_kv_dtype"].default == "auto"  # resolves to bf16: QuantScheme.index_dtype's default


@pytest.mark.parametrize("name", list_presets())
def test_presets_round_trip_through_vllm_flags(name):
    d = load_preset(name)
    env, args = d.to_vllm()
    back = parse_vllm(env, args, model=d.model.name, hardware=d.hardware.name, quant=d.quant.name)
    assert back.serving == d.serving
    assert back.plan == d.plan
    assert (back.quant.kv_dtype, back.quant.index_dtype) == (d.quant.kv_dtype, d.quant.index_dtype)
    assert back.model.sparse.index_topk_freq == d.model.sparse.index_topk_freq


def test_every_field_round_trips():
    d = deployment("minimax-m3-mxfp8", "mi355x", "mxfp8", tp=4, ep=4, dp=1)
    changed = dict(aiter=True, aiter_linear=False, aiter_moe=False, aiter_custom_ar=False, aiter_mha=False,
                   aiter_unified_attention=True, aiter_triton_gemm=False, skinny_gemm=False, shuffle_kv_cache=True,
                   model_runner_v2=False, monokernel=True, moe_backend="triton",
                   spec_method="eagle3", spec_tokens=3, spec_model="draft/eagle3", cudagraph_mode="PIECEWISE",
                   max_model_len=131072)
    assert set(changed) == {f.name for f in dataclasses.fields(ServingConfig)}
    d = dataclasses.replace(d, serving=ServingConfig(**changed), model=d.model.with_index_sharing(4, 1),
                            plan=dataclasses.replace(d.plan, indexer_cp=True),
                            quant=d.quant.with_cache("fp8", "fp8")).validate()
    env, args = d.to_vllm()
    back = parse_vllm(env, args, model="minimax-m3-mxfp8", hardware="mi355x", quant="mxfp8")
    assert back.serving == d.serving and back.plan == d.plan
    assert back.model.sparse == d.model.sparse and back.quant == d.quant


def test_optimised_preset_renders_the_write_up_launch_line():
    env, args = load_preset("mxfp8-tp4-optimised").to_vllm()
    assert env == {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1", FSE_ENV: "1"}
    hf = args[args.index("--hf-overrides") + 1]
    assert hf == '{"text_config":{"use_index_cache":true,"index_topk_freq":4}}'
    baseline_env, baseline_args = load_preset("mxfp8-tp4-baseline").to_vllm()
    assert baseline_env == {} and baseline_args == ["--tensor-parallel-size", "4"]


def test_parse_rejects_what_vllm_rejects_or_m3lab_does_not_model():
    with pytest.raises(M3LabError, match="top-level"):
        parse_vllm({}, ["--hf-overrides", '{"index_topk_freq": 4}'], model="minimax-m3", hardware="mi355x",
                   quant="bf16")
    with pytest.raises(M3LabError, match="not modelled"):
        parse_vllm({}, ["--enforce-eager"], model="minimax-m3", hardware="mi355x", quant="bf16")
    with pytest.raises(M3LabError, match="spec_tokens"):
        ServingConfig(spec_method="eagle3").validate()
    with pytest.raises(M3LabError, match="moe_backend"):
        ServingConfig(moe_backend="cutlass").validate()


def test_settings_reach_their_owners():
    d = load_preset("mxfp8-tp4-baseline").with_settings({"aiter": "1", "kv_dtype": "fp8", "index_topk_freq": "4",
                                                         "fused_shared_expert": "true", "ep": "4"})
    assert d.serving.aiter and d.quant.kv_dtype == "fp8" and d.model.sparse.index_topk_freq == 4
    assert d.plan.fused_shared_expert and d.plan.ep == 4
    with pytest.raises(M3LabError, match="boolean"):
        d.with_settings({"aiter": "maybe"})


def test_presets_name_the_write_up_deployments():
    assert {"mxfp8-tp4-baseline", "mxfp8-tp4-optimised", "mxfp4-tp2", "eagle3-mxfp8-tp4", "pd-mxfp8-prefill-tp4",
            "pd-mxfp8-decode-tp4"} <= set(PRESETS)
    e = load_preset("eagle3-mxfp8-tp4")
    assert (e.serving.spec_method, e.serving.spec_tokens, e.plan.tp) == ("eagle3", 3, 4)
    assert load_preset("pd-mxfp8-prefill-tp4").plan.role == "prefill"
