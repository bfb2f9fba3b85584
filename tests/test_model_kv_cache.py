"""Paged KV cache: layouts, block tables, 16-token pages as views, errors."""
import pytest
import torch

from m3lab.errors import M3LabError
from m3lab.model.kv_cache import LAYOUTS, PagedKVCache


def _cache(layout, block=128, blocks=6):
    return PagedKVCache(num_blocks=blocks, block_size=block, kv_heads=2, head_dim=8, index_dim=4,
                        sparse=[False, True], layout=layout, dtype=torch.float32)


def test_default_layout_is_vllm_shape():
    c = _cache("vllm")
    assert tuple(c.kv[0].shape) == (6, 2, 128, 2, 8)
    assert tuple(c.index[1].shape) == (6, 128, 4) and c.index[0] is None


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


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_128_token_block_is_8_pages_of_16_without_copy(layout):
    c = _cache(layout)
    c.append(0, 256)
    k = torch.randn(256, 2, 8)
    c.write(0, c.slots(0, 0, 256), k, torch.randn(256, 2, 8))
    storage = c.kv[0].untyped_storage().data_ptr()
    for logical in range(2):
        phys = c.tables[0][logical]
        for j in range(8):
            page = c.page(0, 8 * phys + j)
            assert page.untyped_storage().data_ptr() == storage  # a view into the cache, no copy
            assert torch.equal(page, k[logical * 128 + 16 * j: logical * 128 + 16 * (j + 1)])


def test_out_of_blocks_and_unknown_layout_are_clear_errors():
    c = _cache("vllm", block=16, blocks=2)
    with pytest.raises(M3LabError, match="num_blocks"):
        c.append(0, 33)
    with pytest.raises(M3LabError, match="layout"):
        _cache("nope")
