"""Sparse-attention kernels (CPU interpreter, fp32/fp16) vs a dense masked reference on both real KV layouts
(vLLM's Triton [NB, Hkv, block, 2 D] and AITER's page-16 views through the page adapter): several requests of
different lengths, partial tail blocks, contexts shorter than 16 blocks, decode, 1 + k verification rows,
prefill chunks, fp8 KV with scalar scales, block tables in random physical order, NaN in unwritten slots."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.gates.checks import rel_rms  # noqa: E402
from m3lab.gates.sparse import FP8, attention_ref, paged_problem, selection_ref  # noqa: E402
from m3lab.kernels.indexer import launcher as index_launcher  # noqa: E402
from m3lab.kernels.sparse_attn import launcher, reference  # noqa: E402
from m3lab.model import attention as model_attention  # noqa: E402
from m3lab.model.kv_cache import LAYOUTS  # noqa: E402

CPU = torch.device("cpu")
SMALL = dict(block=32, kv_heads=2, group=3, head_dim=32, index_dim=32, device=CPU)
CASES = [([37, 200, 9], 1), ([150, 70], 3), ([70, 40], 6)]


def _problem(lens, q_len, dtype=torch.float32, kv_dtype=None):
    return paged_problem(lens, [q_len] * len(lens), dtype=dtype, kv_dtype=kv_dtype, **SMALL)


def _scales(fp8):
    return (torch.tensor([0.6]), torch.tensor([1.4])) if fp8 else (None, None)


def _page16(p, blocks, **kw):
    k16, v16, stride = reference.aiter_page16_cache(p.k_blocks, p.v_blocks)
    tables = [reference.sparse_page_table_ref(blocks[h], p.block_tables, p.row_req, p.q_pos, block_size=p.block,
                                              block_page_stride=stride) for h in range(blocks.shape[0])]
    out = torch.full_like(p.q, float("nan"))
    return launcher.page16_attention(p.q, k16, v16, torch.stack([t for t, _ in tables]),
                                     torch.stack([c for _, c in tables]), scale=p.scale, block_size=p.block,
                                     out=out, **kw)


def _triton(p, blocks, **kw):
    kp, vp = reference.triton_planes(reference.triton_kv_cache(p.k_blocks, p.v_blocks))
    out = torch.full_like(p.q, float("nan"))
    return launcher.sparse_attention(p.q, kp, vp, blocks, p.block_tables, p.seq_lens, p.cu_seqlens_q,
                                     scale=p.scale, out=out, **kw)


@pytest.mark.parametrize("layout", ["triton", "page16"])
@pytest.mark.parametrize("lens,q_len", CASES)
@pytest.mark.parametrize("fp8", [False, True])
def test_matches_dense_masked_reference(layout, lens, q_len, fp8):
    p = _problem(lens, q_len, kv_dtype=FP8 if fp8 else None)
    blocks = selection_ref(p, topk=4)
    ks, vs = _scales(fp8)
    out = (_triton if layout == "triton" else _page16)(p, blocks, k_scale=ks, v_scale=vs)
    ref = attention_ref(p, blocks, 0.6 if fp8 else 1.0, 1.4 if fp8 else 1.0)
    assert rel_rms(out, ref) < 1e-5


@pytest.mark.parametrize("split", [1, 2, 4])
def test_every_split_gives_the_same_answer(split):
    p = _problem([200, 90], 2)
    blocks = selection_ref(p, topk=4)
    assert rel_rms(_triton(p, blocks, split=split), attention_ref(p, blocks)) < 1e-5
    assert rel_rms(_page16(p, blocks, split=split), attention_ref(p, blocks)) < 1e-5


def test_ragged_padded_and_uniform_rows():
    """Requests of different row counts, a padded batch (an upper-bound max_q_len, rows past cu[-1]) and the
    uniform contract (T = R * max_q_len, no cu_seqlens_q read) all match the reference; the contract is checked."""
    p = paged_problem([150, 70, 33], [3, 1, 2], dtype=torch.float32, **SMALL)
    blocks = selection_ref(p, topk=4)
    assert rel_rms(_triton(p, blocks), attention_ref(p, blocks)) < 1e-5
    p = paged_problem([90, 200], [2, 2], dtype=torch.float32, **SMALL)
    blocks = selection_ref(p, topk=4)
    assert rel_rms(_triton(p, blocks, uniform_rows=True, max_q_len=2), attention_ref(p, blocks)) < 1e-5
    p = paged_problem([90, 200, 40], [1, 1, 1], dtype=torch.float32, **SMALL)       # 3 real rows, padded to 6
    blocks = selection_ref(p, topk=4)
    pad = lambda x: torch.cat([x, torch.randn_like(x)])  # noqa: E731
    kp, vp = reference.triton_planes(reference.triton_kv_cache(p.k_blocks, p.v_blocks))
    got = launcher.sparse_attention(pad(p.q), kp, vp, torch.cat([blocks, blocks], 1), p.block_tables, p.seq_lens,
                                    p.cu_seqlens_q, scale=p.scale, max_q_len=2)
    assert rel_rms(got[:3], attention_ref(p, blocks)) < 1e-5
    with pytest.raises(ValueError, match="uniform_rows"):
        launcher.sparse_attention(pad(p.q), kp, vp, torch.cat([blocks, blocks], 1), p.block_tables, p.seq_lens,
                                  p.cu_seqlens_q, scale=p.scale, max_q_len=1, uniform_rows=True)


def test_fp16_queries():
    p = _problem([130, 64], 2, dtype=torch.float16)
    blocks = selection_ref(p, topk=4)
    assert rel_rms(_triton(p, blocks), attention_ref(p, blocks)) < 2e-3


def test_unused_slots_and_foreign_blocks_are_ignored():
    """-1 entries and blocks after the row's own block (a shared top-k of another token) contribute nothing."""
    p = _problem([200], 1)
    blocks = selection_ref(p, topk=4)
    messy = torch.cat([blocks, torch.full_like(blocks[..., :2], -1), torch.full_like(blocks[..., :1], 7)], -1)
    assert rel_rms(_triton(p, messy), attention_ref(p, blocks)) < 1e-5


def test_page_table_rows_pack_full_blocks_then_the_tail():
    p = paged_problem([100], [2], block=32, kv_heads=1, group=2, head_dim=32, index_dim=32,
                      dtype=torch.float32, device=CPU)
    sel = index_launcher.indexer_topk(p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, topk=3,
                                      emit_page_table=True)
    table, ctx = reference.sparse_page_table_ref(sel.topk[0], p.block_tables, p.row_req, p.q_pos, block_size=32,
                                                 block_page_stride=4)
    assert torch.equal(sel.table[0], table) and torch.equal(sel.ctx[0], ctx)
    for t, pos in enumerate(p.q_pos.tolist()):
        own = pos // 32
        tail = int(p.block_tables[0, own]) * 4
        assert table[t, 4:6].tolist() == [tail, tail + 1]        # 2 full blocks (2 pages each), then the tail
        assert int(ctx[t]) == 2 * 32 + pos + 1 - own * 32


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fast_path_equals_the_model_reference_on_every_cache_layout(layout):
    p = _problem([150, 60], 2)
    nb = p.k_blocks.shape[0]
    lay = LAYOUTS[layout]
    cache = torch.zeros(lay.shape(nb, 32, 2, 32))
    slots = torch.arange(nb * 32)
    lay.write(cache, slots // 32, slots % 32, p.k_blocks.nan_to_num().flatten(0, 1), p.v_blocks.nan_to_num().flatten(0, 1))
    kp, vp = lay.planes(cache, 2, 32)
    blocks = selection_ref(p, topk=4)
    tables = [p.block_tables[r, :-(-n // 32)].tolist() for r, n in enumerate(p.lens)]
    meta = dict(tables=tables, starts=[n - 2 for n in p.lens], counts=p.q_lens, scale=p.scale)
    args = (p.q, kp, vp, p.block_tables, p.seq_lens, p.cu_seqlens_q, blocks)
    assert rel_rms(launcher.attention_varlen(*args, **meta), model_attention.attention_varlen(*args, **meta)) < 1e-5


def test_reference_page16_views_are_the_model_caches():
    """reference.aiter_page16_cache lays K/V out exactly as the model's "aiter" cache and its page-16 views."""
    from m3lab.model.kv_cache import PagedKVCache
    p = _problem([100], 1)
    nb = p.k_blocks.shape[0]
    cache = PagedKVCache(num_blocks=nb, block_size=32, kv_heads=2, head_dim=32, index_dim=32, sparse=[True],
                         layout="aiter", dtype=torch.float32)
    slots = torch.arange(nb * 32)
    k, v = p.k_blocks.nan_to_num(), p.v_blocks.nan_to_num()
    cache.write(0, slots, k.flatten(0, 1), v.flatten(0, 1))
    k16, v16, stride = reference.aiter_page16_cache(k, v)
    mk, mv = cache.aiter_pages(0)
    assert stride == 2 * 32 // 16 and torch.equal(k16, mk) and torch.equal(v16, mv)


def test_bad_inputs_say_which():
    p = _problem([40], 1, kv_dtype=FP8)
    blocks = selection_ref(p, topk=2)
    with pytest.raises(ValueError, match="scalar k_scale"):
        _triton(p, blocks)
    with pytest.raises(ValueError, match="power of two"):
        _triton(p, blocks, split=3, k_scale=torch.tensor([1.0]), v_scale=torch.tensor([1.0]))


def test_gates_catch_a_wrong_kernel(monkeypatch):
    """The sparse gates fail when the attention is off by 1% or the top-k drops a block."""
    from m3lab.gates import run_gates
    real_attn, real_topk = launcher.sparse_attention, index_launcher.indexer_topk

    def attn(*a, **k):
        return real_attn(*a, **k).mul_(1.01)

    def topk(*a, **k):
        sel = real_topk(*a, **k)
        sel.topk[..., -1] = -1
        return sel
    monkeypatch.setattr(launcher, "sparse_attention", attn)
    monkeypatch.setattr(index_launcher, "indexer_topk", topk)
    df = run_gates("cpu", names=["sparse.attn_triton", "sparse.indexer"], perf=False)
    assert not df["passed"].any(), df[df["passed"]]



def test_split_partials_in_q_dtype_and_no_pdl_off_the_gpu():
    """fp16 queries keep fp16 partials (vLLM's choice; the merge sums them in fp32); programmatic dependent
    launch is only asked for on NVIDIA GPUs of compute capability >= 9."""
    from m3lab.kernels import pdl
    p = _problem([200, 90], 2, dtype=torch.float16)
    blocks = selection_ref(p, topk=4)
    assert rel_rms(_triton(p, blocks, split=4), attention_ref(p, blocks)) < 2e-3
    assert launcher._partials(4, 3, 2, 8, torch.float16, CPU)[0].dtype == torch.float16
    assert not pdl.pdl_enabled(CPU) and pdl.pdl_launch(False) == {} and pdl.pdl_launch(True) == {"launch_pdl": True}
