"""The resolver's attention rules: AITER paged sparse attention, the indexer paths, the page table, the fused
QK-norm/RoPE/insert, the dense layers' backend and CUDA graphs (decisions A1-A8 of the vLLM reference note)."""
from __future__ import annotations

import math

from m3lab.vllm.fastpath_cites import cite as _c
from m3lab.vllm.fastpath_facts import Facts, vllm as _vllm
from m3lab.vllm.fastpath_types import Check, Decision


def pa_refusal(f: Facts) -> Decision | None:
    """A1's start-up refusal: AITER paged sparse attention requested with > 1 KV head per rank and no table emitter."""
    if f.pa_requested and f.kv_heads != 1 and not f.emits_table:
        checks = (*f.aiter_checks(),
                  Check("VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT", int(f.s.shuffle_kv_cache), True, _c("shuffle")),
                  Check("KV heads per rank == 1", f.kv_heads, False, _c("pa_gate")),
                  Check("MSA indexer emits the page table", f"no: {f.msa_reason}", False, _c("msa_probe")))
        return Decision("attention", "sparse", "A1", "aiter_sparse_pa", (), checks, _c("pa_gate"), status="refused",
                        note="vLLM raises ValueError: MiniMax M3 AITER sparse paged attention requires num_kv_heads "
                             f"== 1 per tensor-parallel rank, got {f.kv_heads}, unless the AITER indexer emits the "
                             "attend's page table")
    return None


def attention(f: Facts, kind: str) -> Decision:
    if (refused := pa_refusal(f)) is not None:
        return refused
    p = f.p
    base = [Check("sparse layer (sparse_attention_freq != 0)", True, True)]
    if p.rocm:
        checks = [*base, *f.aiter_checks(),
                  Check("VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT", int(f.s.shuffle_kv_cache), f.s.shuffle_kv_cache, _c("shuffle")),
                  Check("KV heads per rank == 1 or the indexer emits the table",
                        f"{f.kv_heads} head(s), emits={f.emits_table}", f.kv_heads == 1 or f.emits_table, _c("pa_gate"))]
        if f.pa_requested:
            return Decision("attention", kind, "A1", "aiter_sparse_pa", ("pa_decode_gluon (paged_attention_decode_*gluon)",),
                            tuple(checks), _c("pa_decode_gluon"),
                            note="AITER page-16 sparse paged attention (the sparse page adapter): 128-token blocks as "
                                 "8 x 16-token pages, for decode and prefill; every (token, KV head) is one sequence")
        kernels = (("_gqa_sparse_decode_kernel", "_merge_topk_attn_out_kernel") if f.decode
                   else ("_gqa_sparse_fwd_kernel (AMD sub-tiled)",))
        return Decision("attention", kind, "A1", "triton_sparse", kernels, tuple(checks), _c("main_select"),
                        note="AITER paged sparse attention not requested: vLLM's Triton block-sparse GQA kernels")
    sm100 = p.sm >= 100 and f.model.sparse.topk_blocks in (4, 8, 16, 32) and f.kv_cache_dtype != "fp8_e5m2"
    checks = [*base, Check("CUDA SM100 family, topk in (4,8,16,32), KV not e5m2 -> MSA", p.arch, sm100, _c("msa_sm100"))]
    if sm100:
        return Decision("attention", kind, "A1", "msa_sm100", ("fmha_sm100 sparse attend",), tuple(checks),
                        _c("main_select"), note="NVIDIA model on Blackwell: the MSA (fmha_sm100) attend")
    kernels = (("_gqa_sparse_decode_kernel", "_merge_topk_attn_out_kernel") if f.decode else ("_gqa_sparse_fwd_kernel",))
    return Decision("attention", kind, "A1", "triton_sparse", kernels, tuple(checks), _c("main_select"),
                    note="NVIDIA model, not SM100: the common Triton sparse attention (common/ops/sparse_attn.py)")


def indexer(f: Facts, kind: str) -> Decision:
    """A2 (MSA), A3 (Triton), A4 (CP), A5 (reuse layers skip it)."""
    sp = f.model.sparse
    freq_check = Check("index sharing: this layer reuses the last computing layer's top-k",
                       f"index_topk_freq={sp.index_topk_freq}", kind == "sparse_reuse", _c("skip_topk"))
    if kind == "sparse_reuse":
        return Decision("indexer", kind, "A5", "reuse_topk", (), (freq_check,), _c("skip_run"), status="skipped",
                        note="index sharing: no index score or top-k; the attend reads the shared top-k buffer")
    p = f.p
    if p.rocm:
        msa_check = Check("MSA indexer usable (fp8 index cache, gfx950, AITER sparse PA)",
                          f.msa_reason or "yes", f.msa, _c("msa_reason"))
        if f.msa:
            cp = f.plan.indexer_cp and f.tp > 1 and sp.index_heads % f.tp == 0 and sp.index_heads // f.tp == f.kv_heads
            checks = (msa_check, Check("minimax_m3_indexer_cp (MSA-CP)", int(f.plan.indexer_cp), cp, _c("msa_cp")))
            kernels = (("pa_sparse_block_score_decode" if f.decode else "pa_sparse_block_score_prefill"),
                       "pa_sparse_block_topk_cp" if cp and f.decode else "pa_sparse_block_topk")
            return Decision("indexer", kind, "A2" + ("/A4" if cp else ""), "msa_fp8" + ("_cp" if cp else ""), kernels,
                            checks, _c("msa_probe"), note="AITER fp8 MFMA score + top-k; the top-k writes the top-k "
                            "buffer and the attend's page-16 table in one launch")
        if f.index_dtype != "bf16":
            return Decision("indexer", kind, "A2", "refused", (), (msa_check,
                            Check("Triton indexer needs CUDA fp8 for a non-bf16 index cache", f.index_dtype, False,
                                  _c("indexer_select"))), _c("indexer_select"), status="refused",
                            note=f"vLLM raises NotImplementedError: indexer_kv_dtype={f.index_dtype!r} requires CUDA fp8 "
                                 "support (on ROCm an fp8 index cache works only through the MSA indexer)")
        if f.plan.indexer_cp:
            ok = f.tp >= 2
            checks = (msa_check, Check("indexer CP: ROCm, tp > 1, bf16 index cache", f"tp={f.tp}", ok, _c("indexer_cp")))
            if not ok:
                return Decision("indexer", kind, "A4", "refused", (), checks, _c("indexer_cp"), status="refused",
                                note="vLLM raises ValueError: attention_config.minimax_m3_indexer_cp requires ROCm "
                                     "with tensor_parallel_size > 1")
            return Decision("indexer", kind, "A4", "triton_cp", ("_context_score", "_local_topk_keys",
                            "all-gather", "_merge_topk_keys") if f.decode else ("_index_block_score_kernel",
                            "_topk_index_kernel"), checks, _c("indexer_cp"),
                            note="Triton indexer context parallelism: each rank scores a round-robin block shard")
        return _rocm_triton_indexer(f, kind, msa_check)
    fp8_ok = f.index_dtype == "bf16" or p.sm >= 89
    sm100 = p.sm >= 100 and sp.topk_blocks == 16
    checks = (Check("index cache dtype supported (fp8 needs CUDA fp8)", f.index_dtype, fp8_ok, _c("indexer_select")),
              Check("SM100 and topk 16 -> MSA (fmha_sm100)", p.arch, sm100, _c("indexer_sm100")))
    if sm100:
        return Decision("indexer", kind, "A2", "msa_sm100", ("fmha_sm100 sparse_topk_select",), checks,
                        _c("indexer_sm100"), note="NVIDIA model on Blackwell: fmha_sm100 score + top-k")
    kernels = (("_decode_index_score_kernel", "_topk_index_partial_kernel", "_topk_index_merge_kernel") if f.decode
               else ("_index_block_score_kernel", "_topk_index_kernel"))
    return Decision("indexer", kind, "A3", "triton_common", kernels, checks, _c("indexer_triton"),
                    note="the common Triton indexer (common/ops/index_topk.py): what vLLM runs on SM90")


def _rocm_triton_indexer(f: Facts, kind: str, msa_check: Check) -> Decision:
    """A3 on ROCm: AMD Triton kernels; decode score policy and the fused top-k (+ page table under A1)."""
    import torch
    ops = _vllm("vllm.models.minimax_m3.amd.ops.index_topk")
    sp = f.model.sparse
    checks = [msa_check]
    if not f.decode:
        return Decision("indexer", kind, "A3", "triton_amd_prefill", ("_index_block_score_kernel", "_topk_index_kernel"),
                        tuple(checks), _c("indexer_triton"), note="prefill: block-max scores (tensor descriptors) + "
                        "autotuned bitonic top-k")
    bf16 = torch.bfloat16
    budget = ops._decode_score_program_budget(f.requests, sp.index_dim, bf16, bf16, is_gfx950=f.p.gfx950)
    checks.append(Check("balanced score kernel: gfx950, bf16, 1-11 requests", f"{f.requests} requests -> "
                        f"budget {budget}", budget is not None, _c("score_budget")))
    if budget is not None:
        score = "_decode_index_score_balanced_kernel"
    else:
        chunks, high = ops._decode_score_split_launch_policy(f.requests, sp.index_dim, bf16, bf16, is_gfx950=f.p.gfx950)
        checks.append(Check("split-K score (gfx950 high-batch config for 20-64 requests)",
                            f"{chunks} kv chunks, high_batch={high}", True, _c("score_split")))
        score = "_decode_index_score_kernel"
    max_block = math.ceil(f.max_model_len / sp.block_size)
    pol = ops._decode_topk_launch_policy(max_block, f.tokens, f.idx_heads, sp.topk_blocks, is_gfx950=f.p.gfx950)
    checks.append(Check("fused top-k fast policy (gfx950, topk 16, <= 8192 blocks)", f"{pol[0]} chunks x {pol[1]} blocks",
                        pol[4], _c("topk_policy")))
    emit = f.pa_requested
    checks.append(Check("the decode top-k emits the page-16 table (A1 on, no MSA)", int(emit), emit, _c("emit_table")))
    return Decision("indexer", kind, "A3", "triton_amd_fused_topk" + ("_emit_table" if emit else ""),
                    (score, "_decode_topk_fused_kernel"), tuple(checks), _c("indexer_triton"),
                    note="decode: score kernel then one fused 'last arriver merges' top-k" +
                         (" that also writes the attend's page-16 table" if emit else ""))


def page_table(f: Facts, kind: str) -> Decision:
    """Who builds the page-16 table the AITER attend reads (A1 producers, A5 rebuild on reuse layers)."""
    if not f.pa_requested or (f.kv_heads != 1 and not f.emits_table):
        return Decision("page_table", kind, "A1", "none", (), (Check("AITER sparse PA in use", 0, False, _c("pa_requested")),),
                        _c("pa_requested"), status="skipped", note="the Triton attend reads the top-k directly")
    base = (Check("AITER sparse PA in use", 1, True, _c("pa_requested")),)
    if f.emits_table:
        note = ("reuse layer: the attend reads the page-table buffer the last computing layer's MSA top-k wrote"
                if kind == "sparse_reuse" else "emitted by the MSA top-k launch: no separate kernel")
        return Decision("page_table", kind, "A2" if kind != "sparse_reuse" else "A5", "msa_topk_emits",
                        ("(pa_sparse_block_topk)",), base, _c("msa_probe"), status="skipped", note=note)
    if kind != "sparse_reuse" and f.decode:
        return Decision("page_table", kind, "A3", "fused_topk_emits", ("(_decode_topk_fused_kernel)",), base,
                        _c("emit_table"), status="skipped", note="emitted by the fused decode top-k: no separate kernel")
    kernel = "_build_sparse_block_table_kernel" if f.decode else "_build_sparse_block_table_prefill_kernel"
    why = "reuse layer rebuilds the table from the shared top-k" if kind == "sparse_reuse" else "prefill builds it"
    return Decision("page_table", kind, "A1" if kind != "sparse_reuse" else "A5", "triton_builder", (kernel,), base,
                    _c("table_builder" if f.decode else "table_builder_prefill"), note=why)


def qk_norm_rope(f: Facts, kind: str) -> Decision:
    """A6 (sparse layers) and A7's norm part (dense layers)."""
    if kind == "dense":
        return Decision("qk_norm_rope_insert", kind, "A7", "vllm_fused_qknorm_rope", (
            "_C.fused_minimax_m3_qknorm_rope_kv_insert (norm + RoPE)", "attention backend's KV insert"),
            (Check("dense layer", True, True),), _c("dense_qknorm"))
    skip = kind == "sparse_reuse"
    suffix = " (skip_index_branch: no index norm/RoPE/cache write)" if skip else ""
    if f.p.rocm and f.pa_requested and (f.kv_heads == 1 or f.emits_table):
        ok = f.aiter and (f.kv_cache_dtype == "auto" or f.kv_cache_dtype in ("fp8", "fp8_e4m3"))
        checks = (Check("AITER sparse PA in use", 1, True, _c("pa_requested")),
                  Check("fused_qknorm_idxrqknorm_enabled: AITER, KV auto (or fp8 with K/V scales)", f.kv_cache_dtype,
                        ok, _c("fused_qknorm")))
        if ok:
            return Decision("qk_norm_rope_insert", kind, "A6", "aiter_fused_qknorm_idxrqknorm",
                            ("aiter fused_qknorm_idxrqknorm",), checks, _c("fused_qknorm_use"), note="one launch: q/k "
                            "(and index q/k) norm + RoPE + page-16 KV insert" + suffix)
        return Decision("qk_norm_rope_insert", kind, "A6", "vllm_fused_qknorm_rope_aiter_cache", (
            "_C.fused_minimax_m3_qknorm_rope_kv_insert", "aiter reshape_and_cache (asm layout)",
            *(() if skip else ("_insert_index_cache_kernel",))), checks, _c("fused_qknorm_use"), note=suffix.strip())
    return Decision("qk_norm_rope_insert", kind, "A6", "vllm_fused_qknorm_rope_kv_insert",
                    ("_C.fused_minimax_m3_qknorm_rope_kv_insert (norm + RoPE + Triton-layout KV/index insert)",),
                    (Check("AITER sparse PA in use", 0, False, _c("pa_requested")),), _c("fused_qknorm_use"),
                    note=suffix.strip())


def dense_attention(f: Facts) -> Decision:
    """A7: dense layers 0-2 run vLLM's generic Attention; the backend comes from the platform's priority list."""
    if not f.p.rocm:
        return Decision("attention", "dense", "A7", "cuda_default_backend", ("FlashAttention / FlashInfer (platform default)",),
                        (Check("platform", "CUDA", True),), _c("nv_dense_attn"),
                        note="generic vLLM Attention; the CUDA backend choice is not resolved here")
    connector = f.plan.role != "both"
    order = ([] if connector else ["ROCM_ATTN"]) + (["ROCM_AITER_FA"] if f.aiter and f.s.aiter_mha else []) + \
        (["ROCM_AITER_UNIFIED_ATTN"] if f.p.aiter_supported else []) + ["TRITON_ATTN"]
    checks = (Check("KV connector (P/D) drops ROCM_ATTN", connector, True, _c("dense_attn")),
              Check("VLLM_ROCM_USE_AITER_MHA", int(f.s.aiter_mha), f.aiter and f.s.aiter_mha, _c("dense_attn")))
    return Decision("attention", "dense", "A7", order[0].lower(), (f"{order[0]} backend",), checks, _c("dense_attn"),
                    note="priority " + " > ".join(order) + "; vLLM takes the first that supports the config "
                    "(confirm in the start-up log)")


def graphs(f: Facts) -> Decision:
    """A8: FULL graphs for uniform decode; the indexer + attend run under an eager break otherwise."""
    mode = f.s.cudagraph_mode
    full = f.decode and "FULL" in mode
    return Decision("cuda_graphs", "model", "A8", "full" if full else ("piecewise" if mode != "NONE" else "eager"),
                    (), (Check("cudagraph_mode", mode, mode != "NONE"),
                         Check("uniform decode batch (1 + k rows per request)", f.decode, full, _c("graph_uniform"))),
                    _c("eager_break"), note="indexer + attend are inside the FULL graph for uniform decode; in "
                    "PIECEWISE capture they run eagerly (@eager_break_during_capture)")
