"""Where vLLM 0.33.0 decides each MiniMax M3 fast path: the citations of the resolver's rules.

Each entry is a :class:`~m3lab.vllm.cite.Cite` (file below the vllm package, function, text on the deciding line);
a test locates every one in the installed vLLM and imports every cited function.
"""
from m3lab.vllm.cite import Cite

M3 = "models/minimax_m3/"
AMD_MODEL = M3 + "amd/model.py"
NV_MODEL = M3 + "nvidia/model.py"
SPARSE_ATTN = M3 + "common/sparse_attention.py"
INDEXER = M3 + "common/indexer.py"
MSA = M3 + "amd/indexer_msa.py"
AMD_TOPK = M3 + "amd/ops/index_topk.py"
AMD_SPARSE_PA = M3 + "amd/ops/sparse_pa.py"
AITER = "_aiter_ops.py"
GEMM_UTILS = "model_executor/layers/utils.py"
MXFP8_LINEAR = "model_executor/kernels/linear/mxfp8/rocm_native.py"
GATE = "model_executor/layers/fused_moe/router/gate_linear.py"
FUSED_AR = "model_executor/layers/fused_allreduce_gemma_rms_norm.py"
MONO_SPEC = M3 + "amd/specialized_decode/runtime/spec.py"

# The citations, by decision (needle = text on the deciding line inside the function).
CITES = {
    "aiter_enabled": Cite(AITER, "rocm_aiter_ops.is_enabled", "return cls._AITER_ENABLED"),
    "aiter_supported": Cite(AITER, "is_aiter_found_and_supported", "return get_cdna_version() > 2"),
    "shuffle": Cite(AITER, "rocm_aiter_ops.is_shuffle_kv_cache_enabled", "_SHUFFLE_KV_CACHE_ENABLED"),
    "pa_requested": Cite(SPARSE_ATTN, "_minimax_m3_aiter_sparse_pa_requested", "is_shuffle_kv_cache_enabled()"),
    "pa_gate": Cite(SPARSE_ATTN, "minimax_m3_use_aiter_sparse_pa", "num_kv_heads != 1 and not emits_sparse_block_table"),
    "main_select": Cite(SPARSE_ATTN, "select_main_backend_and_impl_cls", "if use_aiter_sparse_pa:"),
    "msa_sm100": Cite(SPARSE_ATTN, "select_main_backend_and_impl_cls", "is_device_capability_family(100)"),
    "triton_impl": Cite(SPARSE_ATTN, "MiniMaxM3SparseTritonImpl.forward"),
    "pa_decode_gluon": Cite(AMD_SPARSE_PA, "_run_gluon_decode", "pa_decode_gluon("),
    "msa_reason": Cite(MSA, "msa_indexer_unsupported_reason", 'if indexer_kv_dtype not in ("fp8", "fp8_e4m3"):'),
    "msa_gfx950": Cite(MSA, "msa_indexer_unsupported_reason", "if not on_gfx950():"),
    "msa_needs_pa": Cite(MSA, "msa_indexer_unsupported_reason", "if not _minimax_m3_aiter_sparse_pa_requested():"),
    "msa_max_blocks": Cite(MSA, "msa_indexer_unsupported_reason", "if max_blocks > MAX_SUPPORTED_BLOCKS:"),
    "msa_probe": Cite(AMD_MODEL, "MiniMaxM3Model.__init__", "impl_cls = select_msa_indexer_impl_cls("),
    "msa_cp": Cite(MSA, "msa_indexer_cp_enabled", "reason = msa_indexer_unsupported_reason("),
    "indexer_select": Cite(INDEXER, "select_indexer_impl_cls", "if is_fp8 and not (is_cuda and current_platform.supports_fp8()):"),
    "indexer_cp": Cite(INDEXER, "select_indexer_impl_cls", "if not current_platform.is_rocm() or tp_size < 2:"),
    "indexer_sm100": Cite(INDEXER, "select_indexer_impl_cls", "is_sm100"),
    "indexer_triton": Cite(INDEXER, "MiniMaxM3IndexerTritonImpl.forward", "decode_topk = minimax_m3_index_decode("),
    "emit_table": Cite(AMD_MODEL, "MiniMaxM3SparseAttention._run_attention", "sparse_block_table_out=decode_sparse_table[0],"),
    "skip_topk": Cite(AMD_MODEL, "_should_skip_index_topk", "return max(ordinal - offset, 0) % freq != 0"),
    "skip_run": Cite(AMD_MODEL, "MiniMaxM3SparseAttention._run_attention", "if not self.skip_index_topk:"),
    "score_budget": Cite(AMD_TOPK, "_decode_score_program_budget", "if 1 <= num_reqs <= 8:"),
    "score_split": Cite(AMD_TOPK, "_decode_score_split_launch_policy", "use_high_batch_config = ("),
    "topk_policy": Cite(AMD_TOPK, "_decode_topk_launch_policy", "and topk == 16"),
    "table_builder": Cite(AMD_SPARSE_PA, "minimax_m3_build_sparse_block_table_decode"),
    "table_builder_prefill": Cite(AMD_SPARSE_PA, "minimax_m3_build_sparse_block_table_prefill"),
    "fused_qknorm": Cite(AITER, "rocm_aiter_ops.fused_qknorm_idxrqknorm_enabled", 'if kv_cache_dtype == "auto":'),
    "fused_qknorm_use": Cite(AMD_MODEL, "MiniMaxM3SparseAttention.forward", "use_fused_qknorm = rocm_aiter_ops.fused_qknorm_idxrqknorm_enabled("),
    "dense_attn": Cite("platforms/rocm.py", "_get_backend_priorities", "backends.append(AttentionBackendEnum.ROCM_ATTN)"),
    "dense_qknorm": Cite(AMD_MODEL, "MiniMaxM3Attention.forward", "ops.fused_minimax_m3_qknorm_rope_kv_insert("),
    "eager_break": Cite(AMD_MODEL, "MiniMaxM3SparseAttention._run_attention"),
    "graph_uniform": Cite(SPARSE_ATTN, "MiniMaxM3SparseMetadataBuilder", "UNIFORM_BATCH"),
    "skinny_rc": Cite(GEMM_UTILS, "rocm_unquantized_gemm_impl", "10 <= n <= 128"),
    "skinny": Cite(GEMM_UTILS, "rocm_unquantized_gemm_impl", "and 0 < n <= 5"),
    "tgemm": Cite(GEMM_UTILS, "rocm_unquantized_gemm_impl", "if rocm_aiter_ops.is_tgemm_enabled() and not aiter_hgemm_unsafe:"),
    "aiter_triton_gemm": Cite(GEMM_UTILS, "use_aiter_triton_gemm", "(m == 5120 and k == 2880)"),
    "cuda_gemm": Cite(GEMM_UTILS, "dispatch_unquantized_gemm"),
    "mxfp8_supported": Cite(MXFP8_LINEAR, "RocmDotScaledMxfp8LinearKernel.is_supported", "if not current_platform.supports_mx():"),
    "mxfp8_tile": Cite(MXFP8_LINEAR, "_select_cfg", "if M <= 64:"),
    "mxfp8_apply": Cite(MXFP8_LINEAR, "RocmDotScaledMxfp8LinearKernel.apply_weights", "out = _mxfp8_dot_scaled_linear("),
    "router_fp32": Cite(GATE, "fp32_router_gemm_dispatch_impl", "if x.shape[0] <= _FP32_ROUTER_GEMM_MAX_TOKENS:"),
    "router_gfx950": Cite(GATE, "GateLinear.__init__", "or is_gfx950"),
    "fse_requested": Cite(AMD_MODEL, "MiniMaxM3MoE.__init__", "fse_requested = envs.VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS"),
    "fse_ep": Cite(AMD_MODEL, "MiniMaxM3MoE.__init__", "and not get_current_vllm_config().parallel_config.enable_expert_parallel"),
    "fse_quant": Cite(AMD_MODEL, "MiniMaxM3MoE.__init__", "fse_compatible, fse_reason = is_shared_expert_quant_fse_compatible("),
    "fse_aiter": Cite(AMD_MODEL, "_aiter_moe_fused_shared_experts_enabled", "and rocm_aiter_ops.is_fusion_moe_shared_experts_enabled()"),
    "mxfp8_moe": Cite("model_executor/layers/fused_moe/oracle/mxfp8.py", "select_mxfp8_moe_backend", "for backend in backends:"),
    "mxfp8_moe_user": Cite("model_executor/layers/fused_moe/oracle/mxfp8.py", "select_mxfp8_moe_backend", 'if runner_backend != "auto":'),
    "aiter_mxfp8_device": Cite("model_executor/layers/fused_moe/experts/aiter_mxfp8_moe.py",
                               "AiterMxfp8Experts._supports_current_device", "rocm_aiter_ops.is_fused_moe_enabled()"),
    "native_mxfp8_device": Cite("model_executor/layers/fused_moe/experts/mxfp8_native_moe.py",
                                "Mxfp8NativeTritonExperts._supports_current_device", "current_platform.supports_mx()"),
    "bf16_moe": Cite("model_executor/layers/fused_moe/oracle/unquantized.py", "_get_priority_backends"),
    "mxfp4_moe": Cite("model_executor/layers/fused_moe/oracle/mxfp4.py", "select_mxfp4_moe_backend"),
    "fused_ar": Cite(FUSED_AR, "_can_use_aiter_fused_ar_rms", "if not rocm_aiter_ops.is_custom_all_reduce_enabled():"),
    "fused_ar_call": Cite(AMD_MODEL, "MiniMaxM3DecoderLayer.forward", "fused_allreduce_gemma_rms_norm("),
    "fused_ar_fi": Cite(FUSED_AR, "fused_allreduce_gemma_rms_norm", "ok, max_token_num = _can_use_flashinfer(hidden_states, tp_size)"),
    "gemma_norm": Cite(AMD_MODEL, "MiniMAXGemmaRMSNorm.forward", "return gemma_fused_add_rmsnorm("),
    "nv_norm": Cite(NV_MODEL, "MiniMAXGemmaRMSNorm.forward", "from flashinfer.norm import gemma_fused_add_rmsnorm, gemma_rmsnorm"),
    "swiglu": Cite(AMD_MODEL, "MiniMaxM3MLP.forward", "x = swiglu_oai_split("),
    "nv_swiglu": Cite(NV_MODEL, "MiniMaxM3MLP.__init__", "SiluAndMulWithClamp("),
    "ffn_reduce": Cite(AMD_MODEL, "MiniMaxM3MLP.__init__", "reduce_results=reduce_results,"),
    "nv_deferred_ar": Cite(NV_MODEL, "MiniMaxM3DecoderLayer.forward"),
    "nv_dense_attn": Cite(NV_MODEL, "MiniMaxM3Attention.__init__", "self.attn = Attention("),
    "moe_select": Cite("model_executor/layers/fused_moe/oracle/unquantized.py", "select_unquantized_moe_backend"),
    "mono": Cite(MONO_SPEC, "DecodeConfig.refusal_reasons", 'reasons.append("requires --moe-backend aiter")'),
    "mono_select": Cite(MONO_SPEC, "specialized_decode_config", "reasons = spec.refusal_reasons(config)"),
    "lm_head": Cite(GEMM_UTILS, "rocm_unquantized_gemm_impl", "return torch.nn.functional.linear(x, weight, bias)"),
}
CITES["router_bf16x3"] = Cite("model_executor/layers/fused_moe/router/bf16x3_router_gemm_rocm.py", "is_supported",
                              "m >= MIN_TOKENS")


def cite(key: str) -> Cite:
    """The citation of a decision by its key in :data:`CITES`."""
    return CITES[key]
