"""vLLM's M3 attention decisions (A1-A7), read off the built layers and one recorded step of each.

- the sparse layers' implementations (indexer impl, attend impl, AITER page-16 sparse PA, MSA, indexer
  context parallelism) are what ``MiniMaxM3Model.__init__`` / ``MiniMaxM3SparseAttention.__init__`` selected
  while vLLM built the model (``select_msa_indexer_impl_cls``, ``msa_indexer_cp_enabled``,
  ``select_main_backend_and_impl_cls``, ``MiniMaxM3Indexer`` -> ``select_indexer_impl_cls``);
- the kernels, the page-16 table's producer and the decode score / top-k launch policy are what
  ``_run_attention`` launched for the step (:mod:`m3lab.vllm.attention_step`), with the constants it
  launched them with;
- the fused QK-norm path is ``rocm_aiter_ops.fused_qknorm_idxrqknorm_enabled`` called with the layer's own
  cache dtype and K/V scales, as ``MiniMaxM3SparseAttention.forward`` calls it;
- the dense layers' backend is the one vLLM's platform selector bound to their ``Attention`` layer.
"""
from __future__ import annotations

from m3lab.vllm.attention_step import Step, run as run_step
from m3lab.vllm.cite import cite_of
from m3lab.vllm.fastpath_types import Check, Decision

# attend implementation vLLM bound -> path id
ATTEND_PATHS = {"MiniMaxM3SparseAiterPAImpl": "aiter_sparse_pa", "MiniMaxM3SparseTritonImpl": "triton_sparse",
                "MiniMaxM3SparseMSAImpl": "msa_sm100"}
TABLE_BUILDERS = ("_build_sparse_block_table_kernel", "_build_sparse_block_table_prefill_kernel")
# the launch that writes the page-16 table itself (EMIT_SPARSE_TABLE) -> path id
EMITTER_PATHS = {"_decode_topk_fused_kernel": "fused_topk_emits", "_merge_topk_keys": "cp_merge_emits"}


def _impl(attn):
    return getattr(attn.indexer, "impl", attn.indexer)


def _indexer_part(trace, name: str) -> bool:
    """Whether ``name`` was launched by the indexer (its launch site is in an indexer module of vLLM)."""
    site = trace.sites.get(name)
    return site is not None and "index" in site.file


def sparse_step(attn, vllm_config, step: Step):
    """The recorded step and the attend's part of it (the same trace unless the indexer stopped first)."""
    trace = run_step(attn, vllm_config, step)
    return trace, (trace.attend or trace)


def _aiter_pa(attn, what: str) -> tuple[Check, ...]:
    """The check "AITER page-16 sparse PA in use" where the model has the switch (the AMD model; the NVIDIA
    model has none)."""
    if not hasattr(attn, "use_aiter_sparse_pa"):
        return ()
    on = bool(attn.use_aiter_sparse_pa)
    return (Check(what, on, on, cite_of(type(attn).__init__, "self.use_aiter_sparse_pa = ")),)


def _aiter_pa_inputs(attn) -> tuple[Check, ...]:
    """What ``_minimax_m3_aiter_sparse_pa_requested`` reads (AITER on, shuffled KV layout), from vLLM's own
    accessors under the emulated environment (the AMD model only)."""
    if not hasattr(attn, "use_aiter_sparse_pa"):
        return ()
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.models.minimax_m3.common import sparse_attention
    cite = cite_of(sparse_attention._minimax_m3_aiter_sparse_pa_requested)
    on, shuffle = bool(rocm_aiter_ops.is_enabled()), bool(rocm_aiter_ops.is_shuffle_kv_cache_enabled())
    return (Check("VLLM_ROCM_USE_AITER", int(on), on, cite),
            Check("VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT", int(shuffle), shuffle, cite))


def attention(kind: str, attn, trace, attend) -> Decision:
    """A1: the attend implementation vLLM bound, and what it launched for the step."""
    impl = type(attn.impl).__name__
    path = ATTEND_PATHS.get(impl, impl)
    kernels = tuple(k for k in attend.kernels if k not in TABLE_BUILDERS and not _indexer_part(attend, k))
    kernels = tuple("pa_decode_gluon" if "pa_decode_gluon" in k else k for k in kernels)
    checks = (*(_aiter_pa_inputs(attn) if kind == "sparse" else ()),
              Check("attend implementation (select_main_backend_and_impl_cls)", impl, True,
                    cite_of(type(attn).__init__, "= select_main_backend_and_impl_cls(")),
              *_aiter_pa(attn, "AITER page-16 sparse PA (minimax_m3_use_aiter_sparse_pa)"))
    site = attend.stop_site or next((attend.sites.get(k) for k in kernels if attend.sites.get(k)), None)
    return Decision("attention", kind, "A1", path, kernels, checks, site or cite_of(type(attn.impl).forward),
                    vllm=impl)


def indexer(kind: str, attn, model, trace) -> Decision:
    """A2-A5: the indexer vLLM built for the layer and what it launched (nothing on a reuse layer)."""
    impl = type(_impl(attn)).__name__
    amd = hasattr(attn, "skip_index_topk")  # the NVIDIA model has neither index sharing nor indexer CP
    reuse = Check("index sharing: this layer reuses the top-k (skip_index_topk)", getattr(attn, 'skip_index_topk', False),
                  not getattr(attn, 'skip_index_topk', False),
                  cite_of(type(attn).__init__, "self.skip_index_topk = ") if amd else None)
    if getattr(attn, 'skip_index_topk', False):
        return Decision("indexer", kind, "A5", "reuse_topk", (), (reuse,),
                        cite_of(type(attn)._run_attention, "if not self.skip_index_topk:"), status="skipped",
                        note="index sharing: no index score or top-k; the attend reads the shared top-k buffer",
                        vllm="skip_index_topk=True")
    cp = bool(getattr(model, "indexer_cp", False))
    launched = trace.kernels if trace.indexer_stop is None else (trace.indexer_stop,)
    kernels = tuple(k for k in launched if _indexer_part(trace, k) or k == trace.indexer_stop)
    fused = trace.launch("_decode_topk_fused_kernel")
    emits = bool(fused.get("EMIT_SPARSE_TABLE")) if fused else False
    if "MSA" in impl:
        path, label = "msa_fp8" + ("_cp" if cp else ""), "A2" + ("/A4" if cp else "")
    elif "TritonCP" in impl:
        path, label = "triton_cp", "A4"
    elif fused is not None:
        path, label = "triton_amd_fused_topk" + ("_emit_table" if emits else ""), "A3"
    elif any(k.startswith("_decode_index") or k.startswith("_topk_index_partial") for k in kernels):
        path, label = "triton_common", "A3"
    else:
        path, label = ("triton_amd_prefill" if "amd" in _site_files(trace) else "triton_common"), "A3"
    checks = [Check("indexer implementation vLLM selected", impl, True, cite_of(type(_impl(attn))))]
    if amd:
        checks[:0] = [reuse]
        checks.append(Check("indexer context parallel (msa_indexer_cp_enabled)", cp, cp,
                            cite_of(type(model).__init__, "self.indexer_cp = msa_indexer_cp_enabled(")))
    if fused is not None:
        checks.append(Check("fused decode top-k launch (chunks, BLOCK_SIZE_K, warps, emits the page-16 table)",
                            f"{fused.get('NUM_TOPK_CHUNKS')}, {fused.get('BLOCK_SIZE_K')}, {fused.get('num_warps')}"
                            f", {emits}", True, trace.sites.get("_decode_topk_fused_kernel")))
    site = next((trace.sites.get(k) for k in kernels if trace.sites.get(k)), None) or trace.stop_site
    return Decision("indexer", kind, label, path, kernels, tuple(checks), site or cite_of(type(_impl(attn))),
                    vllm=impl + (" (context parallel)" if cp else ""))


def _site_files(trace) -> str:
    return " ".join(s.file for s in trace.sites.values() if s is not None)


def page_table(kind: str, attn, trace, attend) -> Decision:
    """Who writes the page-16 table the AITER attend reads (or that there is none)."""
    (base,) = _aiter_pa(attn, "AITER sparse PA in use") or (Check("AITER sparse PA in this model", False, False,
                                                                  cite_of(type(attn).__init__)),)
    if not base.value:
        return Decision("page_table", kind, "A1", "none", (), (base,), base.cite, status="skipped",
                        note="the Triton attend reads the top-k directly", vllm="use_aiter_sparse_pa=False")
    built = next((k for k in attend.kernels if k in TABLE_BUILDERS), None)
    label = "A5" if getattr(attn, 'skip_index_topk', False) else "A1"
    if built:
        why = ("reuse layer: rebuilt from the shared top-k" if getattr(attn, 'skip_index_topk', False) else "built by the attend")
        return Decision("page_table", kind, label, "triton_builder", (built,), (base,), attend.sites.get(built)
                        or cite_of(type(attn.impl).forward), note=why, vllm=built)
    if getattr(attn, "indexer_emits_table", False):
        return Decision("page_table", kind, "A2" if not getattr(attn, 'skip_index_topk', False) else "A5", "msa_topk_emits",
                        (), (base,), cite_of(type(attn).__init__, "self.indexer_emits_table = "), status="skipped",
                        note="emitted by the MSA top-k launch: no separate kernel", vllm="indexer_emits_table=True")
    emitter = next((x for x in trace.launches if x.get("EMIT_SPARSE_TABLE")), None)
    if emitter is not None:
        path = EMITTER_PATHS.get(emitter.kernel, emitter.kernel.strip("_"))
        return Decision("page_table", kind, "A3" if path == "fused_topk_emits" else "A4", path, (), (base,),
                        trace.sites.get(emitter.kernel) or base.cite, status="skipped",
                        note=f"emitted by {emitter.kernel}: no separate kernel", vllm=f"{emitter.kernel} "
                        "EMIT_SPARSE_TABLE=True")
    return Decision("page_table", kind, label, "unknown", (), (base,), base.cite, status="skipped",
                    note="no table writer was recorded", vllm="")


def qk_norm(kind: str, attn) -> Decision:
    """A6 (sparse layers) / the dense layers' fused norm + RoPE: ``forward``'s choice for this layer."""
    if kind == "dense" or not hasattr(attn, "indexer"):
        fwd = type(attn).forward
        return Decision("qk_norm_rope_insert", kind, "A7", "vllm_fused_qknorm_rope",
                        ("_C.fused_minimax_m3_qknorm_rope_kv_insert (norm + RoPE)", "attention backend's KV insert"),
                        (Check("dense attention module", type(attn).__name__, True, cite_of(type(attn))),),
                        cite_of(fwd, "fused_minimax_m3_qknorm_rope_kv_insert("), vllm=type(attn).__name__)
    skip = " (skip_index_branch: no index norm/RoPE/cache write)" if getattr(attn, 'skip_index_topk', False) else ""
    if not getattr(attn, 'use_aiter_sparse_pa', False):
        return Decision("qk_norm_rope_insert", kind, "A6", "vllm_fused_qknorm_rope_kv_insert",
                        ("_C.fused_minimax_m3_qknorm_rope_kv_insert (norm + RoPE + KV/index insert)",),
                        _aiter_pa(attn, "AITER sparse PA in use"),
                        cite_of(type(attn).forward, "ops.fused_minimax_m3_qknorm_rope_kv_insert("),
                        note=skip.strip(), vllm="use_aiter_sparse_pa=False")
    from vllm._aiter_ops import rocm_aiter_ops
    k, v = getattr(attn, "_k_scale", None), getattr(attn, "_v_scale", None)
    on = bool(rocm_aiter_ops.fused_qknorm_idxrqknorm_enabled(attn.kv_cache_dtype, k, v))
    checks = (Check("fused_qknorm_idxrqknorm_enabled(kv_cache_dtype, k_scale, v_scale)",
                    f"{attn.kv_cache_dtype}, scales {'set' if k is not None else 'absent'}", on,
                    cite_of(rocm_aiter_ops.fused_qknorm_idxrqknorm_enabled)),)
    if on:
        return Decision("qk_norm_rope_insert", kind, "A6", "aiter_fused_qknorm_idxrqknorm",
                        ("aiter fused_qknorm_idxrqknorm",), checks,
                        cite_of(type(attn).forward, "use_fused_qknorm = rocm_aiter_ops.fused_qknorm_idxrqknorm_enabled("),
                        note="one launch: q/k (and index q/k) norm + RoPE + page-16 KV insert" + skip,
                        vllm="fused_qknorm_idxrqknorm_enabled=True")
    kernels = ("_C.fused_minimax_m3_qknorm_rope_kv_insert", "aiter reshape_and_cache (asm layout)",
               *(() if getattr(attn, 'skip_index_topk', False) else ("_insert_index_cache_kernel",)))
    return Decision("qk_norm_rope_insert", kind, "A6", "vllm_fused_qknorm_rope_aiter_cache", kernels, checks,
                    cite_of(type(attn).forward, "use_fused_qknorm = rocm_aiter_ops.fused_qknorm_idxrqknorm_enabled("),
                    note=skip.strip(), vllm="fused_qknorm_idxrqknorm_enabled=False")


def dense_attention(attn) -> Decision:
    """A7: the backend vLLM's platform selector bound to the dense layers' ``Attention``."""
    backend = attn.attn.attn_backend
    name = backend.get_name()
    return Decision("attention", "dense", "A7", name.lower(), (f"{name} backend",),
                    (Check("backend the platform selected (get_attn_backend)", name, True,
                           cite_of(type(attn.attn).__init__)),),
                    cite_of(backend), vllm=backend.__name__)
