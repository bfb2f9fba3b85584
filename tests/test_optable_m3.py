"""OpTable for MiniMax M3: local shapes vs AITER's tuned set, sharding rules, byte planes."""
import csv

import numpy as np
import pytest

from m3lab.optable import COLUMNS, build_optable
from m3lab.spec import ParallelPlan, load_model
from m3lab.spec.memory import params_active
from m3lab.workload import EngineStep

DENSE = ("gemm", "router", "lm_head")


@pytest.fixture(scope="module")
def m3():
    return load_model("minimax-m3")


def _dense_nk(df):
    d = df[df.kind.isin(DENSE)]
    return {(int(n), int(k)) for n, k in zip(d.n, d.k)}


def test_tp4_dense_gemms_equal_aiter_set(m3, shared_dir):
    rows = csv.DictReader(open(shared_dir / "data/aiter/a8w8_bpreshuffle_tuned_gemm_minimax_m3.csv"))
    aiter = {(int(r["N"]), int(r["K"])) for r in rows}
    df = build_optable(m3, ParallelPlan(tp=4, fused_shared_expert=True), "bf16", EngineStep.decode(8, 4096))
    assert _dense_nk(df) == aiter | {(128, 6144), (50016, 6144)}
    router = df[df.op == "router"].iloc[0]
    assert router.w_dtype == "fp32" and router.act_dtype == "fp32"
    moe = df[df.kind == "grouped_gemm"]
    assert set(zip(moe.experts, moe.topk, moe.hidden, moe.inter)) == {(129, 5, 6144, 768)}
    assert set(moe[moe.op == "moe_gate_up"].n) == {1536} and set(moe[moe.op == "moe_down"].k) == {768}


def test_tp8_and_ep(m3):
    df = build_optable(m3, ParallelPlan(tp=8), "bf16", EngineStep.decode(4, 100))
    assert set(df[df.kind == "grouped_gemm"].inter) == {384}
    assert set(df[(df.op == "qkv_proj") & (df.layer >= 3)].n) == {1536}  # 1024 + 128 + 128 (replicated) + 128 + 128
    att = df[df.op == "attention"]
    assert set(att.heads_q) == {8} and set(att.heads_kv) == {1}
    # fusion asked for; vLLM's answer (off under EP: m3lab fastpaths' shared_expert_fusion row) in the effective plan
    off = ParallelPlan(tp=8, ep=8, fused_shared_expert=True).as_run(index_q_replicated=False, shared_expert_fused=False)
    ep = build_optable(m3, off, "bf16", EngineStep.decode(64, 100))
    g = ep[ep.op == "moe_gate_up"].iloc[0]
    assert (g.experts, g.inter, g.n) == (16, 3072, 6144)
    assert g.routed_tokens == pytest.approx(64 * 4 / 8)     # each rank sees 1/8 of the routed rows
    sh = ep[ep.op == "shared_gate_up"]                       # the shared expert stays TP-sharded: 3072 / 8
    assert len(sh) == 57 and set(sh.n) == {2 * 384} and set(sh.m) == {64}


def test_indexer_only_on_computing_layers(m3):
    step = EngineStep.decode(2, 5000)
    full = build_optable(m3, ParallelPlan(tp=4), "bf16", step)
    assert (full.op == "indexer").sum() == 57 and (full.op == "topk").sum() == 57
    shared = build_optable(m3.with_index_sharing(4), ParallelPlan(tp=4), "bf16", step)
    assert sorted(shared[shared.op == "indexer"].layer) == list(range(3, 60, 4))
    assert (shared.op == "topk").sum() == 15 and (shared.op == "attention").sum() == 60


def test_allreduce_order_as_on_amd(m3):
    """Per layer: o_proj -> all-reduce fused with the post-attention norm -> FFN -> explicit FFN all-reduce ->
    the next layer's fused add + norm (its own kernel; the deferred FFN all-reduce is NVIDIA-only)."""
    df = build_optable(m3, ParallelPlan(tp=4), "mxfp8", EngineStep.decode(2, 100))
    for layer, last_ffn in ((1, "down_proj"), (30, "moe_sum"), (30, "shared_down")):
        ops = list(df[df.layer == layer].op)
        i = ops.index("allreduce_attn")
        assert ops[i - 1] == "o_proj" and ops[i + 1] == "post_attn_norm"
        assert ops[-1] == "allreduce_ffn" and last_ffn in ops[ops.index("post_attn_norm"):-1]
        nxt = list(df[df.layer == layer + 1].op)
        assert nxt[0] == "input_norm"
    post, inp = df[df.op == "post_attn_norm"], df[df.op == "input_norm"]
    assert set(post.fused_into) == {"allreduce_attn"} and set(inp.fused_into) == {None}
    tp1 = build_optable(m3, ParallelPlan(tp=1), "mxfp8", EngineStep.decode(2, 100))
    assert set(tp1[tp1.op == "post_attn_norm"].fused_into) == {None}


def test_comm_rows(m3):
    T = 37
    df = build_optable(m3, ParallelPlan(tp=4), "bf16", EngineStep.prefill(T))
    ar = df[df.kind == "allreduce"]
    assert (ar.op == "allreduce_attn").sum() == 60 and (ar.op == "allreduce_ffn").sum() == 60
    assert (ar.op == "allreduce_embed").sum() == 1
    assert set(ar.comm_factor) == {1.5} and set(ar.comm_algo) == {"ring"}
    assert set(ar.bytes_comm) == {T * 6144 * 2 * 1.5}
    assert (df.op == "logits_gather").sum() == 1
    assert not (build_optable(m3, ParallelPlan(tp=1), "bf16", EngineStep.prefill(T)).bytes_comm > 0).any()


def test_mxfp8_one_fused_projection(m3):
    """One q/k/v/index GEMM in one format (vLLM MinimaxM3QKVParallelLinearWithIndexer): 2560 columns at TP4."""
    df = build_optable(m3, ParallelPlan(tp=4), "mxfp8", EngineStep.decode(1, 10))
    assert not df.op.str.contains("indexer_q").any()
    qkv = df[(df.op == "qkv_proj") & (df.layer == 3)].iloc[0]
    assert (qkv.n, qkv.k, qkv.w_dtype, qkv.act_dtype) == (2560, 6144, "mxfp8", "mxfp8")
    assert qkv.bytes_weight == 2560 * 6144 * (1 + 1 / 32)
    assert set(df[(df.op == "qkv_proj") & (df.layer < 3)].n) == {2304}
    tp1 = build_optable(m3, ParallelPlan(tp=1), "mxfp8", EngineStep.decode(1, 10))
    assert set(tp1[(tp1.op == "qkv_proj") & (tp1.layer >= 3)].n) == {9856}
    ran = ParallelPlan(tp=4, indexer_cp=True).as_run(index_q_replicated=True, shared_expert_fused=False)
    cp = build_optable(m3, ran, "mxfp8", EngineStep.decode(1, 10))
    assert set(cp[(cp.op == "qkv_proj") & (cp.layer >= 3)].n) == {2944}   # index q replicated: 4 x 128
    asked = build_optable(m3, ParallelPlan(tp=4, indexer_cp=True), "mxfp8", EngineStep.decode(1, 10))
    assert set(asked[(asked.op == "qkv_proj") & (asked.layer >= 3)].n) == {2560}  # asked only: vLLM does not run it


def test_reuse_layers_skip_the_index_branch_but_keep_the_gemm(m3):
    step = EngineStep.decode(3, 4000)
    full = build_optable(m3, ParallelPlan(tp=4), "mxfp8", step)
    shared = build_optable(m3.with_index_sharing(4), ParallelPlan(tp=4), "mxfp8", step)
    computes, reuses = 7, 8
    for df in (full, shared):
        assert set(df[(df.op == "qkv_proj") & (df.layer >= 3)].n) == {2560}
    row = lambda df, op, layer: df[(df.op == op) & (df.layer == layer)].iloc[0]  # noqa: E731
    for op in ("qk_norm", "rope", "cache_write"):   # without sharing every sparse layer runs the index branch
        assert row(full, op, reuses).flops == row(shared, op, computes).flops
        assert row(full, op, reuses).bytes_kv == row(shared, op, computes).bytes_kv
    # computing layer: q, k and the index branch (1 index q head + the index key at TP4)
    assert row(shared, "qk_norm", computes).flops == 4 * 3 * (2048 + 128 + 128 + 128)
    assert row(shared, "qk_norm", reuses).flops == 4 * 3 * (2048 + 128)
    assert row(shared, "qk_norm", reuses).bytes_weight == 2 * 128 * 2
    assert row(shared, "rope", computes).flops == 3 * 3 * (16 + 1 + 1 + 1) * 64
    assert row(shared, "rope", reuses).flops == 3 * 3 * (16 + 1) * 64
    assert row(shared, "cache_write", computes).bytes_kv == 3 * (2 * 128 * 2 + 128 * 2)
    assert row(shared, "cache_write", reuses).bytes_kv == 3 * (2 * 128 * 2)
    assert ((shared.op == "indexer") & (shared.layer == reuses)).sum() == 0


def test_separate_shared_expert(m3):
    df = build_optable(m3, ParallelPlan(tp=4, fused_shared_expert=False), "bf16", EngineStep.decode(3, 10))
    assert set(df[df.kind == "grouped_gemm"].experts) == {128}
    sh = df[df.op == "shared_gate_up"]
    assert len(sh) == 57 and set(sh.n) == {1536}


def test_decode_flops_match_active_params(m3):
    B = int(np.random.default_rng().integers(1, 64))
    df = build_optable(m3, ParallelPlan(tp=1), "bf16", EngineStep.decode(B, 1))
    gemm_flops = df[df.kind.isin(("gemm", "router", "grouped_gemm"))].flops.sum()
    norms_and_bias = 2 * 6144 * 60 + 6144 + 60 * 2 * 128 + 57 * 2 * 128  # not GEMM weights
    assert gemm_flops == pytest.approx(2 * B * (params_active(m3) - norms_and_bias), rel=1e-9)


def test_columns_and_kv_bytes(m3):
    step = EngineStep.decode(2, 3000)
    df = build_optable(m3, ParallelPlan(tp=4), load_quant_fp8(), step)
    assert list(df.columns) == list(COLUMNS)
    # cache writes: per token 22,656 B at TP4 fp8/fp8, the per-rank KV size
    assert df[df.op == "cache_write"].bytes_kv.sum() == 2 * 22_656
    att = df[(df.op == "attention") & (df.layer == 10)].iloc[0]
    assert att.keys_attended == 2 * (15 * 128 + 2999 % 128 + 1)
    assert att.bytes_kv == att.keys_attended * 2 * 128  # fp8 K+V, one KV head


def load_quant_fp8():
    from m3lab.spec import load_quant
    return load_quant("fp8").with_cache("fp8", "fp8")


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "minimax-m2",
                                  "minimax-m3-mini"])
def test_other_models_build(name):
    m = load_model(name)
    df = build_optable(m, ParallelPlan(tp=2), "bf16", EngineStep.mixed(3, 50, 20))
    assert (df.flops >= 0).all() and df.flops.sum() > 0
    assert (df.op == "attention").sum() == m.layers
    assert (df.kind == "grouped_gemm").sum() == 2 * len(m.moe_layers)
