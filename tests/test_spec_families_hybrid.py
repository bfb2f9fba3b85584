"""Qwen3.5 MoE (Gated DeltaNet + gated full attention) and GLM-5.2 (MLA + DeepSeek sparse attention): ModelSpec,
parameter counts against the published totals, memory facts and OpTable shapes, counted by hand here."""
import json
import random

import pytest

from m3lab.errors import M3LabError
from m3lab.optable import build_optable
from m3lab.spec.memory import kv_bytes, params_active, params_total, state_bytes_per_request
from m3lab.spec.model import ModelSpec, load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.workload.step import EngineStep

QWEN, GLM = "qwen3.5-397b-a17b", "glm-5.2"


def test_qwen3_5_spec_and_published_params():
    m = load_model(QWEN)
    assert (m.family, m.layers, m.hidden, m.heads_q, m.heads_kv, m.head_dim, m.rotary_dim) == (
        "qwen3_5_moe", 60, 4096, 32, 2, 256, 64)                      # partial rotary 0.25 of 256
    assert m.linear_layers == tuple(i for i in range(60) if i % 4 != 3) and m.kv_layers == tuple(range(3, 60, 4))
    assert (m.linear.key_heads, m.linear.value_heads, m.linear.conv_kernel, m.linear.state_dtype) == (16, 64, 4, "fp32")
    assert (m.experts, m.topk, m.expert_inter, m.shared_inter, m.attn_output_gate) == (512, 10, 1024, 1024, True)
    # Published: 397 B total, 17 B active (the release also carries a vision encoder and an MTP layer, not counted)
    assert params_total(m) == pytest.approx(397e9, rel=0.01)
    assert params_active(m, embedding=True, lm_head=True) == pytest.approx(17e9, rel=0.05)


def test_glm5_2_spec_and_params():
    m = load_model(GLM)
    assert (m.family, m.layers, m.hidden, m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_rope_head_dim,
            m.mla.qk_nope_head_dim, m.mla.v_head_dim) == ("glm_moe_dsa", 78, 6144, 2048, 512, 64, 192, 256)
    sp = m.sparse
    assert (sp.style, sp.index_heads, sp.index_dim, sp.block_size, sp.topk_blocks) == ("dsa", 32, 128, 1, 2048)
    assert m.dense_mlp_layers == (0, 1, 2) and (m.experts, m.topk, m.n_shared) == (256, 8, 1)
    # indexer_types: layers 0-2 compute their top-k, then every 4th from layer 6 (freq 4, offset 3)
    assert m.topk_layers == (0, 1, 2) + tuple(range(6, 78, 4)) and len(m.topk_layers) == 21
    assert m.topk_source()[5] == 2 and m.topk_source()[7] == 6
    # GLM-5 was published as 744 B total / 40 B active; GLM-5.2 keeps the architecture (no GLM-5.2 figure found)
    assert params_total(m) == pytest.approx(744e9, rel=0.01)
    assert params_active(m, lm_head=True) == pytest.approx(40e9, rel=0.03)
    fp8 = load_model("glm-5.2-fp8")
    assert params_total(fp8) == params_total(m) and fp8.topk_layers == m.topk_layers


def test_glm_pattern_rule_matches_indexer_types(shared_dir):
    cfg = json.loads((shared_dir / "data/hf_configs/zai-org__GLM-5.2__config.json").read_text())
    explicit = ModelSpec.from_hf_config(cfg)
    cfg.pop("indexer_types")
    assert ModelSpec.from_hf_config(cfg).topk_layers == explicit.topk_layers   # freq/offset rule agrees


def test_qwen3_5_memory_state_per_request():
    m = load_model(QWEN)
    tp = random.choice([1, 2, 4])
    plan = ParallelPlan(tp=tp)
    vh, kh = 64 // tp, 16 // tp
    state = 45 * (vh * 128 * 128 * 4 + 3 * (2 * kh * 128 + vh * 128) * 2)   # fp32 delta state + bf16 conv state
    assert state_bytes_per_request(m, plan) == state
    assert kv_bytes(m, "bf16", "bf16", plan).total == 15 * 2 * max(1, 2 // tp) * 256 * 2   # 15 full-attention layers
    with pytest.raises(M3LabError, match="linear-attention"):
        ParallelPlan(tp=32).validate(m)


def test_qwen3_5_optable_rows_by_hand():
    m = load_model(QWEN)
    D, C = random.randint(2, 64), random.randint(100, 20000)
    ot = build_optable(m, ParallelPlan(tp=4), "fp8", EngineStep.decode(D, C))
    lin = ot[ot["op"] == "gated_delta_rule"]
    assert len(lin) == 45 and set(lin["kind"]) == {"linear_attention"}
    assert (lin["bytes_kv"] == 2 * D * 16 * 128 * 128 * 4).all()           # read + write the state, per request
    conv = ot[ot["op"] == "conv1d"]
    assert (conv["bytes_kv"] == 2 * D * 3 * (2 * 4 * 128 + 16 * 128) * 2).all()
    qkv = ot[ot["op"] == "qkv_proj"]
    assert len(qkv) == 15 and (qkv["n"] == (2 * 8 + 2 * 1) * 256).all()    # q + output gate + k + v, TP4
    att = ot[ot["op"] == "attention"]
    assert (att["bytes_kv"] == D * C * 2 * 1 * 256 * 2).all()               # bf16 K/V, 1 KV head per rank
    assert set(ot.loc[ot["kind"] == "quant", "op"]) >= {"in_proj_qkvz_quant", "out_proj_quant", "moe_gate_up_quant"}


def test_glm_optable_rows_by_hand():
    m = load_model(GLM)
    D, C = random.randint(2, 64), random.randint(3000, 20000)
    ot = build_optable(m, ParallelPlan(tp=4), "mxfp4", EngineStep.decode(D, C))
    idx = ot[ot["op"] == "indexer"]
    assert list(idx["layer"]) == list(m.topk_layers)
    assert (idx["heads_q"] == 32).all()                                     # DSA index q heads replicated
    assert (idx["bytes_kv"] == D * C * 128 * 2).all()                       # every cached index key, bf16
    att = ot[ot["op"] == "attention"]
    assert len(att) == 78 and (att["keys_attended"] == D * 2048).all()      # token-level top-2048
    assert (att["bytes_kv"] == D * 2048 * 576 * 2).all()                    # latent + rope rows of the selected
    cw = ot[ot["op"] == "cache_write"].set_index("layer")["bytes_kv"]
    assert cw[6] == D * (576 + 128) * 2 and cw[7] == D * 576 * 2             # shared layers keep no index keys
    assert len(ot[ot["op"] == "gate_up_proj"]) == 3


def test_shipped_configs_match_shared(shared_dir):
    from m3lab.spec.model import CONFIG_DIR

    for name, src in (("qwen3.5-397b-a17b.json", "Qwen__Qwen3.5-397B-A17B__config.json"),
                      ("glm-5.2.json", "zai-org__GLM-5.2__config.json")):
        assert (CONFIG_DIR / name).read_bytes() == (shared_dir / "data/hf_configs" / src).read_bytes()


def test_qwen3_5_capacity_counts_state_per_request():
    from m3lab.serving.capacity import capacity
    from m3lab.spec.hardware import load_hardware

    m, plan, hw = load_model(QWEN), ParallelPlan(tp=4), load_hardware("mi355x")
    k = random.randint(1, 4)
    plain = capacity(m, plan, "fp8", hw, isl=8192, osl=1024)
    spec = capacity(m, plan, "fp8", hw, isl=8192, osl=1024, spec_tokens=k)
    state = state_bytes_per_request(m, plan)
    assert plain.state_bytes_per_request_per_gpu == state and spec.state_bytes_per_request_per_gpu == (1 + k) * state
    free = plain.gpu_memory_utilization * hw.hbm_bytes - plain.weight_bytes_per_gpu - plain.reserve_bytes
    per_req = plain.tokens_per_request * plain.kv_bytes_per_token_per_gpu
    assert plain.max_concurrency == int(free // (per_req + state)) and spec.max_concurrency < plain.max_concurrency
    with pytest.raises(M3LabError, match="recurrent state"):
        spec.check(spec.max_concurrency + 1)
