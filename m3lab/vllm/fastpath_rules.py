"""The decision rules of :mod:`m3lab.vllm.fastpaths` (GEMMs, MoE, norms, communication; attention in
:mod:`m3lab.vllm.fastpath_attention`): one function per op, each mirroring vLLM 0.33.0's code.

Every rule returns a :class:`~m3lab.vllm.fastpaths.Decision` whose checks cite the vLLM line that tests them.
On ROCm the AMD model (``vllm/models/minimax_m3/amd/model.py``) serves M3; on CUDA the NVIDIA model
(``nvidia/model.py``), whose sparse attention and indexer are the common ones (Triton on SM90, MSA on SM100).
Where vLLM's deciding function is pure it is called rather than restated: the MXFP8 linear tile
(``_select_cfg``), the skinny-GEMM CU budget (``wvsplitkrc_dispatch``), the decode indexer launch policies
and the monokernel refusal list (``DecodeConfig.refusal_reasons``).
"""
from __future__ import annotations

from types import SimpleNamespace

from m3lab.spec.serving import Deployment
from m3lab.vllm import fastpath_attention as attn
from m3lab.vllm.fastpath_cites import cite as _c
from m3lab.vllm.fastpath_facts import Facts, vllm as _vllm
from m3lab.vllm.fastpath_types import Check, Decision, Platform

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
    out.append(attn.qk_norm_rope(f, "dense"))
    out.append(attn.dense_attention(f))
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
        out.append(attn.qk_norm_rope(f, kind))
        out.append(attn.indexer(f, kind))
        out.append(attn.page_table(f, kind))
        out.append(attn.attention(f, kind))
        out.append(_gemm(f, "o_proj", kind, ofmt, t, m.hidden, m.heads_q // f.tp * hd))
        out.append(allreduce_norm(f, kind))
        out.append(router(f, kind))
        out.extend(routing(f, kind))
        out.extend(experts(f, kind))
    if (mono := monokernel(f)) is not None:
        out.append(mono)
    out.append(norms(f, "model"))
    out.append(attn.graphs(f))
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
