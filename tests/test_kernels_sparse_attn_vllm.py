"""Against the installed vLLM 0.33.0 (CPU interpreter): the page table our top-k kernel emits equals the one
vLLM's builder (``amd/ops/sparse_pa.py:218-277``) produces for the same selection, and vLLM's own sparse
kernels pass their gates against m3lab's references."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton / vllm kernels are imported

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.gates import run_gates  # noqa: E402
from m3lab.gates.sparse import paged_problem  # noqa: E402
from m3lab.kernels.indexer import launcher  # noqa: E402

CPU = torch.device("cpu")


def _pa():
    from m3lab.gates import interpreter_compat
    from m3lab.vllm_src.imports import m3_module
    assert interpreter_compat.apply()
    return m3_module("amd.ops.sparse_pa")


@pytest.mark.parametrize("lens,q_len", [([300, 2100, 130], 1), ([2500, 700], 3)])
def test_emitted_page_table_equals_vllms_builder(lens, q_len):
    pa = _pa()
    p = paged_problem(lens, [q_len] * len(lens), block=128, kv_heads=1, group=2, head_dim=16, index_dim=16,
                      dtype=torch.float32, device=CPU)
    ours = launcher.indexer_topk(p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, topk=16,
                                 emit_page_table=True)          # K and V pages share a block: stride 16
    # vLLM on ROCm: the block table scaled x2 once per step, then stride 8 (amd/ops/sparse_pa.py:373-396)
    scaled = pa.minimax_m3_rebase_block_table_to_page16(p.block_tables)
    table, ctx = pa.minimax_m3_build_sparse_block_table_decode(ours.topk, scaled, p.seq_lens, q_len, 8)
    assert torch.equal(ours.table[0], table) and torch.equal(ours.ctx[0], ctx)
    table, ctx = pa.minimax_m3_build_sparse_block_table_prefill(ours.topk, p.block_tables, p.row_req.to(torch.int32),
                                                                p.q_pos.to(torch.int32), 16)
    assert torch.equal(ours.table[0], table) and torch.equal(ours.ctx[0], ctx)
    dense = launcher.indexer_topk(p.iq, p.index_cache, p.block_tables, p.seq_lens, p.cu_seqlens_q, topk=16,
                                  emit_page_table=True, block_page_stride=8)   # dense K / V planes
    table, ctx = pa.minimax_m3_build_sparse_block_table_decode(dense.topk, p.block_tables, p.seq_lens, q_len, 8)
    assert torch.equal(dense.table[0], table) and torch.equal(dense.ctx[0], ctx)


def test_vllm_sparse_kernels_pass_their_gates():
    df = run_gates("cpu", names=["vllm.sparse_attn_*", "vllm.amd.index_decode", "vllm.sparse_pa.*"], perf=False)
    assert len(df) >= 7 and df["passed"].all(), df[~df["passed"]].to_dict("records")
