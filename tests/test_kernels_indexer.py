"""Indexer kernels (CPU interpreter, fp32/fp16) vs the plain-torch reference on paged problems: several requests
of different lengths (contexts shorter than 16 blocks, partial tail blocks), decode, 1 + k verification rows and
prefill chunks, fp8 index keys, block tables in random physical order, NaN in every unwritten cache slot."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.gates.sparse import FP8, paged_problem, selection_ref, sorted_ids, block_scores_ref  # noqa: E402
from m3lab.kernels.indexer import launcher  # noqa: E402
from m3lab.model import attention as model_attention  # noqa: E402

CPU = torch.device("cpu")
SMALL = dict(block=16, kv_heads=2, group=2, head_dim=32, index_dim=32, dtype=torch.float32, device=CPU)


def _poisoned(hi, t, topk):
    return launcher.Selection(torch.full((hi, t, topk), -7, dtype=torch.int32))


@pytest.mark.parametrize("lens,q_len,index_dtype", [
    ([37, 200, 9], 1, None),          # decode; 3, 13 and 1 blocks (< topk): dense selection, partial tails
    ([150, 70], 3, None),             # 1 + 2 verification rows, causal among them
    ([70, 33], 8, None),              # prefill chunk
    ([130, 18], 1, FP8),              # fp8 e4m3 index keys
])
def test_topk_matches_reference(lens, q_len, index_dtype):
    p = paged_problem(lens, [q_len] * len(lens), index_dtype=index_dtype, **SMALL)
    out = _poisoned(2, p.q.shape[0], 4)
    got = launcher.indexer_topk(p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, topk=4, shared=out)
    assert got is out
    ref_p = p if index_dtype is None else __import__("dataclasses").replace(p, index_cache=p.index_cache.float())
    assert torch.equal(sorted_ids(got.topk), sorted_ids(selection_ref(ref_p, topk=4)))


def test_scores_are_block_maxima_of_visible_keys():
    p = paged_problem([90, 20], [5, 5], **SMALL)
    scores = launcher.index_scores(p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, n_split=3)
    for r, ref in enumerate(block_scores_ref(p)):
        got = scores[:, p.rows(r), :ref.shape[-1]]
        vis = torch.isfinite(ref)
        assert torch.equal(torch.isfinite(got) & vis, vis)
        assert torch.allclose(got[vis], ref[vis], rtol=1e-5, atol=1e-5)


def test_forced_init_and_local_blocks():
    p = paged_problem([300, 45], [2, 2], **SMALL)
    got = launcher.indexer_topk(p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, topk=5,
                                local_blocks=2, init_blocks=2)
    ref = selection_ref(p, topk=5, local_blocks=2, init_blocks=2)
    assert torch.equal(sorted_ids(got.topk), sorted_ids(ref))
    own = p.q_pos // 16
    for h in range(2):
        for t in range(p.q.shape[0]):
            chosen = set(got.topk[h, t].tolist())
            assert {0, 1, int(own[t]), int(own[t]) - 1} <= chosen


def test_selection_chunks_merge_past_one_sort():
    """More blocks than one selector chunk: the running top-k merges across chunks."""
    p = paged_problem([16 * 40, 16 * 9 + 3], [1, 1], **{**SMALL, "index_dim": 16})
    old = launcher.SELECT_MAX_CHUNK
    launcher.SELECT_MAX_CHUNK = 16
    try:
        got = launcher.indexer_topk(p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, topk=6)
    finally:
        launcher.SELECT_MAX_CHUNK = old
    assert torch.equal(sorted_ids(got.topk), sorted_ids(selection_ref(p, topk=6)))


def test_index_sharing_reuse_runs_nothing_and_computing_layers_write_in_place():
    p = paged_problem([100, 40], [1, 1], **SMALL)
    shared = _poisoned(2, 2, 4)
    first = launcher.indexer_topk(p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, topk=4,
                                  shared=shared)
    snapshot = first.topk.clone()
    other = paged_problem([100, 40], [1, 1], **SMALL)
    reused = launcher.indexer_topk(other.iq, other.index_cache, other.block_tables, other.seq_lens,
                                   other.cu_seqlens_q, topk=4, shared=shared, reuse=True)
    assert reused is shared and torch.equal(reused.topk, snapshot)
    with pytest.raises(ValueError, match="shared"):
        launcher.indexer_topk(p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, topk=4, reuse=True)


def test_fast_paths_equal_the_model_references():
    p = paged_problem([70, 20], [3, 1], **SMALL)
    tables = [p.block_tables[r, :-(-n // 16)].tolist() for r, n in enumerate(p.lens)]
    starts = [n - q for n, q in zip(p.lens, p.q_lens)]
    meta = dict(tables=tables, starts=starts, counts=p.q_lens, block_size=16)
    args = (p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q)
    ref = model_attention.indexer_varlen(*args, **meta)
    got = launcher.indexer_varlen(*args, **meta)
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    assert torch.allclose(got[torch.isfinite(ref)], ref[torch.isfinite(ref)], rtol=1e-5, atol=1e-5)
    kw = dict(block_size=16, topk=3, local_blocks=1, init_blocks=0)
    assert torch.equal(sorted_ids(launcher.topk_blocks(ref, p.q_pos, **kw)),
                       sorted_ids(model_attention.topk_blocks(ref, p.q_pos, **kw)))


def test_bad_shapes_say_which():
    p = paged_problem([40], [1], **SMALL)
    with pytest.raises(ValueError, match="share D"):
        launcher.index_scores(p.iq[..., :16], p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q)
    with pytest.raises(ValueError, match="agree on R"):
        launcher.index_scores(p.iq, p.index_cache, p.block_tables, p.seq_lens[:0], p.cu_seqlens_q)
