"""Bytes counted twice: a hand count of one MiniMax M3 TP4 MXFP8 decode step against the
OpTable's byte planes, plus the byte-plane and time-by-plane views."""
import random

import numpy as np
import pytest

from m3lab.analysis.byte_planes import byte_planes, pd_kv_handoff, plane_totals, time_by_plane
from m3lab.cost.model import cost_optable
from m3lab.errors import M3LabError
from m3lab.optable import build_optable
from m3lab.spec.hardware import load_hardware
from m3lab.spec.model import load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.workload.step import EngineStep

# M3 text config (reference §1) and TP4 local sizes (reference §3), written out by hand on purpose. The model is
# vLLM 0.33.0's AMD one: q/k/v/index q/index k are ONE MXFP8 GEMM; index-sharing reuse layers skip the index
# norm, RoPE and index-key write; shared-expert fusion only when asked for.
H, L, SPARSE, DENSE, MOE, DENSE_MLP = 6144, 60, 57, 3, 57, 3
Q_LOCAL, KV_LOCAL, HD = 2048, 128, 128            # 16 q heads, 1 KV head per rank
IDX_Q_LOCAL, IDX_K, IDX_D = 128, 128, 128         # index q heads shard like KV heads; index key replicated
O_K, DENSE_I, EXPERT_I, SHARED_I, EXPERTS, TOPK = 2048, 12288, 768, 768, 128, 4   # shared expert 3072 / TP
VOCAB_LOCAL = 200064 // 4                         # 50016 (200064 is already a multiple of 64)
BLOCK, TOPK_BLOCKS = 128, 16
MX, BF16, FP32 = 1 + 1 / 32, 2, 4                 # MXFP8: one E8M0 scale byte per 32 weights
TP = 4
RING = 2 * (TP - 1) / TP                          # ring all-reduce: 2(p-1)/p of the payload per GPU
GATHER = (TP - 1) / TP                            # gather of the vocab-parallel logits: (p-1)/p
SPARSE_QKV = Q_LOCAL + 2 * KV_LOCAL + IDX_Q_LOCAL + IDX_K   # 2560: the one fused projection of a sparse layer
DENSE_QKV = Q_LOCAL + 2 * KV_LOCAL                          # 2304
CASES = {"default": (False, 57), "fused": (True, 57), "shared_index_freq4": (False, 15)}  # (fusion, computing layers)


def hand_count(D: int, C: int, fused: bool, computing: int) -> dict:
    """Per-GPU bytes of one step of D decodes at KV length C (after the step), balanced routing with every
    expert touched, bf16 KV and index caches (the mxfp8 preset); ``computing`` sparse layers run the index
    branch (the others reuse the top-k)."""
    T = D
    experts = (MOE * (EXPERTS + 1) * 3 * EXPERT_I * H * MX if fused    # 128 routed + the fused shared expert
               else MOE * EXPERTS * 3 * EXPERT_I * H * MX + MOE * 3 * SHARED_I * H * MX)   # shared MLP apart
    weights = (DENSE * DENSE_QKV * H * MX + SPARSE * SPARSE_QKV * H * MX   # qkv(+index) projection, all MXFP8
               + L * H * O_K * MX                                # o_proj
               + DENSE_MLP * 3 * DENSE_I // TP * H * MX          # dense MLP gate, up, down (layers 0-2)
               + MOE * EXPERTS * H * FP32                        # router, fp32, replicated
               + experts
               + T / TP * H * BF16                               # embedding rows this rank's vocab shard owns
               + VOCAB_LOCAL * H * BF16                          # lm_head shard
               + (2 * L * H + H) * BF16                          # input/post-attention norms, final norm
               + L * 2 * HD * BF16 + computing * 2 * IDX_D * BF16)  # per-head q/k norms; index q/k norms
    kv_tok, idx_tok = 2 * KV_LOCAL * BF16, IDX_D * BF16          # 512 B and 256 B per token per layer
    sparse_keys = C if C <= TOPK_BLOCKS * BLOCK else (TOPK_BLOCKS - 1) * BLOCK + (C - 1) % BLOCK + 1
    kv = (L * T * kv_tok + computing * T * idx_tok               # cache writes of the new token
          + computing * D * C * idx_tok                          # indexer reads every index key
          + SPARSE * D * sparse_keys * kv_tok                    # sparse attention reads its 16 blocks
          + DENSE * D * C * kv_tok)                              # dense layers 0-2 read everything
    payload = T * H * BF16
    comm = (2 * L * RING * payload                               # two all-reduces of [T, 6144] bf16 per layer
            + RING * payload                                     # vocab-parallel embedding all-reduce
            + GATHER * D * VOCAB_LOCAL * TP * BF16)              # logits [R, 200064] bf16 gathered
    return {"weights": weights, "kv": kv, "communication": comm, "T": T}


def hand_activations(D: int, C: int, scored_blocks: int, fused: bool, computing: int) -> float:
    """Activations read + written (bf16 unless the GEMM quantises its input to MXFP8)."""
    T, R = D, D
    routed = T * (TOPK + (1 if fused else 0))
    norm4 = 4 * T * H * BF16                                     # fused add+RMSNorm: x, residual in; out, residual out
    gemm = lambda m, n, k, a: m * k * a + m * n * BF16  # noqa: E731
    quant = lambda m, k: m * k * (BF16 + 1) + m * k / 32  # noqa: E731  bf16 in, MXFP8 out + E8M0 scales
    attn_tail = (2 * T * Q_LOCAL * BF16                                                # attention: q in, o out
                 + quant(T, O_K) + gemm(T, H, O_K, MX) + 2 * 2 * payload_bytes(T) + norm4)   # o_proj; 2 all-reduces
    per_sparse = (norm4 + quant(T, H) + gemm(T, SPARSE_QKV, H, MX)
                  + 2 * T * (Q_LOCAL + KV_LOCAL + IDX_Q_LOCAL + IDX_K) * BF16          # qk_norm incl. index q/k
                  + 2 * T * (16 + 1 + 1 + 1) * 64 * BF16                               # rope on 64 of 128 channels
                  + T * (2 * KV_LOCAL + IDX_D) * BF16                                 # cache_write reads k, v, index k
                  + T * IDX_Q_LOCAL * BF16 + scored_blocks * 4                        # indexer: index q in, scores out
                  + scored_blocks * 4 + T * TOPK_BLOCKS * 4                           # topk: scores in, indices out
                  + T * TOPK_BLOCKS * 4 + attn_tail)                                  # attention reads the indices
    per_reuse = (norm4 + quant(T, H) + gemm(T, SPARSE_QKV, H, MX)                      # the same fused GEMM
                 + 2 * T * (Q_LOCAL + KV_LOCAL) * BF16 + 2 * T * (16 + 1) * 64 * BF16  # q/k norm and RoPE only
                 + T * 2 * KV_LOCAL * BF16                                            # K and V written, no index key
                 + T * TOPK_BLOCKS * 4 + attn_tail)
    per_dense_attn = (norm4 + quant(T, H) + gemm(T, DENSE_QKV, H, MX) + 2 * T * (Q_LOCAL + KV_LOCAL) * BF16
                      + 2 * T * (16 + 1) * 64 * BF16 + T * 2 * KV_LOCAL * BF16 + attn_tail)
    rows = EXPERTS + (1 if fused else 0)
    moe = (T * H * FP32 + T * EXPERTS * FP32                                     # router: fp32 input and logits
           + routed * 4 + routed * 4 + (rows + 1) * 4                            # moe_align: ids in, sorted rows out
           + quant(T, H) + gemm(routed, 2 * EXPERT_I, H, MX) + 3 * routed * EXPERT_I * BF16
           + quant(routed, EXPERT_I) + gemm(routed, H, EXPERT_I, MX)
           + routed * H * BF16 + routed * FP32 + T * H * BF16)                   # moe_sum: weighted top-k combine
    if not fused:                                                                # the shared expert's own MLP
        moe += (quant(T, H) + gemm(T, 2 * SHARED_I, H, MX) + 3 * T * SHARED_I * BF16
                + quant(T, SHARED_I) + gemm(T, H, SHARED_I, MX))
    dense_mlp = (quant(T, H) + gemm(T, 2 * DENSE_I // TP, H, MX) + 3 * T * DENSE_I // TP * BF16
                 + quant(T, DENSE_I // TP) + gemm(T, H, DENSE_I // TP, MX))
    edges = (T * H * BF16 + T * 8 + 2 * payload_bytes(T)                                      # embedding + its all-reduce
             + 3 * T * H * BF16 + gemm(R, VOCAB_LOCAL, H, BF16) + R * VOCAB_LOCAL * TP * BF16)  # final norm, head, gather
    return (computing * per_sparse + (SPARSE - computing) * per_reuse + SPARSE * moe
            + DENSE * (per_dense_attn + dense_mlp) + edges)


def payload_bytes(T: int) -> float:
    return T * H * BF16


@pytest.fixture(scope="module")
def m3():
    return load_model("minimax-m3")


@pytest.mark.parametrize("case", sorted(CASES))
def test_hand_count_matches_optable_planes(m3, case):
    fused, computing = CASES[case]
    rng = random.Random()
    D, C = rng.randint(1024, 1536), rng.randint(2500, 20000)   # D >= 1024: every expert touched
    model = m3.with_index_sharing(4) if computing < SPARSE else m3
    ot = build_optable(model, ParallelPlan(tp=TP, fused_shared_expert=fused), "mxfp8", EngineStep.decode(D, C))
    got = plane_totals(ot)
    ref = hand_count(D, C, fused, computing)
    norms = ot[ot["kind"] == "norm"]["bytes_weight"].sum()
    assert norms == (2 * L * H + H + L * 2 * HD + computing * 2 * IDX_D) * BF16   # ~1.5 MB/GPU of norm weights
    quants = {"qkv_proj_quant", "o_proj_quant", "gate_up_proj_quant", "down_proj_quant", "moe_gate_up_quant",
              "moe_down_quant"} | (set() if fused else {"shared_gate_up_quant", "shared_down_quant"})
    assert set(ot[ot["kind"] == "quant"]["op"]) == quants
    assert not ot["op"].str.contains("indexer_q").any()            # no separate indexer GEMM
    for plane in ("weights", "kv", "communication"):
        assert got[plane] == pytest.approx(ref[plane], rel=1e-6), plane
    moe = ot[ot["kind"] == "grouped_gemm"]
    assert moe["experts_active"].round(6).eq(EXPERTS + (1 if fused else 0)).all()
    # all-reduce algorithm factor stated on the rows
    ar = ot[ot["kind"] == "allreduce"]
    assert len(ar) == 2 * L + 1 and np.allclose(ar["comm_factor"], RING) and set(ar["comm_algo"]) == {"ring"}
    cnt = ot[ot["op"] == "indexer"].iloc[0]
    assert (ot["op"] == "indexer").sum() == computing
    scored = (cnt["bytes_compute"] - D * IDX_Q_LOCAL * BF16) / 4
    assert scored == D * ((C - 1) // BLOCK + 1)                # query at position C-1 scores all its blocks
    act = hand_activations(D, C, int(scored), fused, computing)
    assert got["activations"] == pytest.approx(act, rel=1e-6)


def test_byte_planes_views(m3):
    D, C = random.randint(8, 64), random.randint(1000, 9000)
    ot = build_optable(m3, ParallelPlan(tp=TP), "mxfp8", EngineStep.decode(D, C))
    planes = byte_planes(ot, gpus=TP, active_requests=D)
    assert set(planes["plane"]) == {"compute", "persistent", "communication"}
    assert planes["bytes_all_gpus"].sum() == pytest.approx(TP * sum(plane_totals(ot).values()))
    parts = set(planes["part"])
    assert {"weights mxfp8", "weights bf16", "weights fp32", "KV cache", "index-key cache"} <= parts
    assert planes["bytes_per_gpu_per_request"].sum() == pytest.approx(sum(plane_totals(ot).values()) / D)
    costed = cost_optable(ot, load_hardware("mi355x"), "default")
    tbp = time_by_plane(costed)
    assert tbp["us"].sum() == pytest.approx(costed["t_us"].sum())
    with pytest.raises(M3LabError, match="gpus"):
        byte_planes(ot, gpus=0)


def test_pd_kv_handoff(m3):
    import pandas as pd

    isl = random.randint(100, 10000)
    per_layer = pd.DataFrame({"layer": range(L), "part": "main KV", "bytes_per_token_per_rank": 2 * KV_LOCAL * BF16})
    out = pd_kv_handoff(per_layer, isl, TP, link_bw=50e9)
    assert out["bytes_per_rank"].sum() == L * 512 * isl
    assert out["transfer_ms"].sum() == pytest.approx(L * 512 * isl / 50e9 * 1e3)


# --- bytes read and written per op (m3lab planes) -------------------------------------------------------------
MODELS_FOR_SPLIT = ["minimax-m3", "deepseek-v3", "qwen3.5-397b-a17b", "glm-5.2", "llama-3.1-8b", "mixtral-8x7b"]


@pytest.mark.parametrize("model", MODELS_FOR_SPLIT)
def test_every_row_says_what_it_writes_and_the_split_adds_up(model):
    from m3lab.analysis.byte_planes import op_planes, planes_totals
    for step in (EngineStep.decode(8, 4096), EngineStep.prefill(512, batch=2, past=1024)):
        t = build_optable(model, ParallelPlan(tp=4), "mxfp8", step)
        ops = op_planes(t)   # raises on a row that moves a plane's bytes without its written part
        for written, total in (("bytes_compute_written", "bytes_compute"), ("bytes_kv_written", "bytes_kv")):
            assert (t[written].fillna(0) <= t[total].fillna(0) + 1e-6).all()
        hbm = ops[ops["plane"] != "communication"]
        assert np.allclose(hbm["bytes_read"] + hbm["bytes_written"], hbm["bytes"])
        assert ops.loc[ops["plane"] == "communication", ["bytes_read", "bytes_written"]].isna().all().all()
        tot = planes_totals(ops).set_index("plane")["bytes"]
        assert tot["compute"] == pytest.approx(t["bytes_compute"].sum())
        assert tot["persistent"] == pytest.approx(t["bytes_weight"].sum() + t["bytes_kv"].sum())
        assert ops["flops"].sum() == pytest.approx(t["flops"].sum())


@pytest.mark.parametrize("preset", ["mxfp8-tp4-optimised", "h200-bf16-tp4"])
def test_the_rows_of_vllms_dispatch_say_what_they_write(preset):
    """The OpTable the cost follows (vLLM's dispatch: the routing top-k and the sparse page-table rows too)."""
    from m3lab.analysis.byte_planes import op_planes
    from m3lab.serving.dispatch import dispatch_for
    from m3lab.spec.serving import make_deployment
    d = make_deployment(preset)
    for step in (EngineStep.decode(8, 4096), EngineStep.prefill(512, batch=2, past=1024)):
        t = build_optable(d.model, d.plan, d.quant, step, None, dispatch_for(d))
        ops = op_planes(t)
        assert "routing" in set(t["op"]) and ("page_table" in set(t["op"])) == (preset == "mxfp8-tp4-optimised")
        new = ops[ops["op"].isin(["routing", "page_table"]) & (ops["plane"] == "compute")]
        assert (new["bytes_written"] > 0).all() and (new["bytes_read"] > 0).all()
        for written, total in (("bytes_compute_written", "bytes_compute"), ("bytes_kv_written", "bytes_kv")):
            assert (t[written].fillna(0) <= t[total].fillna(0) + 1e-6).all()


def test_written_bytes_are_the_outputs_a_hand_count_gives():
    from m3lab.analysis.byte_planes import op_planes
    T = 8
    ops = op_planes(build_optable("minimax-m3", ParallelPlan(tp=4), "mxfp8", EngineStep.decode(T, 4096)))
    row = ops[(ops["op"] == "qkv_proj") & (ops["plane"] == "compute")].iloc[0]
    assert row["bytes_written"] == (DENSE * T * DENSE_QKV + SPARSE * T * SPARSE_QKV) * BF16   # y [T, N] bf16
    row = ops[(ops["op"] == "cache_write") & (ops["plane"] == "persistent")].iloc[0]
    assert row["bytes_read"] == 0 and row["bytes_written"] == L * T * 2 * KV_LOCAL * BF16 + SPARSE * T * IDX_D * BF16
    weights = ops[ops["part"].str.startswith("weights")]
    assert (weights["bytes_written"] == 0).all() and (weights["bytes_read"] > 0).all()


def test_a_row_without_its_written_part_is_refused(monkeypatch):
    from m3lab.analysis.byte_planes import op_planes
    from m3lab.optable import ops as row_formulas
    real = row_formulas.gemm

    def gemm_forgetting_writes(*a, **kw):
        r = real(*a, **kw)
        r.pop("bytes_compute_written")
        return r
    monkeypatch.setattr(row_formulas, "gemm", gemm_forgetting_writes)
    t = build_optable("minimax-m3", ParallelPlan(tp=4), "mxfp8", EngineStep.decode(2, 1024))
    with pytest.raises(ValueError, match="lm_head"):
        op_planes(t)
