"""Parameter counts and KV/weight bytes: the published MiniMax M3 figures, exactly."""
import pytest

from m3lab.spec import ParallelPlan, load_model
from m3lab.spec.memory import (kv_bytes, kv_bytes_per_token, param_breakdown, params_active, params_total,
                               weight_bytes_breakdown, weight_bytes_per_gpu)


@pytest.fixture(scope="module")
def m3():
    return load_model("minimax-m3")


def test_m3_parameter_counts(m3):
    assert params_total(m3) == 426_174_572_928
    assert round(params_active(m3) / 1e9, 2) == 23.50
    assert round(params_active(m3, lm_head=True) / 1e9, 2) == 24.73
    assert round(params_active(m3, embedding=True, lm_head=True) / 1e9, 2) == 25.96
    assert param_breakdown(m3)["routed_expert"] == 57 * 128 * 3 * 3072 * 6144


def test_m3_kv_bytes(m3):
    assert kv_bytes_per_token(m3) == 137_472
    assert kv_bytes(m3).as_dict() == {"main": 122_880, "index": 14_592, "total": 137_472}
    assert kv_bytes_per_token(m3, "fp8", "fp8") == 68_736
    tp4, tp8 = ParallelPlan(tp=4), ParallelPlan(tp=8)
    assert kv_bytes_per_token(m3, "fp8", "fp8", tp4) == 22_656
    assert kv_bytes_per_token(m3, "fp8", "bf16", tp4) == 29_952
    assert kv_bytes_per_token(m3, "bf16", "bf16", tp8) == 45_312  # KV heads replicated at TP8


def test_other_models_published_sizes():
    assert round(params_total(load_model("llama-3.1-8b")) / 1e9, 2) == 8.03
    assert round(params_total(load_model("mixtral-8x7b")) / 1e9, 1) == 46.7
    assert round(params_total(load_model("qwen3-30b-a3b")) / 1e9, 1) == 30.5
    assert round(params_total(load_model("deepseek-v3")) / 1e9) == 671
    assert kv_bytes_per_token(load_model("deepseek-v3")) == 61 * (512 + 64) * 2  # MLA latent + rope key


def test_weight_bytes_per_gpu(m3):
    tp4 = ParallelPlan(tp=4)
    bf16 = weight_bytes_per_gpu(m3, tp4, "bf16")
    # TP splits everything but the replicated router, norms and index key; bf16 is ~2 bytes/param / 4
    assert 0.99 < bf16 / (2 * params_total(m3) / 4) < 1.01
    mx8 = weight_bytes_breakdown(m3, tp4, "mxfp8")
    assert mx8["routed_expert"] == pytest.approx(57 * 128 * 3 * 768 * 6144 * (1 + 1 / 32))
    mx4 = weight_bytes_breakdown(m3, tp4, "mxfp4")
    assert mx4["routed_expert"] == pytest.approx(57 * 128 * 3 * 768 * 6144 * (0.5 + 1 / 32))
    assert mx4["attn_qkv"] == weight_bytes_breakdown(m3, tp4, "bf16")["attn_qkv"]  # attention stays bf16
    ep8 = weight_bytes_breakdown(m3, ParallelPlan(tp=8, ep=8), "bf16")
    assert ep8["routed_expert"] == pytest.approx(57 * 16 * 3 * 3072 * 6144 * 2)  # 16 whole experts per rank


def test_index_cache_allocated_on_every_sparse_layer_with_index_sharing():
    """vLLM keeps the indexer and its index-key cache on all 57 sparse layers, reuse layers included."""
    from m3lab.spec.memory import kv_bytes
    from m3lab.spec.model import load_model

    m3 = load_model("minimax-m3")
    assert kv_bytes(m3.with_index_sharing(4)).index == kv_bytes(m3).index == 57 * 128 * 2
