"""vLLM's M3 kernels as the reference model's fast paths: the adapters agree with the references (Triton
interpreter, fp32). The decode sparse attention runs only on a GPU (the interpreter rejects one of its masks);
the H200 capture checks it through the logits of the whole model (traces/dispatch/*.summary.json)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.kernels.moe.reference import swiglu_oai  # noqa: E402
from m3lab.model.attention import attention_varlen, indexer_varlen, topk_blocks  # noqa: E402
from m3lab.model.kv_cache import PagedKVCache  # noqa: E402
from m3lab.model.layers import gemma_rms_norm  # noqa: E402
from m3lab.model.step import plan_step  # noqa: E402
from m3lab.vllm import reference_kernels as rk  # noqa: E402

D, B = 128, 128  # vLLM's kernels are compiled for head_dim 128 and 128-token blocks


@pytest.fixture(autouse=True, scope="module")
def one_autotune_config():
    """The interpreter has no device to benchmark on: keep the first config of vLLM's autotuned top-k kernels."""
    from m3lab.vllm_src.imports import m3_module
    ops = m3_module("common.ops.index_topk")
    tuned = [getattr(ops, k).fn for k in ("_topk_index_kernel", "_topk_index_partial_kernel")]
    saved = [t.configs for t in tuned]
    for t in tuned:
        t.configs = t.configs[:1]
    yield
    for t, c in zip(tuned, saved):
        t.configs = c


def _cache(hkv: int):
    return PagedKVCache(num_blocks=8, block_size=B, kv_heads=hkv, head_dim=D, index_dim=D, sparse=[True],
                        layout="triton", dtype=torch.float32, device="cpu")


def _step(cache, reqs, hkv):
    meta = plan_step(cache, reqs, "cpu")
    t = meta.tokens
    cache.write(0, meta.slots, torch.randn(t, hkv, D), torch.randn(t, hkv, D), torch.randn(t, D))
    varlen = meta.tensors(cache, "cpu")
    lists = {"tables": [cache.tables[s] for s in meta.seqs], "starts": meta.starts, "counts": meta.counts}
    return meta, varlen, lists


def test_triton_layout_planes_are_read_in_place():
    cache = _cache(2)
    kv = rk.triton_kv_cache(cache.k_plane(0), cache.v_plane(0))
    assert kv.data_ptr() == cache.kv[0].data_ptr() and kv.shape == cache.kv[0].shape


def test_prefill_sparse_attention_matches_the_reference():
    cache = _cache(1)
    meta, varlen, lists = _step(cache, [(0, 150), (1, 70)], 1)
    t = meta.tokens
    blocks = torch.full((1, t, 16), -1, dtype=torch.int32)
    blocks[0, :, 0] = 0
    blocks[0, :, 1] = torch.where(meta.positions >= B, 1, -1).to(torch.int32)
    q = torch.randn(t, 16, D)
    ref = attention_varlen(q, cache.k_plane(0), cache.v_plane(0), **varlen, blocks=blocks, **lists, scale=D ** -0.5)
    got = rk.sparse_attention(q, cache.k_plane(0), cache.v_plane(0), **varlen, blocks=blocks, **lists, scale=D ** -0.5)
    assert not got.isnan().any()
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5


def test_decode_indexer_selects_the_reference_blocks():
    cache = _cache(1)
    _step(cache, [(0, 300), (1, 140)], 1)
    meta, varlen, lists = _step(cache, [(0, 1), (1, 1)], 1)
    iq = torch.randn(meta.tokens, 1, D)
    scores = indexer_varlen(iq, cache.index[0], **varlen, **lists, block_size=B)
    ref = topk_blocks(scores, meta.positions, block_size=B, topk=16, local_blocks=1, init_blocks=0)
    got_scores = rk.make_indexer(16, 0, 1)(iq, cache.index[0], **varlen, **lists, block_size=B)
    got = rk.topk_blocks(got_scores, meta.positions, block_size=B, topk=16, local_blocks=1, init_blocks=0)
    assert got.dtype == torch.int32 and got.shape == ref.shape
    for i in range(meta.tokens):
        assert set(got[0, i].tolist()) == set(ref[0, i].tolist())
    with pytest.raises(RuntimeError, match="scores of vLLM's indexer"):
        rk.topk_blocks(scores, meta.positions, block_size=B, topk=16, local_blocks=1, init_blocks=0)


@pytest.mark.parametrize("rows,width", [(7, 300), (3, 6144)])
def test_norm_and_swiglu_match_the_references(rows, width):
    x, w = torch.randn(rows, width), torch.randn(width) * 0.1
    torch.testing.assert_close(rk.gemma_rmsnorm(x, w, 1e-6), gemma_rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-5)
    h = torch.randn(rows, 2 * width) * 4
    torch.testing.assert_close(rk.swiglu_oai(h, 1.702, 7.0, beta=1.0), swiglu_oai(h, alpha=1.702, limit=7.0, beta=1.0),
                               rtol=1e-5, atol=1e-5)
