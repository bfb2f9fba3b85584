"""The decision rules of :mod:`m3lab.vllm.fastpaths`: one function per op, each mirroring vLLM 0.33.0's code.

Every rule returns a :class:`~m3lab.vllm.fastpaths.Decision` whose checks cite the vLLM line that tests them.
On ROCm the AMD model (``vllm/models/minimax_m3/amd/model.py``) serves M3; on CUDA the NVIDIA model
(``nvidia/model.py``), whose sparse attention and indexer are the common ones (Triton on SM90, MSA on SM100).
Where vLLM's deciding function is pure it is called rather than restated: the MXFP8 linear tile
(``_select_cfg``), the skinny-GEMM CU budget (``wvsplitkrc_dispatch``), the decode indexer launch policies
and the monokernel refusal list (``DecodeConfig.refusal_reasons``).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

from m3lab.spec.serving import Deployment
from m3lab.vllm.cite import Cite
from m3lab.vllm.fastpath_types import Check, Decision, Platform

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


def _c(key: str) -> Cite:
    return CITES[key]


def _vllm(module: str):
    from m3lab.vllm.imports import vllm_module
    return vllm_module(module, "resolving vLLM's fast paths")


# ---- facts shared by several rules ------------------------------------------------------------------
class Facts:
    """The inputs of vLLM's decisions for one resolution (derived once)."""

    def __init__(self, d: Deployment, platform: Platform, tokens: int, phase: str):
        self.tokens = tokens
        self.d, self.p, self.s = d, platform, d.serving
        self.model, self.plan, self.quant = d.model, d.plan, d.quant
        self.tp = d.plan.tp
        self.kv_heads = d.plan.heads_kv_local(d.model)
        self.idx_heads = max(1, d.model.sparse.index_heads // self.tp)
        self.kv_cache_dtype = "auto" if d.quant.kv_dtype == "bf16" else d.quant.kv_dtype
        self.index_dtype = d.quant.index_dtype
        self.aiter = self.p.aiter_supported and self.s.aiter
        self.pa_requested = self.aiter and self.s.shuffle_kv_cache
        self.max_model_len = self.s.max_model_len or d.model.max_position
        self.msa_reason = self._msa_reason()
        self.msa = self.msa_reason is None
        self.emits_table = self.msa  # the MSA top-k writes the attend's page table
        self.decode = phase == "decode"
        self.rows_per_req = self.s.decode_query_len if self.decode else tokens
        self.requests = max(1, tokens // self.rows_per_req) if self.decode else 1

    def _msa_reason(self) -> str | None:
        """``msa_indexer_unsupported_reason`` at cp_world 1 (``amd/indexer_msa.py``)."""
        if not self.p.rocm:
            return "needs ROCm for the fp8 MFMA score/top-k"
        if not self.pa_requested:
            return "needs the AITER sparse PA attend (VLLM_ROCM_USE_AITER=1 + VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1)"
        if self.index_dtype != "fp8":
            return f"needs an fp8 e4m3 index cache, got indexer_kv_dtype={self.index_dtype!r}"
        if not self.p.gfx950:
            return "needs gfx950 for the fp8 MFMA"
        sp = self.model.sparse
        if (sp.topk_blocks, sp.block_size, sp.index_dim) != (16, 128, 128):
            return "needs topk_blocks 16, sparse_block_size 128, index_head_dim 128"
        if math.ceil(self.max_model_len / sp.block_size) > 8192:
            return f"max_model_len={self.max_model_len} needs more than the 8192 blocks the top-k is compiled for"
        return None

    def aiter_checks(self) -> list[Check]:
        return [Check("ROCm gfx9 CDNA>=3 with aiter", self.p.aiter_supported, self.p.aiter_supported, _c("aiter_supported")),
                Check("VLLM_ROCM_USE_AITER", int(self.s.aiter), self.s.aiter, _c("aiter_enabled"))]


# ---- GEMMs (G1, G2) -----------------------------------------------------------------------------------
def _gemm(f: Facts, op: str, kind: str, fmt: str, m: int, n: int, k: int, note: str = "") -> Decision:
    shape = f"M={m} N={n} K={k}"
    p, s = f.p, f.s
    if fmt == "mxfp8":
        ok = p.supports_mx
        checks = [Check("weights MXFP8 (checkpoint)", fmt, True),
                  Check("platform supports native MX (gfx95x)", p.arch, ok, _c("mxfp8_supported"))]
        if not p.rocm:
            return Decision(op, kind, "G2", "cuda_mxfp8_linear", ("vLLM CUDA MXFP8 linear kernel",), tuple(checks),
                            _c("mxfp8_supported"), note="CUDA MXFP8 linear kernel selection is not resolved by m3lab",
                            shape=shape)
        if not ok:
            return Decision(op, kind, "G2", "mxfp8_bf16_emulation", ("dequantised BF16 weight", "hipBLASLt GEMM"),
                            tuple(checks), _c("mxfp8_supported"), shape=shape,
                            note="no native MX on this arch: the MXFP8 weights run as BF16 (emulation)")
        bm, bn, bk, warps, stages = _vllm("vllm.model_executor.kernels.linear.mxfp8.rocm_native")._select_cfg(m, n, k)
        regime = "decode" if m <= 64 else ("mid-M narrow" if bm == 16 else "prefill")
        checks.append(Check(f"{regime} tile (_select_cfg)", f"BLOCK {bm}x{bn}x{bk}, {warps} warps, {stages} stages",
                            True, _c("mxfp8_tile")))
        return Decision(op, kind, "G2", f"mxfp8_dot_scaled_{regime.split()[0].replace('-', '_')}",
                        ("mxfp8_e4m3_quantize", "_mxfp8_linear_kernel"), tuple(checks), _c("mxfp8_apply"),
                        shape=shape, note=note)
    if fmt not in ("bf16", "fp32"):
        return Decision(op, kind, "G1", f"{fmt}_linear", (f"{fmt} linear",), (Check("weights", fmt, True),),
                        _c("cuda_gemm"), note=f"{fmt} dense linears are not an M3 checkpoint format; not resolved",
                        shape=shape)
    if not p.rocm:
        return Decision(op, kind, "G1", "cublas", ("cuBLAS GEMM (F.linear)",), (Check("platform", "CUDA", True),),
                        _c("cuda_gemm"), shape=shape, note=note)
    utils = _vllm("vllm.model_executor.layers.utils")
    _, fits = utils.wvsplitkrc_dispatch(m, k, n, p.compute_units or 256)
    rc = s.skinny_gemm and p.gfx950 and 10 <= m <= 128 and k % 8 == 0 and k > 512 and n % 16 == 0 and fits
    checks = [Check("VLLM_ROCM_USE_SKINNY_GEMM", int(s.skinny_gemm), s.skinny_gemm),
              Check("wvSplitKrc: gfx950, 10 <= tokens <= 128, K%8==0, K>512, N%16==0, fits the CUs",
                    f"{p.arch}, tokens={m}, fits={fits}", rc, _c("skinny_rc"))]
    if rc:
        return Decision(op, kind, "G1", "skinny_wvsplitkrc", ("wvSplitKrc",), tuple(checks), _c("skinny_rc"),
                        shape=shape, note=note)
    trit = f.aiter and s.aiter_triton_gemm and (n, k) in ((5120, 2880), (2880, 4096), (128, 2880), (640, 2880), (2880, 512))
    checks.append(Check("AITER Triton gemm_a16w16 (gpt-oss shapes only)", (n, k), trit, _c("aiter_triton_gemm")))
    sk = s.skinny_gemm and p.gfx9 and k % 8 == 0 and (n == 1 or n > 8) and 0 < m <= 5
    checks.append(Check("wvSplitK: skinny on, gfx9, 1 <= tokens <= 5", f"tokens={m}", sk, _c("skinny")))
    if sk:
        return Decision(op, kind, "G1", "skinny_wvsplitk", ("wvSplitK",), tuple(checks), _c("skinny"), shape=shape, note=note)
    tg = f.aiter and s.aiter_linear and p.gfx950
    checks.append(Check("AITER tgemm: VLLM_ROCM_USE_AITER ∧ _LINEAR ∧ gfx950", f"aiter={int(f.aiter)} "
                        f"linear={int(s.aiter_linear)} {p.arch}", tg, _c("tgemm")))
    if tg:
        return Decision(op, kind, "G1", "aiter_tgemm", ("aiter tgemm.mm (tuned hipBLASLt/asm/CK)",), tuple(checks),
                        _c("tgemm"), shape=shape, note=note)
    return Decision(op, kind, "G1", "hipblaslt", ("F.linear (hipBLASLt)",), tuple(checks), _c("lm_head"), shape=shape,
                    note=note)


def qkv_width(f: Facts, sparse: bool, replicate_index_q: bool = False) -> int:
    """Local columns of the fused projection: q | k | v (| index_q | index_k) (``linear.py:1374-1445``)."""
    m, hd = f.model, f.model.head_dim
    width = (m.heads_q // f.tp + 2 * f.kv_heads) * hd
    if sparse:
        iq = m.sparse.index_heads if replicate_index_q else f.idx_heads
        width += iq * m.sparse.index_dim + m.sparse.index_dim
    return width


# ---- attention (A1-A8) --------------------------------------------------------------------------------
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


# ---- norms, all-reduce, activation (N1-N3) ------------------------------------------------------------
def allreduce_norm(f: Facts, kind: str) -> Decision:
    """N2 after attention (fused AR + residual + Gemma norm) and the explicit FFN all-reduce + N1."""
    if f.tp == 1:
        return Decision("allreduce_norm", kind, "N1", "norm_only", ("_gemma_fused_add_rmsnorm_kernel",),
                        (Check("tp", 1, True),), _c("gemma_norm"), note="no all-reduce at TP1")
    if not f.p.rocm:
        return Decision("allreduce_norm", kind, "N2", "flashinfer_fused_ar_norm_or_nccl",
                        ("flashinfer trtllm fused allreduce+norm (when the workspace fits) or NCCL + gemma_fused_add_rmsnorm",),
                        (Check("tp", f.tp, True, _c("fused_ar_fi")),
                         Check("FFN all-reduce deferred into the next layer's norm (NVIDIA model only)", True, True,
                               _c("nv_deferred_ar"))), _c("fused_ar_fi"))
    bytes_ = f.tokens * f.model.hidden * 2
    ok = f.aiter and f.s.aiter_custom_ar
    checks = (Check("VLLM_ROCM_USE_AITER ∧ VLLM_ROCM_USE_AITER_CUSTOM_AR", f"{int(f.aiter)}/{int(f.s.aiter_custom_ar)}",
                    ok, _c("fused_ar")),
              Check("message fits effective_max_size and the 1-stage fused AR+RMS", f"{bytes_} B", ok, _c("fused_ar")))
    ffn = "FFN: reduced in place (RCCL / AITER custom AR), then _gemma_fused_add_rmsnorm_kernel in the next layer"
    if ok:
        return Decision("allreduce_norm", kind, "N2", "aiter_fused_ar_rmsnorm", (
            "aiter custom all-reduce + residual + Gemma RMSNorm (1 stage)", "FFN all-reduce (AITER custom AR)",
            "_gemma_fused_add_rmsnorm_kernel"), checks, _c("fused_ar_call"),
            note="attention AR fused with the norm when the bytes fit AITER's 1-stage limit (else as below); " + ffn)
    return Decision("allreduce_norm", kind, "N2", "rccl_then_triton_norm", (
        "RCCL all-reduce", "_gemma_fused_add_rmsnorm_kernel"), checks, _c("fused_ar_call"), note=ffn)


def activation(f: Facts, kind: str, what: str) -> Decision:
    """N3: dense MLP / unfused shared expert activation."""
    if not f.p.rocm:
        return Decision("activation", kind, "N3", "silu_and_mul_with_clamp", ("SiluAndMulWithClamp",),
                        (Check("platform", "CUDA", True),), _c("nv_swiglu"))
    inter = (f.model.dense_inter if what == "dense" else f.model.shared_inter) // f.tp
    return Decision("activation", kind, "N3", "triton_swiglu_oai", ("_swiglu_oai_kernel",),
                    (Check(f"{what} MLP intermediate per rank (tile 512 if >= 2048)", inter, True),),
                    _c("swiglu"), note="fp32 Triton SwiGLU-OAI, deliberately not silu_and_mul_with_clamp")


def norms(f: Facts, kind: str) -> Decision:
    """N1: Gemma RMSNorm."""
    if not f.p.rocm:
        return Decision("norm", kind, "N1", "flashinfer_gemma_rmsnorm", ("flashinfer gemma_fused_add_rmsnorm",),
                        (Check("platform", "CUDA", True),), _c("nv_norm"))
    return Decision("norm", kind, "N1", "triton_gemma_rmsnorm", ("_gemma_fused_add_rmsnorm_kernel",),
                    (Check("platform", "ROCm", True),), _c("gemma_norm"), note="always Triton on ROCm")


# ---- MoE (G3, M1-M3) ----------------------------------------------------------------------------------
def fse(f: Facts) -> tuple[bool, list[Check], str]:
    """Shared-expert fusion as vLLM resolves it: (on, checks, why off); the rule is ``ParallelPlan``'s."""
    asked = bool(f.plan.fused_shared_expert)
    rfmt, sfmt = f.quant.weight_dtype("routed_expert"), f.quant.weight_dtype("shared_expert")
    checks = [Check("VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS (plan.fused_shared_expert)", int(asked), asked,
                    _c("fse_requested")),
              Check("no expert parallelism", f"ep={f.plan.ep}", f.plan.ep == 1, _c("fse_ep")),
              Check("routed and shared experts in the same quant format", f"{rfmt} / {sfmt}", rfmt == sfmt, _c("fse_quant"))]
    if not f.p.rocm:
        return False, checks[:1], "the NVIDIA model has no shared-expert fusion"
    why = f.plan.shared_fusion_reason(f.model, f.quant)
    if not asked:
        return False, checks, ""
    return why is None, checks, why or ""


def router(f: Facts, kind: str) -> Decision:
    """G3: the fp32 router GEMM tiers."""
    t = f.tokens
    if not f.p.rocm:
        return Decision("router", kind, "G3", "cuda_router_tiers", ("fp32 router GEMM tier (cuteDSL / fp32 kernel / cuBLAS)",),
                        (Check("tokens", t, True),), _c("router_fp32"), note="CUDA tiers not resolved in detail")
    if f.p.gfx950 and t >= 2048:
        return Decision("router", kind, "G3", "rocm_bf16x3", ("bf16x3 split hipBLASLt GEMM + reduction",),
                        (Check("gfx950 and tokens >= 2048", t, True, _c("router_bf16x3")),), _c("router_bf16x3"))
    small = f.p.gfx950 and t <= 32
    checks = (Check("gfx950 fp32 router kernel eligible", f.p.arch, f.p.gfx950, _c("router_gfx950")),
              Check("tokens <= 32", t, t <= 32, _c("router_fp32")))
    if small:
        return Decision("router", kind, "G3", "rocm_fp32_router_gemm", ("_rocm_fp32_router_gemm_kernel",), checks,
                        _c("router_fp32"))
    return Decision("router", kind, "G3", "fp32_linear", ("F.linear in fp32",), checks, _c("router_fp32"))


def routing(f: Facts, kind: str) -> list[Decision]:
    """M1 (and the FSE decision, with the reason when vLLM turns a requested fusion off)."""
    on, checks, why = fse(f)
    out = []
    if why and f.plan.fused_shared_expert:
        out.append(Decision("shared_expert_fusion", kind, "M1", "fse_off", (), tuple(checks), _c("fse_requested"),
                            status="off", note=f"asked for but vLLM turns it off: {why}"))
    aiter_append = on and f.p.gfx950 and f.aiter and f.s.aiter_moe
    ach = Check("AITER append: gfx950 ∧ AITER MoE ∧ FSE", f"{f.p.arch}, aiter_moe={int(f.aiter and f.s.aiter_moe)}",
                aiter_append, _c("fse_aiter"))
    if aiter_append:
        out.append(Decision("routing", kind, "M1", "aiter_biased_grouped_topk_fse", ("aiter biased_grouped_topk",),
                            (*checks, ach), _c("fse_aiter"), note="1 group; shared slot id 128 appended in-kernel "
                            "(top-4 + 1), routed scaling applied inside AITER"))
    elif on:
        out.append(Decision("routing", kind, "M1", "topk_bias_router_cat_shared", ("topk_sigmoid", "torch.cat shared id"),
                            (*checks, ach), _c("fse_aiter"), note="FSE through the vLLM top-k bias router: shared id "
                            "appended by torch.cat with weight 1/2.0"))
    else:
        out.append(Decision("routing", kind, "M1", "topk_bias_router", ("topk_sigmoid (vLLM _moe_C)",), tuple(checks),
                            _c("fse_requested"), note="top-4 routed; separate shared-expert MLP"))
    return out


def experts(f: Facts, kind: str) -> list[Decision]:
    """M2 expert kernels (+ the shared expert MLP when not fused)."""
    fmt = f.quant.weight_dtype("routed_expert")
    on, _, _ = fse(f)
    rows = f"{f.model.experts // f.plan.ep + (1 if on else 0)} experts, top-{f.model.topk + (1 if on else 0)}"
    out: list[Decision] = []
    s, p = f.s, f.p
    if not p.rocm:
        out.append(Decision("experts", kind, "M2", f"cuda_{fmt}_moe", (f"vLLM CUDA {fmt} fused MoE",),
                            (Check("weights", fmt, True),), _c("moe_select"), note="CUDA MoE backend not resolved", shape=rows))
    elif fmt == "mxfp8":
        aiter_ok = p.supports_mx and f.aiter and s.aiter_moe and f.plan.ep == 1
        native_ok = p.supports_mx
        checks = (Check("--moe-backend", s.moe_backend, True, _c("mxfp8_moe_user")),
                  Check("AITER FlyDSL MXFP8: gfx95x ∧ AITER MoE (∧ FlyDSL gate mode) ∧ no EP",
                        f"{p.arch}, aiter_moe={int(f.aiter and s.aiter_moe)}, ep={f.plan.ep}", aiter_ok,
                        _c("aiter_mxfp8_device")),
                  Check("Triton native MXFP8: ROCm ∧ supports_mx", p.arch, native_ok, _c("native_mxfp8_device")))
        pick = s.moe_backend if s.moe_backend != "auto" else ("aiter" if aiter_ok else "triton" if native_ok else "emulation")
        if pick == "aiter" and not aiter_ok:
            out.append(Decision("experts", kind, "M2", "refused", (), checks, _c("mxfp8_moe_user"), status="refused",
                                note="vLLM raises ValueError: No supported MXFP8 expert class for AITER_MXFP8", shape=rows))
        elif pick == "aiter":
            out.append(Decision("experts", kind, "M2", "aiter_mxfp8_flydsl", ("aiter FlyDSL MXFP8 2-stage fused_moe",),
                                checks, _c("mxfp8_moe"), shape=rows, note="if FlyDSL is missing from the image vLLM "
                                "falls through to the Triton native backend ('Using ... MxFp8 MoE backend' log line)"))
        elif pick == "triton" and native_ok:
            out.append(Decision("experts", kind, "M2", "triton_mxfp8_native", ("moe_align_block_size",
                                "_mxfp8_grouped_gemm_kernel", "_swiglu_oai_quant_kernel", "_mxfp8_grouped_gemm_kernel"),
                                checks, _c("mxfp8_moe"), shape=rows, note="dot_scaled grouped GEMM with GROUP_SIZE_M=4 "
                                "program swizzle; SwiGLU + MXFP8 quant fused between the two GEMMs"))
        else:
            out.append(Decision("experts", kind, "M2", "mxfp8_emulation", ("BF16-dequantised experts",), checks,
                                _c("mxfp8_moe"), shape=rows, note="no native MX: emulation (gfx942 dequantises at load)"))
    elif fmt == "mxfp4":
        ok = p.gfx950
        out.append(Decision("experts", kind, "M2", "aiter_mxfp4_mxfp4" if ok else "mxfp4_emulation",
                            ("aiter CK fused_moe BLOCK_1X32 (W4A4)",) if ok else ("MXFP4 emulation",),
                            (Check("gfx950 (AITER_MXFP4_MXFP4)", p.arch, ok, _c("mxfp4_moe")),), _c("mxfp4_moe"), shape=rows))
    else:
        ok = f.aiter and s.aiter_moe
        out.append(Decision("experts", kind, "M2", "aiter_ck_fused_moe" if ok else "triton_fused_moe",
                            ("aiter CK fused_moe (SEPARATED, Swiglu)",) if ok else ("fused_moe_kernel",),
                            (Check("VLLM_ROCM_USE_AITER ∧ _MOE", f"{int(f.aiter)}/{int(s.aiter_moe)}", ok, _c("bf16_moe")),),
                            _c("bf16_moe"), shape=rows))
    if not on and f.model.n_shared:
        sfmt = f.quant.weight_dtype("shared_expert")
        inter = f.model.shared_inter // f.tp  # TP-sharded even under EP when tp > 1 (amd/model.py:286-300)
        out.append(_gemm(f, "shared_gate_up", kind, sfmt, f.tokens, 2 * inter, f.model.hidden,
                         note="separate shared-expert MLP (fusion off)"))
        out.append(activation(f, kind, "shared"))
        out.append(_gemm(f, "shared_down", kind, sfmt, f.tokens, f.model.hidden, inter))
    return out


def monokernel(f: Facts) -> Decision | None:
    """M3: ``--monokernel`` preconditions through vLLM's own refusal list, plus the weight/platform guards."""
    if not f.s.monokernel:
        return None
    spec = _vllm("vllm.models.minimax_m3.amd.specialized_decode.runtime.spec")
    reasons = spec.DECODE_CONFIG.refusal_reasons(_duck_vllm_config(f))
    on, _, _ = fse(f)
    if not (on and f.p.gfx950 and f.aiter and f.s.aiter_moe):
        reasons.append("requires shared-expert fusion with the AITER append")
    if f.quant.weight_dtype("routed_expert") != "mxfp4" or f.quant.weight_dtype("attn_qkv") != "bf16":
        reasons.append("requires AITER_MXFP4_MXFP4 experts and BF16 qkv/o_proj (the amd/MiniMax-M3-MXFP4 checkpoint)")
    if not f.p.gfx950 or f.p.compute_units != 256:
        reasons.append(f"requires CDNA4/gfx950 with 256 compute units (got {f.p.arch}, {f.p.compute_units})")
    checks = tuple(Check(r, "no", False, _c("mono")) for r in reasons) or (Check("all preconditions", "yes", True, _c("mono")),)
    if reasons:
        return Decision("monokernel", "sparse", "M3", "refused", (), checks, _c("mono_select"), status="refused",
                        note="vLLM raises ValueError: MiniMax-M3 specialized decode unsupported: " + "; ".join(reasons))
    rows = f.tokens
    runs = f.decode and 1 <= rows <= 16 and f.s.cudagraph_mode != "PIECEWISE"
    return Decision("monokernel", "sparse", "M3", "mono_ffn" if runs else "stock_layers",
                    ("minimax_m3_mono_ffn_s{rows}_tp4".format(rows=rows),) if runs else (), checks, _c("mono_select"),
                    note="replaces o_proj AR, post-attention norm, router, shared + routed experts and the MoE AR "
                         "with one persistent launch per sparse layer" if runs else
                    "per step only plain decode with 1-16 rows runs the monokernel; this step runs the stock layers")


def _duck_vllm_config(f: Facts) -> SimpleNamespace:
    """The parts of a VllmConfig that ``DecodeConfig.refusal_reasons`` reads, from the deployment."""
    ns = SimpleNamespace
    sp = f.model.sparse
    text = ns(num_hidden_layers=f.model.layers, use_index_cache=sp.index_topk_freq > 1,
              index_topk_freq=sp.index_topk_freq,
              sparse_attention_config={"sparse_attention_freq": [int(k == "sparse") for k in f.model.attn_types]})
    compilation_mode = _vllm("vllm.config").CompilationMode
    spec = ns(method=f.s.spec_method) if f.s.spec_method else None
    return ns(
        parallel_config=ns(tensor_parallel_size=f.tp, pipeline_parallel_size=1, data_parallel_size=f.plan.dp,
                           decode_context_parallel_size=1, prefill_context_parallel_size=1, use_ubatching=False,
                           enable_expert_parallel=f.plan.ep > 1, enable_eplb=False),
        cache_config=ns(cache_dtype=f.kv_cache_dtype, block_size=sp.block_size, kv_offloading_size=None),
        attention_config=ns(resolve_indexer_kv_dtype=lambda default: f.index_dtype),
        lora_config=None, kv_transfer_config=ns(kv_connector="connector" if f.plan.role != "both" else None),
        use_v2_model_runner=f.s.model_runner_v2 is not False, speculative_config=spec,
        model_config=ns(enable_sleep_mode=False, hf_text_config=text), weight_transfer_config=None,
        offload_config=ns(uva=ns(cpu_offload_gb=0), prefetch=ns(offload_group_size=0)),
        compilation_config=ns(mode=compilation_mode.VLLM_COMPILE), aux_output_config=None,
        kernel_config=ns(moe_backend=f.s.moe_backend))


# ---- the whole model ----------------------------------------------------------------------------------
def all_decisions(d: Deployment, platform: Platform, tokens: int, phase: str) -> list[Decision]:
    """Every decision for one deployment and step (see :func:`m3lab.vllm.fastpaths.resolve`)."""
    f = Facts(d, platform, tokens, phase)
    m, t = f.model, tokens
    out: list[Decision] = []
    qfmt = f.quant.weight_dtype("attn_qkv")
    ofmt = f.quant.weight_dtype("attn_o")
    hd = m.head_dim
    dense_mlp = bool(m.dense_mlp_layers)
    # dense layers (0-2): attention + dense MLP
    out.append(_gemm(f, "qkv_proj", "dense", qfmt, t, qkv_width(f, False), m.hidden))
    out.append(qk_norm_rope(f, "dense"))
    out.append(dense_attention(f))
    out.append(_gemm(f, "o_proj", "dense", ofmt, t, m.hidden, m.heads_q // f.tp * hd))
    out.append(allreduce_norm(f, "dense"))
    if dense_mlp:
        dfmt = f.quant.weight_dtype("dense_mlp")
        out.append(_gemm(f, "gate_up_proj", "dense", dfmt, t, 2 * m.dense_inter // f.tp, m.hidden))
        out.append(activation(f, "dense", "dense"))
        out.append(_gemm(f, "down_proj", "dense", dfmt, t, m.hidden, m.dense_inter // f.tp))
    # sparse layers: computing top-k, and reusing it under index sharing
    kinds = ["sparse"] + (["sparse_reuse"] if m.sparse.index_topk_freq > 1 and f.p.rocm else [])
    replicate = f.plan.indexer_cp and f.msa
    for kind in kinds:
        out.append(_gemm(f, "qkv_proj", kind, qfmt, t, qkv_width(f, True, replicate), m.hidden,
                         note="fused q|k|v|index_q|index_k" + (" (reuse layers still compute the index columns)"
                                                               if kind == "sparse_reuse" else "")))
        out.append(qk_norm_rope(f, kind))
        out.append(indexer(f, kind))
        out.append(page_table(f, kind))
        out.append(attention(f, kind))
        out.append(_gemm(f, "o_proj", kind, ofmt, t, m.hidden, m.heads_q // f.tp * hd))
        out.append(allreduce_norm(f, kind))
        out.append(router(f, kind))
        out.extend(routing(f, kind))
        out.extend(experts(f, kind))
    if (mono := monokernel(f)) is not None:
        out.append(mono)
    out.append(norms(f, "model"))
    out.append(graphs(f))
    sampled = f.requests * (f.rows_per_req if f.decode else 1)  # logits only at the sampled positions
    out.append(_gemm(f, "lm_head", "model", "bf16", sampled, -(-m.vocab // 64) * 64 // f.tp, m.hidden,
                     note="lm_head is BF16 in every M3 checkpoint; logits only for the sampled rows"))
    seen: set[tuple[str, str]] = set()
    unique = []
    for d in out:  # one refusal is one start-up error, whichever layer kinds share it
        if d.status == "refused":
            if (d.op, d.note) in seen:
                continue
            seen.add((d.op, d.note))
        unique.append(d)
    return unique
