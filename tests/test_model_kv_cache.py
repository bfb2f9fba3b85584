"""Paged KV cache in vLLM's layouts: the Triton [blocks, H, 128, 2D] cache and AITER's page-16 views."""
import pytest
import torch

from m3lab.errors import M3LabError
from m3lab.model.kv_cache import DEFAULT_LAYOUT, LAYOUTS, PagedKVCache


def _cache(layout, block=128, blocks=6, heads=2, dim=8, dtype=torch.float32):
    return PagedKVCache(num_blocks=blocks, block_size=block, kv_heads=heads, head_dim=dim, index_dim=4,
                        sparse=[False, True], layout=layout, dtype=dtype)


def test_layouts_are_vllms():
    assert set(LAYOUTS) == {"triton", "aiter"} and DEFAULT_LAYOUT == "triton"
    c = _cache("triton")   # common/ops/sparse_attn.py:10-12: (num_blocks, num_kv_heads, 128, 2 * head_dim)
    assert tuple(c.kv[0].shape) == (6, 2, 128, 16)
    assert tuple(c.index[1].shape) == (6, 128, 4) and c.index[0] is None   # index keys [blocks, 128, index_dim]
    a = _cache("aiter")    # two head slots per block, K then V (FullAttentionSpec num_head_slots=2, LBHNC)
    assert tuple(a.kv[0].shape) == (6, 2, 128, 16)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_write_gather_roundtrip_through_block_table(layout):
    c = _cache(layout, block=16, blocks=8)
    c.append(7, 5)  # another sequence takes the first block
    start = c.append(3, 40)
    assert start == 0 and len(c.tables[3]) == 3
    k, v, ik = torch.randn(40, 2, 8), torch.randn(40, 2, 8), torch.randn(40, 4)
    c.write(1, c.slots(3, 0, 40), k, v, ik)
    gk, gv = c.gather(1, 3, 40)
    assert torch.equal(gk, k) and torch.equal(gv, v)
    assert torch.equal(c.gather_index(1, 3, 40), ik)
    assert c.append(3, 10) == 40  # decode continues after the prefill


def test_triton_layout_k_then_v_in_the_last_axis():
    c = _cache("triton", block=16, blocks=4)
    c.append(0, 20)
    k, v = torch.randn(20, 2, 8), torch.randn(20, 2, 8)
    c.write(0, c.slots(0, 0, 20), k, v)
    phys = c.tables[0][1]
    assert torch.equal(c.kv[0][phys, 1, 3, :8], k[19, 1]) and torch.equal(c.kv[0][phys, 1, 3, 8:], v[19, 1])


@pytest.mark.parametrize("dtype, x", [(torch.float32, 4), (torch.bfloat16, 8)])
def test_aiter_page16_views_address_the_written_tokens(dtype, x):
    """K page [H, D/x, 16, x], V page [H, 16/x, D, x]; page id 2*(block/16)*b + j names the same 16 tokens in
    both views (amd/model.py:857-909), written by index arithmetic independent of the cache code."""
    heads, dim, block = 2, 16, 32
    c = _cache("aiter", block=block, blocks=5, heads=heads, dim=dim, dtype=dtype)
    c.append(9, 3)
    c.append(0, 70)
    k, v = torch.randn(70, heads, dim).to(dtype), torch.randn(70, heads, dim).to(dtype)
    c.write(0, c.slots(0, 0, 70), k, v)
    kp, vp = c.aiter_pages(0)
    assert kp.data_ptr() == c.kv[0].data_ptr() and vp.untyped_storage().data_ptr() == c.kv[0].untyped_storage().data_ptr()
    per_block = block // 16
    assert tuple(kp.shape) == (2 * 5 * per_block, heads, dim // x, 16, x)
    assert tuple(vp.shape) == (2 * 5 * per_block - per_block, heads, 16 // x, dim, x)
    for p in range(70):
        b, o = c.tables[0][p // block], p % block
        page, t = 2 * per_block * b + o // 16, o % 16
        for h in range(heads):
            for d in range(dim):
                assert kp[page, h, d // x, t, d % x] == k[p, h, d]
                assert vp[page, h, t // x, d, t % x] == v[p, h, d]


def test_out_of_blocks_and_unknown_layout_are_clear_errors():
    c = _cache("triton", block=16, blocks=2)
    with pytest.raises(M3LabError, match="num_blocks"):
        c.append(0, 33)
    for bad in ("nope", "vllm", "kv_split"):
        with pytest.raises(M3LabError, match="layout"):
            _cache(bad)
    with pytest.raises(M3LabError, match="aiter"):
        _cache("triton").aiter_pages(0)


@pytest.mark.skipif(not __import__("m3lab.vllm_src.install", fromlist=["available"]).available(),
                    reason="vLLM 0.33.0 not installed")
def test_aiter_pages_follow_vllms_page_table_rebase():
    """vLLM's own page arithmetic (amd/ops/sparse_pa.py): the K/V views count as interleaved sides (16 page ids
    per 128-token block) and a rebased block table page id reaches the written token in both views."""
    from m3lab.vllm_src.imports import m3_module

    sp = m3_module("amd.ops.sparse_pa")
    c = _cache("aiter", block=128, blocks=3, heads=1, dim=128, dtype=torch.bfloat16)
    c.append(5, 1)
    c.append(0, 200)
    k, v = torch.randn(200, 1, 128).to(torch.bfloat16), torch.randn(200, 1, 128).to(torch.bfloat16)
    c.write(0, c.slots(0, 0, 200), k, v)
    kp, vp = c.aiter_pages(0)
    assert sp.minimax_m3_sparse_block_page_stride(kp, vp) == 2 * sp.PAGES_PER_SPARSE_BLOCK
    table = sp.minimax_m3_rebase_block_table_to_page16(torch.tensor([c.tables[0]], dtype=torch.int32))[0]
    x = 16 // 2
    for p in (0, 15, 16, 127, 128, 199):
        page = int(table[p // 128]) * sp.PAGES_PER_SPARSE_BLOCK + (p % 128) // 16
        t = p % 16
        assert torch.equal(kp[page, 0].permute(1, 0, 2).reshape(16, 128)[t], k[p, 0])
        assert torch.equal(vp[page, 0, t // x, :, t % x], v[p, 0])
