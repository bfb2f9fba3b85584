"""vLLM 0.33.0's own M3 sparse-attention, indexer and page-table kernels as gates against m3lab's references.

Imported from the installed vllm (``m3lab.vllm_src.imports``). On CPU they run in the Triton interpreter with fp32
operands (block 128 is vLLM's constant, so head dims are kept small); on a GPU in bf16 with the M3 TP4 shapes.
Under the interpreter, vLLM's autotuned top-k kernels keep only their smallest config (the autotuner needs a
GPU to benchmark) and the interpreter's bool-mask fix is applied (``interpreter_compat``).

Gates (each a vLLM entry point; file:line in vLLM 0.33.0):
- ``vllm.sparse_attn_decode``: ``common/ops/sparse_attn.py:617-738`` (split-K decode + merge; 1 and 1 + k rows;
  fp8 KV with scalar scales);
- ``vllm.sparse_attn_prefill``: ``common/ops/sparse_attn.py:536-614`` (``_gqa_sparse_fwd_kernel``);
- ``vllm.index_score``: ``common/ops/index_topk.py:673-744`` (prefill block-max scores);
- ``vllm.index_topk``: ``common/ops/index_topk.py:747-796`` (prefill bitonic top-k);
- ``vllm.index_decode``: ``common/ops/index_topk.py:877-1021`` (decode score + partial/merge top-k);
- ``vllm.amd.index_score`` / ``vllm.amd.index_topk``: ``amd/ops/index_topk.py:1186-1297`` (prefill);
- ``vllm.amd.index_decode``: ``amd/ops/index_topk.py:1300-1640`` (decode score + fused top-k, optionally
  emitting the page-16 table);
- ``vllm.sparse_pa.build_decode`` / ``build_prefill``: ``amd/ops/sparse_pa.py:218-277`` (the page adapter).
Selections are compared as sets (exact), tables exactly, scores and outputs by relative RMS error.
"""
import os

import torch

from m3lab.arith import ceil_div
from ..kernels.sparse_attn import reference as attn_ref
from ..vllm_src.imports import m3_module
from . import interpreter_compat
from .checks import poison_
from .registry import Case, Gate, register
from .sparse import FP8, PagedProblem, attention_ref, block_scores_ref, paged_problem, selection_ref, sorted_ids

BLOCK = 128   # vLLM's SPARSE_BLOCK_SIZE
TOPK = 16


def _module(name: str):
    interpreter_compat.apply()
    mod = m3_module(name, "the vLLM sparse-attention gates")
    if os.environ.get("TRITON_INTERPRET") == "1":
        _smallest_configs(mod)
    elif torch.cuda.is_available():   # tensor descriptors (amd/ops/index_topk.py) allocate scratch through Triton
        import triton
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    return mod


def _smallest_configs(mod) -> None:
    """Keep one autotune config (the smallest BLOCK_SIZE_K) of every autotuned kernel of a module."""
    from triton.runtime import KernelInterface
    from triton.runtime.autotuner import Autotuner
    for obj in vars(mod).values():
        fn = obj if isinstance(obj, KernelInterface) else None
        while fn is not None and not isinstance(fn, Autotuner):
            fn = getattr(fn, "fn", None)
        if isinstance(fn, Autotuner) and len(fn.configs) > 1:
            fn.configs = [min(fn.configs, key=lambda c: c.kwargs.get("BLOCK_SIZE_K", 0))]


def _setup(device: torch.device) -> dict:
    if device.type == "cuda":
        return dict(block=BLOCK, kv_heads=1, group=16, head_dim=128, index_dim=128, dtype=torch.bfloat16)
    return dict(block=BLOCK, kv_heads=1, group=4, head_dim=32, index_dim=32, dtype=torch.float32)


def _lens(device: torch.device, ql: int) -> list[int]:
    if device.type == "cuda":
        return [9000, 70000, 1500, 130] if ql < 8 else [8192, 3000]
    return [300, 2100, 130] if ql < 8 else [400, 140]


def _dtype(device) -> str:
    return "bfloat16" if device.type == "cuda" else "float32"


def _problem(device, ql, lens=None, **over) -> PagedProblem:
    lens = lens or _lens(device, ql)
    return paged_problem(lens, [ql] * len(lens), device=device, **{**_setup(device), **over})


def _kv_cache(p: PagedProblem) -> torch.Tensor:
    return attn_ref.triton_kv_cache(p.k_blocks, p.v_blocks)


# --- sparse attention -------------------------------------------------------------------------------------------
def _decode_case(device, ql, fp8=False) -> Case:
    def run():
        sa = _module("common.ops.sparse_attn")
        p = _problem(device, ql, kv_dtype=FP8 if fp8 else None)
        blocks = selection_ref(p, topk=TOPK)
        ks = torch.tensor([0.7], device=device) if fp8 else None
        vs = torch.tensor([1.3], device=device) if fp8 else None
        out = poison_(torch.empty_like(p.q))
        sa.minimax_m3_sparse_attn_decode(p.q, _kv_cache(p), blocks, p.block_tables, p.seq_lens, p.k_blocks.shape[2],
                                         p.scale, out, ql, k_scale=ks, v_scale=vs)
        return out, attention_ref(p, blocks, 0.7 if fp8 else 1.0, 1.3 if fp8 else 1.0)
    return Case(f"q={ql}" + (",fp8_kv" if fp8 else ""), _dtype(device), run)


def _prefill_case(device, ql) -> Case:
    def run():
        sa = _module("common.ops.sparse_attn")
        p = _problem(device, ql)
        blocks = selection_ref(p, topk=TOPK)
        out = poison_(torch.empty_like(p.q))
        prefix = p.seq_lens - (p.cu_seqlens_q[1:] - p.cu_seqlens_q[:-1])
        sa.minimax_m3_sparse_attn(p.q, _kv_cache(p), blocks, p.block_tables, p.cu_seqlens_q, p.seq_lens, prefix,
                                  ql, p.k_blocks.shape[2], p.scale, out)
        return out, attention_ref(p, blocks)
    return Case(f"q={ql}", _dtype(device), run)


# --- indexer ----------------------------------------------------------------------------------------------------
def _score_case(device, ql, module) -> Case:
    def run():
        it = _module(module)
        p = _problem(device, ql)
        prefix = p.seq_lens - (p.cu_seqlens_q[1:] - p.cu_seqlens_q[:-1])
        score = it.minimax_m3_index_score(p.iq, p.index_cache, p.block_tables, p.cu_seqlens_q, p.seq_lens, prefix,
                                          ql, max(p.lens), p.iq.shape[1])
        got, ref = [], []
        for r, s in enumerate(block_scores_ref(p)):
            visible = torch.isfinite(s)
            got.append(score[:, p.rows(r), :s.shape[-1]][visible])
            ref.append(s[visible])
        return torch.cat(got), torch.cat(ref)
    return Case(f"q={ql}", "float32", run)


def _topk_case(device, ql, module) -> Case:
    def run():
        it = _module(module)
        p = _problem(device, ql)
        width = max(ceil_div(n, BLOCK) for n in p.lens)
        scores = torch.full((p.iq.shape[1], p.q.shape[0], ceil_div(width, 16) * 16), float("-inf"), device=device)
        for r, s in enumerate(block_scores_ref(p)):
            scores[:, p.rows(r), :s.shape[-1]] = s
        prefix = p.seq_lens - (p.cu_seqlens_q[1:] - p.cu_seqlens_q[:-1])
        out = poison_(torch.empty(p.iq.shape[1], p.q.shape[0], TOPK, dtype=torch.int32, device=device))
        it.minimax_m3_index_topk(scores, p.cu_seqlens_q, prefix, ql, TOPK, 0, 1, out=out)
        return sorted_ids(out), sorted_ids(selection_ref(p, topk=TOPK))
    return Case(f"q={ql}", "int32", run, exact=True)


def _decode_index_case(device, ql, module, table=False) -> Case:
    def run():
        it = _module(module)
        p = _problem(device, ql, None if device.type == "cuda" else [1100])   # interpreter: 256 chunks a request
        t, hi = p.q.shape[0], p.iq.shape[1]
        out = poison_(torch.empty(hi, t, TOPK, dtype=torch.int32, device=device))
        kw = {}
        if table:
            kw = dict(attention_block_table=p.block_tables,
                      sparse_block_table_out=poison_(torch.empty(t, TOPK * 8, dtype=torch.int32, device=device)),
                      sparse_context_lens_out=poison_(torch.empty(t, dtype=torch.int32, device=device)),
                      block_page_stride=16)
        it.minimax_m3_index_decode(p.iq, p.index_cache, p.block_tables, p.seq_lens, max(p.lens), TOPK, 0, 1, hi, ql,
                                   ql, out=out, **kw)
        ref = selection_ref(p, topk=TOPK)
        if not table:
            return sorted_ids(out), sorted_ids(ref)
        tb, cx = attn_ref.sparse_page_table_ref(out[0].cpu(), p.block_tables.cpu(), p.row_req.cpu(), p.q_pos.cpu(),
                                                block_size=BLOCK, block_page_stride=16)
        got = torch.cat([sorted_ids(out)[0].cpu(), kw["sparse_block_table_out"].cpu(),
                         kw["sparse_context_lens_out"].cpu()[:, None]], 1)
        return got, torch.cat([sorted_ids(ref)[0].cpu(), tb, cx[:, None]], 1)
    return Case(f"q={ql}" + (",page_table" if table else ""), "int32", run, exact=True)


# --- the page adapter -------------------------------------------------------------------------------------------
def _build_case(device, ql, kind, stride) -> Case:
    def run():
        pa = _module("amd.ops.sparse_pa")
        p = _problem(device, ql)
        blocks = selection_ref(p, topk=TOPK)
        if kind == "decode":
            tb, cx = pa.minimax_m3_build_sparse_block_table_decode(blocks, p.block_tables, p.seq_lens, ql, stride)
        else:
            tb, cx = pa.minimax_m3_build_sparse_block_table_prefill(
                blocks, p.block_tables, p.row_req.to(torch.int32), p.q_pos.to(torch.int32), stride)
        rt, rc = attn_ref.sparse_page_table_ref(blocks[0].cpu(), p.block_tables.cpu(), p.row_req.cpu(),
                                                p.q_pos.cpu(), block_size=BLOCK, block_page_stride=stride)
        return torch.cat([tb.cpu(), cx.cpu()[:, None]], 1), torch.cat([rt, rc[:, None]], 1)
    return Case(f"q={ql},page_stride={stride}", "int32", run, exact=True)


def _gate(name, cases, doc):
    register(Gate(name, name.removeprefix("vllm."), cases, doc=doc))


_gate("vllm.sparse_attn_decode", lambda d: [_decode_case(d, 1), _decode_case(d, 3), _decode_case(d, 1, fp8=True)],
      "vLLM split-K sparse decode + merge vs the dense masked reference")
_gate("vllm.sparse_attn_prefill", lambda d: [_prefill_case(d, 9 if d.type != "cuda" else 96)],
      "vLLM _gqa_sparse_fwd_kernel vs the dense masked reference")
_gate("vllm.index_score", lambda d: [_score_case(d, 9, "common.ops.index_topk")],
      "vLLM prefill block-max index scores vs index_scores/block_max (visible blocks)")
_gate("vllm.index_topk", lambda d: [_topk_case(d, 9, "common.ops.index_topk")],
      "vLLM prefill top-k vs the reference selection")
_gate("vllm.index_decode", lambda d: [_decode_index_case(d, 1, "common.ops.index_topk"),
                                      _decode_index_case(d, 3, "common.ops.index_topk")],
      "vLLM decode index score + partial/merge top-k vs the reference selection")
_gate("vllm.amd.index_score", lambda d: [_score_case(d, 9, "amd.ops.index_topk")],
      "vLLM (AMD file) prefill index scores vs the reference")
_gate("vllm.amd.index_topk", lambda d: [_topk_case(d, 9, "amd.ops.index_topk")],
      "vLLM (AMD file) prefill top-k vs the reference selection")
_gate("vllm.amd.index_decode", lambda d: [_decode_index_case(d, 1, "amd.ops.index_topk"),
                                          _decode_index_case(d, 3, "amd.ops.index_topk", table=True)],
      "vLLM (AMD file) decode score + fused top-k (+ page-16 table) vs the reference")
_gate("vllm.sparse_pa.build_decode", lambda d: [_build_case(d, 1, "decode", 8), _build_case(d, 3, "decode", 16)],
      "vLLM's decode page-table builder vs sparse_page_table_ref")
_gate("vllm.sparse_pa.build_prefill", lambda d: [_build_case(d, 9, "prefill", 16)],
      "vLLM's prefill page-table builder vs sparse_page_table_ref")
