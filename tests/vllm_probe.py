"""The differential test's independent route: vLLM's selectors called directly (in the target's worker).

:func:`expected` answers, for a deployment and a step, what the resolver's rows must say, by calling vLLM's
selection functions itself under the emulated platform (``select_mxfp8_moe_backend``, ``_can_use_aiter_fused_ar_rms``,
``select_main_backend_and_impl_cls``, ``select_msa_indexer_impl_cls``, ``msa_indexer_cp_enabled``,
``_select_cfg``, vLLM's qkv projection constructed anew, ...) instead of reading the resolver's rows. It
shares only the emulation and vLLM's own config/model build with the resolver. The path ids are this
test's own table (the one ``m3lab.vllm.fastpaths`` documents).
"""
from __future__ import annotations

import torch

EXPERT_PATHS = {"AiterMxfp8Experts": "aiter_mxfp8_flydsl", "Mxfp8NativeTritonExperts": "triton_mxfp8_native",
                "Mxfp8EmulationTritonExperts": "mxfp8_emulation", "AiterMxfp4Experts": "aiter_mxfp4_mxfp4",
                "AiterUnquantizedExperts": "aiter_ck_fused_moe", "TritonExperts": "triton_fused_moe", "MarlinExperts": "marlin",
                "OCP_MXQuantizationEmulationTritonExperts": "mxfp4_emulation"}
ATTEND_PATHS = {"MiniMaxM3SparseAiterPAImpl": "aiter_sparse_pa", "MiniMaxM3SparseTritonImpl": "triton_sparse",
                "MiniMaxM3SparseMSAImpl": "msa_sm100"}


def expected(dep, tokens: int, phase: str) -> dict:
    """{(op, layer_kind): expected path (or width)} for ``dep`` at the step, by vLLM's selectors."""
    from m3lab.vllm import vllm_build
    from m3lab.vllm.emulate import Target, emulate
    env, _ = dep.to_vllm()
    p = dep.plan
    with emulate(Target.of(dep.hardware), env=env, tp=p.tp, dp=p.dp, enable_ep=p.ep > 1):
        from vllm.config import set_current_vllm_config
        built = vllm_build.build(dep)
        if built.refusal is not None:
            return {("refused", "any"): True}
        with set_current_vllm_config(built.vllm_config):
            return _expected(dep, built, tokens, phase)


def _expected(dep, built, tokens: int, phase: str) -> dict:
    from vllm.platforms import current_platform
    vc, m, out = built.vllm_config, dep.model, {}
    lm = built.model.language_model.model
    layer = next(x for x in lm.layers if hasattr(x.self_attn, "indexer"))
    sp = m.sparse
    kv_heads = max(1, m.heads_kv // dep.plan.tp)
    index_dtype = vc.attention_config.resolve_indexer_kv_dtype("bf16")
    out[("experts", "sparse")] = _experts(layer.block_sparse_moe)
    # the NVIDIA model has no fusion (its MoE has no such attribute): never fused there
    out[("fse", "plan")] = bool(getattr(layer.block_sparse_moe, "is_fused_shared_expert_enabled", False))
    msa = None
    if current_platform.is_rocm():
        from vllm.models.minimax_m3.amd.indexer_msa import msa_indexer_cp_enabled, select_msa_indexer_impl_cls
        msa = select_msa_indexer_impl_cls(topk_blocks=sp.topk_blocks, sparse_block_size=sp.block_size,
                                          index_head_dim=sp.index_dim, indexer_kv_dtype=index_dtype)
        cp = msa_indexer_cp_enabled(vc, msa_indexer_selected=msa is not None)
    else:
        cp = False
    out[("qkv_proj", "sparse")] = _qkv_width(m, cp)
    from vllm.models.minimax_m3.common.sparse_attention import (minimax_m3_use_aiter_sparse_pa,
                                                                select_main_backend_and_impl_cls)
    _, impl = select_main_backend_and_impl_cls(topk_blocks=sp.topk_blocks, kv_cache_dtype=vc.cache_config.cache_dtype,
                                               num_kv_heads=kv_heads, emits_sparse_block_table=msa is not None)
    out[("attention", "sparse")] = ATTEND_PATHS[impl.__name__]
    pa = current_platform.is_rocm() and minimax_m3_use_aiter_sparse_pa(kv_heads, emits_sparse_block_table=msa is not None)
    out[("indexer", "sparse")] = _indexer(msa, cp, pa, phase, sp.topk_blocks, index_dtype)
    if current_platform.is_rocm():
        out[("allreduce_norm", "sparse")] = _allreduce(tokens, m.hidden, dep.plan.tp)
        if pa:
            from vllm._aiter_ops import rocm_aiter_ops
            attn = layer.self_attn
            on = rocm_aiter_ops.fused_qknorm_idxrqknorm_enabled(attn.kv_cache_dtype, attn._k_scale, attn._v_scale)
            out[("qk_norm_rope_insert", "sparse")] = ("aiter_fused_qknorm_idxrqknorm" if on else
                                                     "vllm_fused_qknorm_rope_aiter_cache")
        out[("routing", "sparse")] = _routing(dep, vc, layer)
    if dep.quant.weight_dtype("attn_o") == "mxfp8" and current_platform.supports_mx():
        from vllm.model_executor.kernels.linear.mxfp8 import rocm_native
        n, k = m.hidden, m.heads_q * m.head_dim // dep.plan.tp
        out[("o_proj", "sparse")] = ("mxfp8_dot_scaled_decode" if rocm_native._select_cfg(tokens, n, k) ==
                                     rocm_native._select_cfg(1, n, k) else "mxfp8_dot_scaled_prefill")
    out[("attention", "dense")] = _dense_backend(m, dep.plan.tp, vc)
    from vllm.models.minimax_m3.amd.model import _should_skip_index_topk
    reuse = current_platform.is_rocm() and any(_should_skip_index_topk(vc.model_config.hf_text_config, i)
                                               for i in range(vc.model_config.hf_text_config.num_hidden_layers))
    out[("indexer", "sparse_reuse")] = "reuse_topk" if reuse else None
    return out


def _experts(moe) -> str:
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import select_mxfp4_moe_backend
    from vllm.model_executor.layers.fused_moe.oracle.mxfp8 import select_mxfp8_moe_backend
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import select_unquantized_moe_backend
    from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp4Dynamic
    config = moe.experts.moe_config
    method = type(moe.experts._quant_method).__name__
    if "Mxfp8" in method or "MxFp8" in method:
        _, cls = select_mxfp8_moe_backend(config)
    elif "OCP_MX" in method:
        _, cls = select_mxfp4_moe_backend(config, activation_key=kMxfp4Dynamic)
    else:
        _, cls = select_unquantized_moe_backend(config)
    return EXPERT_PATHS.get(cls.__name__, cls.__name__)


def _qkv_width(m, cp: bool) -> int:
    from vllm.model_executor.layers.linear import MinimaxM3QKVParallelLinearWithIndexer
    sp = m.sparse
    layer = MinimaxM3QKVParallelLinearWithIndexer(m.hidden, m.head_dim, m.heads_q, m.heads_kv, sp.index_heads,
                                                  sp.index_dim, bias=False, quant_config=None, prefix="probe.qkv",
                                                  replicate_index_q=cp)
    return layer.output_size_per_partition


def _indexer(msa, cp: bool, pa: bool, phase: str, topk: int, index_dtype: str) -> str:
    from vllm.platforms import current_platform
    if msa is not None:
        return "msa_fp8_cp" if cp else "msa_fp8"
    from vllm.models.minimax_m3.common.indexer import select_indexer_impl_cls
    impl = select_indexer_impl_cls(topk_blocks=topk, indexer_kv_dtype=index_dtype).__name__
    if "TritonCP" in impl:
        return "triton_cp"
    if "MSA" in impl:
        return "msa_sm100"
    if not current_platform.is_rocm():
        return "triton_common"
    if phase == "prefill":
        return "triton_amd_prefill"
    return "triton_amd_fused_topk_emit_table" if pa else "triton_amd_fused_topk"


def _allreduce(tokens: int, hidden: int, tp: int) -> str:
    if tp == 1:
        return "norm_only"
    from vllm.model_executor.layers.fused_allreduce_gemma_rms_norm import _can_use_aiter_fused_ar_rms
    hs = torch.empty(tokens, hidden, dtype=torch.bfloat16, device="meta")
    return "aiter_fused_ar_rmsnorm" if _can_use_aiter_fused_ar_rms(hs) else "allreduce_then_norm"


def _routing(dep, vc, layer) -> str:
    from vllm import envs
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.model_executor.layers.fused_moe.router.fused_topk_bias_router import _aiter_can_use_biased_grouped_topk
    from vllm.model_executor.layers.quantization.utils.config_utils import is_shared_expert_quant_fse_compatible
    from vllm.models.minimax_m3.amd.model import _aiter_moe_fused_shared_experts_enabled
    m = dep.model
    prefix = "language_model.model.layers.3.block_sparse_moe"
    compatible, _ = is_shared_expert_quant_fse_compatible(vc.quant_config, f"{prefix}.experts",
                                                          f"{prefix}.shared_experts")
    fse = bool(envs.VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS and m.n_shared
               and not vc.parallel_config.enable_expert_parallel and compatible)
    if _aiter_moe_fused_shared_experts_enabled(fse):
        return "aiter_biased_grouped_topk_fse"
    if rocm_aiter_ops.is_fused_moe_enabled() and _aiter_can_use_biased_grouped_topk(m.experts, m.topk):
        return "aiter_biased_grouped_topk"
    return "topk_bias_router_cat_shared" if fse else "topk_bias_router"


def _dense_backend(m, tp: int, vc) -> str:
    from vllm.v1.attention.selector import get_attn_backend
    kv = vc.cache_config.cache_dtype
    backend = get_attn_backend(m.head_dim, torch.bfloat16, kv, use_mla=False)
    return backend.get_name().lower()


def planted_ep(dep, tokens: int) -> dict:
    """A planted change in vLLM's condition: AITER's MXFP8 experts refuse expert parallelism.

    Returns the expert path before the plant (the resolver's), the independent route's with the plant, and
    the resolver's with the plant."""
    from m3lab.vllm import decide, vllm_build
    from vllm.model_executor.layers.fused_moe.experts.aiter_mxfp8_moe import AiterMxfp8Experts

    def path(rows):
        return next(r.path for r in rows if r.op == "experts" and r.layer_kind == "sparse")
    before = path(decide.decide(dep, tokens, "decode"))
    saved = AiterMxfp8Experts.__dict__["_supports_parallel_config"]
    AiterMxfp8Experts._supports_parallel_config = staticmethod(lambda *a, **k: False)
    vllm_build._BUILDS.clear()
    try:
        probe = expected(dep, tokens, "decode")[("experts", "sparse")]
        after = path(decide.decide(dep, tokens, "decode"))
    finally:
        AiterMxfp8Experts._supports_parallel_config = saved
        vllm_build._BUILDS.clear()
    return {"before": before, "probe_planted": probe, "resolver_planted": after}


def edited_restated(dep, tokens: int) -> list:
    """The resolver's rows with m3lab's one restated rule (flashinfer's fused AR on CUDA) edited."""
    import dataclasses

    from m3lab.vllm import decide, decide_comm
    saved = decide_comm._cuda_allreduce_norm

    def edited(*args, **kwargs):
        return dataclasses.replace(saved(*args, **kwargs), path="nccl_then_norm")
    decide_comm._cuda_allreduce_norm = edited
    try:
        return decide.decide(dep, tokens, "decode")
    finally:
        decide_comm._cuda_allreduce_norm = saved


def restore_check(target) -> dict:
    """Enter and leave the emulation once more (in a worker already bound to ``target``): what is left over."""
    import os
    import sys

    import vllm.platforms
    from vllm.distributed import parallel_state as ps

    from m3lab.vllm.emulate import emulate, stale_bindings
    before = (vllm.platforms._current_platform, ps._TP, torch.cuda.get_device_properties)
    with emulate(target, env={"VLLM_ROCM_USE_AITER": "1", "M3LAB_PROBE": "x"}, tp=4) as platform:
        import aiter  # noqa: F401  (the stub package of the declared image)
        inside = {"platform": type(platform).__name__, "tp": ps.get_tensor_model_parallel_world_size(),
                  "aiter_found": "aiter" in sys.modules, "env": os.environ.get("M3LAB_PROBE")}
    rocm = sys.modules.get("vllm.platforms.rocm")
    return {"inside": inside,
            "platform_restored": vllm.platforms._current_platform is before[0],
            "stale": stale_bindings(platform), "tp_group_restored": ps._TP is before[1],
            "cuda_restored": torch.cuda.get_device_properties is before[2],
            "aiter_gone": "aiter" not in sys.modules and "amdsmi" not in sys.modules,
            "env_gone": "M3LAB_PROBE" not in os.environ and "VLLM_ROCM_USE_AITER" not in os.environ,
            "no_arch": rocm is None or (rocm._GCN_ARCH == "" and not rocm.on_gfx950())}
