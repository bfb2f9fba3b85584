"""Which cost source costs the kernel vLLM runs: the one table from the fast-path resolver's path ids
(``m3lab.vllm.fastpaths``: ``Decision.path``) to the cost sources of :mod:`m3lab.cost.sources`.

:data:`PATH_COST` maps a path id to a source, or, where one decision runs several OpTable rows (a quantiser and its
GEMM, the rows inside one fused MoE call), to ``{OpTable op or kind: source, "*": default}``. A path whose decision
has no OpTable row of its own (graph mode, a fusion vLLM turned off, the monokernel's status) maps to ``"none"``.
Rows without a decision (no Dispatch, or an op the resolver does not decide: the embedding, the logits gather)
take :data:`KIND_COST` by their kind. When the resolver gains a path, it gets one line here (a test resolves a
grid of deployments and fails on a path without one).
"""
from __future__ import annotations

from typing import Mapping

from m3lab.errors import M3LabError

_GEMM = {"quant": "elementwise", "*": None}   # template: a quantised GEMM decision = quantiser + GEMM


def _gemm(source: str) -> dict:
    return {**_GEMM, "*": source}


_MOE_INSIDE = {"moe_align": "inside", "moe_gate_up_quant": "inside", "moe_act": "inside", "moe_down_quant": "inside",
               "moe_sum": "inside"}
_QK_ONE_KERNEL = {"rope": "fused", "cache_write": "fused", "*": "elementwise"}
_QK_CACHE_APART = {"rope": "fused", "*": "elementwise"}
NO_ROWS = "none"   # a decision with no OpTable row of its own (graph mode, the monokernel's refusal, fusion off)

# path id (m3lab.vllm.fastpaths) -> cost source, or {OpTable op / kind: source, "*": default}
PATH_COST: Mapping[str, object] = {
    # G2: MXFP8 linears (quantiser + Triton dot_scaled GEMM)
    "mxfp8_dot_scaled_decode": _gemm("dot_scaled_decode"), "mxfp8_dot_scaled_prefill": _gemm("dot_scaled_prefill"),
    "mxfp8_bf16_emulation": _gemm("bf16_untuned"), "marlin_mxfp8": _gemm("generic_gemm"),
    # G1: BF16 linears
    "aiter_tgemm": "aiter_bf16", "aiter_triton_gemm": "aiter_bf16", "hipblaslt": "bf16_untuned",
    "skinny_wvsplitk": "bf16_untuned", "skinny_wvsplitkrc": "bf16_untuned", "skinny_llmm1": "bf16_untuned",
    "cublas": "generic_gemm",
    # G3: router GEMM
    "rocm_bf16x3": "bf16x3", "rocm_fp32_router_gemm": "small_kernel", "fp32_router_gemm": "small_kernel",
    "fp32_linear": "small_kernel",
    # M1: routing top-k (+ fusion status rows)
    "topk_bias_router": "small_kernel", "topk_bias_router_cat_shared": "small_kernel",
    "aiter_biased_grouped_topk": "small_kernel", "aiter_biased_grouped_topk_fse": "small_kernel",
    "fse_off": NO_ROWS,
    # M2: experts (every MoE row runs inside the fused call the source times)
    "aiter_mxfp8_flydsl": {**_MOE_INSIDE, "*": "aiter_moe"}, "aiter_ck_fused_moe": {**_MOE_INSIDE, "*": "aiter_moe"},
    "aiter_mxfp4_mxfp4": {**_MOE_INSIDE, "*": "aiter_moe"},
    "triton_mxfp8_native": {**_MOE_INSIDE, "*": "triton_moe"}, "triton_fused_moe": {**_MOE_INSIDE, "*": "triton_moe"},
    "mxfp8_emulation": {**_MOE_INSIDE, "*": "triton_moe"}, "marlin": {**_MOE_INSIDE, "*": "triton_moe"},
    # the OCP MX emulation: every local expert's weights dequantised to BF16 (its own launch), then the BF16 fused MoE
    "mxfp4_emulation": {**_MOE_INSIDE, "quant": "elementwise", "*": "triton_moe"},
    # M3: the monokernel: one persistent launch runs the rows of the ops it replaces (the stock-layer case has no
    # rows of its own)
    "mono_ffn": "monokernel", "stock_layers": NO_ROWS,
    # A1 / A7: attention
    "triton_sparse": "sparse_attention", "aiter_sparse_pa": "aiter_pa", "msa_sm100": "sparse_attention",
    "rocm_attn": "dense_attention", "rocm_aiter_unified_attn": "dense_attention",
    "triton_attn": "dense_attention", "flash_attn": "dense_attention", "flashinfer": "dense_attention",
    # A2-A5: indexer (its top-k row runs inside the measured indexer time)
    "triton_amd_fused_topk": {"topk": "inside", "*": "indexer"},
    "triton_amd_fused_topk_emit_table": {"topk": "inside", "*": "indexer"},
    "triton_amd_prefill": {"topk": "inside", "*": "indexer"}, "triton_common": {"topk": "inside", "*": "indexer"},
    "triton_cp": {"topk": "inside", "*": "indexer"},
    "msa_fp8": {"topk": "inside", "*": "msa_indexer"}, "msa_fp8_cp": {"topk": "inside", "*": "msa_indexer"},
    "reuse_topk": NO_ROWS,
    # page-16 table producers (A1-A5): a builder kernel, or written by an indexer launch that is costed already
    # (the MSA top-k, the fused decode top-k, the Triton-CP merge _merge_topk_keys), or none (Triton attend)
    "triton_builder": "elementwise", "fused_topk_emits": NO_ROWS, "msa_topk_emits": NO_ROWS,
    "cp_merge_emits": NO_ROWS, "none": NO_ROWS,
    # A6 / A7: q/k norm + RoPE + cache insert
    "vllm_fused_qknorm_rope_kv_insert": _QK_ONE_KERNEL, "aiter_fused_qknorm_idxrqknorm": _QK_ONE_KERNEL,
    "vllm_fused_qknorm_rope_aiter_cache": _QK_CACHE_APART, "vllm_fused_qknorm_rope": _QK_CACHE_APART,
    # N1-N3: norms, all-reduces, activations
    "triton_gemma_rmsnorm": "elementwise", "flashinfer_gemma_rmsnorm": "elementwise", "norm_only": "elementwise",
    "allreduce_then_norm": {"post_attn_norm": "elementwise", "*": "rccl"},
    "flashinfer_fused_ar_norm": {"post_attn_norm": "fused", "*": "custom_ar"},
    "aiter_fused_ar_rmsnorm": {"post_attn_norm": "fused", "*": "custom_ar"},
    "flashinfer_fused_ar_norm_or_nccl": {"post_attn_norm": "fused", "*": "custom_ar"},
    "triton_swiglu_oai": "elementwise", "silu_and_mul_with_clamp": "elementwise",
    # A8: CUDA graphs decide launch overhead on the host (the host-time hook), no rows
    "full": NO_ROWS, "piecewise": NO_ROWS, "eager": NO_ROWS,
    "refused": NO_ROWS,
}
# rows without a decision: by kind (ops vLLM's AMD model runs inside a neighbour's kernel: "fused")
KIND_COST: Mapping[str, str] = {
    "gemm": "generic_gemm", "lm_head": "generic_gemm", "grouped_gemm": "generic_moe",
    "attention": "generic_attention", "indexer": "generic_attention", "linear_attention": "generic_attention",
    "norm": "elementwise", "rope": "elementwise", "activation": "elementwise", "cache_write": "elementwise",
    "quant": "elementwise", "moe_sum": "elementwise", "conv": "elementwise", "embedding": "elementwise",
    "page_table": "elementwise", "topk": "small_kernel", "router": "small_kernel", "moe_align": "small_kernel",
    "allreduce": "custom_ar", "allgather": "collective", "all2all": "collective",
}
UNRESOLVED_FUSED = frozenset({"post_attn_norm", "rope", "cache_write", "topk", "moe_act"})
# one path whose rows run a kernel the decision names among others: (path, source) -> (words of the decision's
# kernel, source). ``allreduce_then_norm`` all-reduces with whatever the TP communicator holds (AITER's custom
# all-reduce when VLLM_ROCM_USE_AITER=1: vllm/distributed/device_communicators/cuda_communicator.py)
KERNEL_COST: Mapping[tuple[str, str], tuple[str, str]] = {
    ("allreduce_then_norm", "rccl"): ("custom all-reduce", "custom_ar"),
}


def source_of(op: str, kind: str, path, kernel=None) -> str:
    """The cost source of one row (see the module docstring); ``kernel``: the decision's kernels (the OpTable's
    ``kernel``), which :data:`KERNEL_COST` reads where one path runs different kernels."""
    if isinstance(path, str) and path:
        entry = PATH_COST.get(path)
        if entry is None:
            raise M3LabError(f"no cost source for vLLM path {path!r} (op {op})", field="path",
                             hint="add it to m3lab.cost.paths.PATH_COST")
        src = entry if isinstance(entry, str) else entry.get(op) or entry.get(kind) or entry["*"]
        words, other = KERNEL_COST.get((path, src), ("", ""))
        return other if words and isinstance(kernel, str) and words in kernel.lower() else src
    return "fused" if op in UNRESOLVED_FUSED else KIND_COST.get(kind, "elementwise")
