"""KV hand-off geometry (m3lab.pd.geometry): bytes per request against the model facts, descriptor counts,
coverage, coalescing, vLLM's source-rank rule, bad input."""
import numpy as np
import pytest

from m3lab.errors import M3LabError
from m3lab.pd.geometry import CacheSide, coalesce, pd_plan, request_descriptors, request_plan
from m3lab.pd.ranks import heads_of_rank, rank_pairs
from m3lab.pd.regions import main_region
from m3lab.spec.memory import kv_bytes_per_token
from m3lab.spec.model import ModelSpec, load_model
from m3lab.spec.plan import ParallelPlan

M3 = load_model("minimax-m3")


@pytest.mark.parametrize("tp_p,tp_d", [(4, 4), (2, 4), (4, 8), (8, 4), (1, 2)])
@pytest.mark.parametrize("kv,idx", [("bf16", "bf16"), ("fp8", "bf16"), ("fp8", "fp8")])
def test_bytes_per_request_is_tokens_times_kv_bytes_over_decode_ranks(tp_p, tp_d, kv, idx):
    isl = 8192
    s, _ = pd_plan(M3, tp_p, tp_d, isl, kv_dtype=kv, index_dtype=idx)
    per_rank = kv_bytes_per_token(M3, kv, idx, ParallelPlan(tp=tp_d))
    assert s["bytes_per_request"] == isl * per_rank * tp_d
    if (kv, idx, tp_d) == ("fp8", "fp8", 4):
        assert per_rank == 22_656   # reference §4 table


def test_mixed_layouts_move_the_same_bytes_in_many_more_descriptors():
    same, _ = pd_plan(M3, 2, 4, 8192 + 37, prefill_layout="triton", decode_layout="triton")
    mixed, _ = pd_plan(M3, 2, 4, 8192 + 37, prefill_layout="triton", decode_layout="aiter")
    assert mixed["bytes_per_request"] == same["bytes_per_request"]
    assert mixed["descriptors_per_request"] > 50 * same["descriptors_per_request"]


def test_triton_tp4_one_descriptor_per_block_or_per_layer():
    isl, blocks = 8192, 64
    layers = len(M3.kv_layers) + len(M3.topk_layers)          # main on 60 layers + index keys on 57
    s, table = pd_plan(M3, 4, 4, isl)
    assert s["descriptors_per_request"] == 4 * layers * blocks
    c, _ = pd_plan(M3, 4, 4, isl, tables="contiguous")
    assert c["descriptors_per_request"] == 4 * layers
    assert set(table["region"]) == {"main", "index"} and len(table) == layers


def test_tp4_to_tp8_replicated_heads_each_prefill_rank_feeds_two():
    pairs = rank_pairs(4, 8, 4)
    assert [(s, d) for s, d, _ in pairs] == [(d // 2, d) for d in range(8)]
    s, _ = pd_plan(M3, 4, 8, 8192, bandwidth=50e9)
    assert s["max_bytes_sent_per_prefill_rank"] == 2 * s["max_bytes_received_per_decode_rank"]
    assert s["transfer_s"] == pytest.approx(s["max_bytes_sent_per_prefill_rank"] / 50e9)


def test_descriptors_cover_each_decode_rank_exactly_once():
    m = ModelSpec.mini()
    pre, dec = CacheSide(ParallelPlan(tp=1)), CacheSide(ParallelPlan(tp=2), layout="triton")
    n, src_t, dst_t = 37, [7, 2, 9], [4, 0, 5]
    d = request_descriptors(m, pre, dec, n, src_t, dst_t)
    for (layer, region, rank), g in d.groupby(["layer", "region", "dst_rank"]):
        idx = np.concatenate([np.arange(o, o + n_) for o, n_ in zip(g["dst_offset"], g["length"])])
        assert len(idx) == len(np.unique(idx))
        per_token = (2 * m.head_dim * 2) if region == "main" else m.sparse.index_dim * 2
        assert len(idx) == n * per_token


def test_coalesce_matches_the_contiguous_count():
    m = ModelSpec.mini()
    pre, dec = CacheSide(ParallelPlan(tp=2)), CacheSide(ParallelPlan(tp=2))
    n = 3 * m.sparse.block_size + 5
    d = request_descriptors(m, pre, dec, n, [3, 4, 5, 6], [10, 11, 12, 13])
    plan = request_plan(m, pre, dec, n, tables="contiguous")
    assert len(coalesce(d)) == plan["descriptors"].sum() < len(d)
    assert coalesce(d)["length"].sum() == d["length"].sum()


def test_triton_element_map_matches_vllm_docstring():
    # vllm/models/minimax_m3/common/ops/sparse_attn.py:10-12: [blocks, kv_heads, block, 2*head_dim], K then V
    r = main_region("triton", (0, 1), 16, 32, 2)
    p, h, t, c = np.meshgrid(*[np.arange(n) for n in (2, 2, 16, 32)], indexing="ij")
    assert np.array_equal(r.inner, (h * 16 + t) * 64 + p * 32 + c)
    assert r.block_stride == 2 * 16 * 64


def test_heads_per_rank_follow_vllm():
    assert [heads_of_rank(r, 8, 4) for r in range(8)] == [(0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,)]
    assert heads_of_rank(1, 2, 4) == (2, 3)


def test_source_ranks_match_vllm_nixl_tp_mapping():
    # vllm/distributed/kv_transfer/kv_connector/v1/nixl/tp_mapping.py:79-127 (compute_tp_mapping)
    from types import SimpleNamespace

    from m3lab.vllm_src.imports import vllm_module
    tpm = vllm_module("vllm.distributed.kv_transfer.kv_connector.v1.nixl.tp_mapping")
    for tp_p, tp_d in [(4, 4), (2, 4), (4, 8), (8, 4), (4, 2), (8, 8), (1, 4), (8, 2)]:
        for d in range(tp_d):
            topo = SimpleNamespace(tp_rank=d, tp_size=tp_d, is_mla=False, total_num_kv_heads=4,
                                   dcp_consumer_count=lambda *a: 1)
            theirs = tpm.compute_tp_mapping(topo, tp_p, ()).all_source_ranks
            ours = tuple(sorted({s for s, dd, _ in rank_pairs(tp_p, tp_d, 4) if dd == d}))
            assert ours == tuple(theirs), (tp_p, tp_d, d)


def test_bad_input_names_the_field():
    with pytest.raises(M3LabError) as e:
        pd_plan(M3, 3, 4, 8192)
    assert e.value.field == "prefill_tp"
    m = ModelSpec.mini()
    with pytest.raises(M3LabError) as e:
        request_plan(m, CacheSide(ParallelPlan(tp=1), kv_dtype="fp8"), CacheSide(ParallelPlan(tp=1)), 10)
    assert e.value.field == "kv_dtype"
    with pytest.raises(M3LabError) as e:
        pd_plan(M3, 4, 4, 8192, prefill_layout="nhd")
    assert e.value.field == "layout"
    with pytest.raises(M3LabError) as e:
        pd_plan(M3, 4, 4, 0)
    assert e.value.field == "isl"


def test_per_token_head_scales_add_their_bytes():
    s_scalar, _ = pd_plan(M3, 4, 4, 1000, kv_dtype="fp8")
    s_tok, t = pd_plan(M3, 4, 4, 1000, kv_dtype="fp8", scales="per_token_head")
    assert s_tok["bytes_per_request"] - s_scalar["bytes_per_request"] == 1000 * 4 * 60 * 2 * 1 * 4
    assert {"k_scale", "v_scale"} <= set(t["region"])


@pytest.mark.parametrize("esize", [2, 1])
def test_aiter_element_map_matches_vllm_page16_views(esize):
    # vllm/models/minimax_m3/amd/model.py:857-909: K [phys16, H, D/x, 16, x], V [phys16, H, 16/x, D, x],
    # x = 16 bytes / element size; K pages of block b are 2*(block/16)*b + j, V pages start half a block later
    block, H, D = 32, 2, 32
    x, per = 16 // esize, block // 16
    r = main_region("aiter", (0, 1), block, D, esize)
    p, h, t, c = np.meshgrid(*[np.arange(n) for n in (2, H, block, D)], indexing="ij")
    page = p * per + t // 16
    k = page * H * D * 16 + h * D * 16 + (c // x) * 16 * x + (t % 16) * x + c % x
    v = page * H * D * 16 + h * 16 * D + ((t % 16) // x) * D * x + c * x + (t % 16) % x
    assert np.array_equal(r.inner, np.where(p == 0, k, v))
    assert r.block_stride == 2 * block * H * D


def test_aiter_one_head_per_rank_is_one_run_per_block_two_heads_are_sixteen():
    s44, _ = pd_plan(M3, 4, 4, 8192, prefill_layout="aiter", decode_layout="aiter")
    s24, _ = pd_plan(M3, 2, 4, 8192, prefill_layout="aiter", decode_layout="aiter")
    main_blocks = 4 * 60 * 64
    index_blocks = 4 * 57 * 64
    assert s44["descriptors_per_request"] == main_blocks + index_blocks
    assert s24["descriptors_per_request"] == 16 * main_blocks + index_blocks   # 8 K + 8 V pages per block


def test_index_sharing_reuse_layers_send_no_index_keys():
    # reuse layers skip the index-cache write (vllm/models/minimax_m3/amd/model.py:1024-1101): nothing to send
    shared = M3.with_index_sharing(4)
    full, _ = pd_plan(M3, 4, 4, 4096)
    less, table = pd_plan(shared, 4, 4, 4096)
    assert len(shared.topk_layers) == 15
    assert full["bytes_per_request"] - less["bytes_per_request"] == 4096 * 4 * (57 - 15) * 128 * 2
    assert set(table.loc[table["region"] == "index", "layer"]) == set(shared.topk_layers)
