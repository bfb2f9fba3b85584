"""vLLM's M3 decisions on norms, all-reduces, the activation, CUDA graphs and the monokernel (N1-N3, A8, M3).

- N2: ``fused_allreduce_gemma_rms_norm`` itself runs for the step's message on fake tensors, with the TP
  group vLLM would have (an AITER custom all-reduce when its communicator builds one): its own
  ``_can_use_flashinfer`` / ``_can_use_aiter_fused_ar_rms`` (``effective_max_size``, ``should_custom_ar``,
  ``use_1stage_fused_ar_rms``) decide; the fallback stops at the TP group's all-reduce.
- N1 / N3: the built norm module's ``forward`` and the dense MLP's activation run on CPU tensors; the Triton
  launch (or the library call) is recorded.
- A8: vLLM's ``CudagraphDispatcher`` with the deployment's compilation config dispatches the step.
- M3: ``specialized_decode_config`` ran while vLLM built the model (it refuses there); per step,
  ``runtime/routing.py::decide_step`` decides whether the monokernel takes it.
"""
from __future__ import annotations

from m3lab.vllm import emulate_stubs as stubs
from m3lab.vllm import recorder
from m3lab.vllm.cite import cite_of
from m3lab.vllm.fastpath_types import Check, Decision

def allreduce_norm(kind: str, layer, tokens: int, tp: int) -> Decision:
    """N2: the post-attention all-reduce + residual + Gemma norm for a ``tokens`` x hidden message."""
    import torch
    from vllm.model_executor.layers import fused_allreduce_gemma_rms_norm as fused
    norm = layer.post_attention_layernorm
    hidden = norm.weight.shape[0]
    if tp == 1:
        return Decision("allreduce_norm", kind, "N1", "norm_only", _norm_kernels(norm, tokens),
                        (Check("tensor-parallel size", 1, True, cite_of(fused.fused_allreduce_gemma_rms_norm,
                                                                         "if tp_size == 1:")),),
                        cite_of(fused.fused_allreduce_gemma_rms_norm, "if tp_size == 1:"), note="no all-reduce at TP1",
                        vllm="tp_size == 1")
    from vllm.platforms import current_platform
    if current_platform.is_cuda():
        return _cuda_allreduce_norm(kind, norm, tokens, fused)
    (hs,) = recorder.fake_cuda(((tokens, hidden), torch.bfloat16))
    fi_ok, _ = fused._can_use_flashinfer(hs, tp)
    aiter_ok = bool(fused._can_use_aiter_fused_ar_rms(hs))
    nbytes = tokens * hidden * 2
    checks = (Check("flashinfer fused AR+norm (_can_use_flashinfer)", fi_ok, fi_ok,
                    cite_of(fused._can_use_flashinfer)),
              Check(f"AITER 1-stage fused AR+norm for {nbytes} B (_can_use_aiter_fused_ar_rms)", aiter_ok, aiter_ok,
                    cite_of(fused._can_use_aiter_fused_ar_rms)))
    ffn = "FFN output: all-reduced in place by the MoE / MLP, then the next layer's fused add + norm"
    if fi_ok or aiter_ok:
        path = "flashinfer_fused_ar_norm" if fi_ok else "aiter_fused_ar_rmsnorm"
        kernels = ("flashinfer trtllm fused allreduce+norm",) if fi_ok else (
            "aiter custom all-reduce + residual + Gemma RMSNorm (1 stage)",)
        return Decision("allreduce_norm", kind, "N2", path, kernels, checks,
                        cite_of(fused.fused_allreduce_gemma_rms_norm, "if ok:" if fi_ok else
                                "if _can_use_aiter_fused_ar_rms(hidden_states):"), note=ffn, vllm=path)
    comm = _tp_all_reduce(hs, tp)
    return Decision("allreduce_norm", kind, "N2", "allreduce_then_norm", (comm, *_norm_kernels(norm, tokens)),
                    checks, cite_of(fused.fused_allreduce_gemma_rms_norm, "reduced = tensor_model_parallel_all_reduce("),
                    note=ffn, vllm=f"{comm} + {type(norm).__name__}")


def _cuda_allreduce_norm(kind: str, norm, tokens: int, fused) -> Decision:
    """N2 on CUDA, restated: flashinfer's fused AR + norm needs its IPC workspace (an NVSwitch probe across
    real GPUs), which cannot run here. ``_can_use_flashinfer`` takes it when the workspace exists and the
    message fits its token budget, else NCCL all-reduce + norm."""
    cite = cite_of(fused._can_use_flashinfer)
    return Decision("allreduce_norm", kind, "N2", "flashinfer_fused_ar_norm_or_nccl",
                    ("flashinfer trtllm fused allreduce+norm (workspace fits) or NCCL all-reduce",
                     *_norm_kernels(norm, tokens)),
                    (Check("flashinfer workspace (NVSwitch) and token budget", "not emulated", True, cite),),
                    cite, how="restated", note="FFN all-reduce deferred into the next layer's norm (NVIDIA model)",
                    vllm="")


def _tp_all_reduce(message, tp: int) -> str:
    """What the TP group's all-reduce of ``message`` (tokens x hidden) runs on ROCm, in the order
    ``CudaCommunicator.all_reduce`` tries its communicators: AITER's custom all-reduce when the communicator
    holds one; else vLLM's own ``CustomAllreduce`` when it was built (custom AR on, a supported world size; the
    platform's ``use_custom_allreduce``: gfx94x/gfx95x) and its ``should_custom_ar`` takes the message; else RCCL.

    The one input vLLM measures on real GPUs, whether the group is fully connected, is the serving image's
    declared mesh (:attr:`m3lab.vllm.target_image.TargetImage.fully_connected`, as the emulation set it).
    """
    from vllm._aiter_ops import rocm_aiter_ops
    if rocm_aiter_ops.get_aiter_allreduce() is not None:
        return "AITER custom all-reduce"
    return "vLLM custom all-reduce" if _vllm_custom_ar_takes(message, tp) else "RCCL / NCCL all-reduce"


def _vllm_custom_ar_takes(message, tp: int) -> bool:
    """``CustomAllreduce.should_custom_ar`` (vLLM's own size/contiguity rule) on a communicator built as
    ``CudaCommunicator.__init__`` builds it for the TP group, when it builds one."""
    import inspect
    import types
    import vllm.envs as envs
    from vllm.distributed import parallel_state
    from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce
    from vllm.platforms import current_platform
    if not (parallel_state._ENABLE_CUSTOM_ALL_REDUCE and current_platform.use_custom_allreduce()
            and tp in CustomAllreduce._SUPPORTED_WORLD_SIZES):
        return False
    built = types.SimpleNamespace(disabled=False, world_size=tp, fully_connected=stubs.AiterCustomAllreduceStandIn.fully_connected,
                                  batch_invariant=envs.VLLM_BATCH_INVARIANT,
                                  max_size=inspect.signature(CustomAllreduce).parameters["max_size"].default)
    return bool(CustomAllreduce.should_custom_ar(built, message))


def _norm_kernels(norm, tokens: int) -> tuple[str, ...]:
    import torch
    hidden = norm.weight.shape[0]
    x, res = torch.empty(tokens, hidden, dtype=torch.bfloat16), torch.empty(tokens, hidden, dtype=torch.bfloat16)
    trace = recorder.record(norm.forward, x, res)
    return trace.kernels


def norm(layer, tokens: int) -> Decision:
    """N1: what the built Gemma RMSNorm module launches (fused residual add + norm)."""
    module = layer.input_layernorm
    kernels = _norm_kernels(module, tokens)
    path = "triton_gemma_rmsnorm" if any("gemma" in k and k.startswith("_") for k in kernels) else (
        "flashinfer_gemma_rmsnorm" if any("flashinfer" in k for k in kernels) else kernels[0])
    return Decision("norm", "model", "N1", path, kernels,
                    (Check("norm module vLLM built", type(module).__name__, True, cite_of(type(module))),),
                    cite_of(type(module).forward), vllm=f"{type(module).__name__} -> {kernels[0]}")


def activation(kind: str, mlp, tokens: int, what: str) -> Decision:
    """N3: the activation of a dense MLP or the unfused shared expert, as its module runs it."""
    import torch
    inter = mlp.down_proj.input_size_per_partition
    (gate_up,) = (torch.empty(tokens, 2 * inter, dtype=torch.bfloat16),)
    if hasattr(mlp, "act_fn"):
        trace = recorder.record(mlp.act_fn, gate_up)
        body = type(mlp.act_fn).forward
    else:
        from vllm.models.minimax_m3.amd.ops import swiglu_oai_split
        trace = recorder.record(swiglu_oai_split, gate_up, alpha=mlp.swiglu_alpha, beta=mlp.swiglu_beta,
                                limit=mlp.swiglu_limit)
        body = type(mlp).forward
    kernels = trace.kernels
    path = "triton_swiglu_oai" if "_swiglu_oai_kernel" in kernels else (
        "silu_and_mul_with_clamp" if any("silu_and_mul" in k for k in kernels) else kernels[0])
    return Decision("activation", kind, "N3", path, kernels,
                    (Check(f"{what} MLP intermediate per rank", inter, True, cite_of(type(mlp).__init__)),),
                    cite_of(body), vllm=f"{type(mlp).__name__} -> {kernels[0]}")


def graphs(vllm_config, model, layers, tokens: int, decode: bool, requests: int) -> Decision:
    """A8: the CUDA-graph mode for the step, as vLLM's model runner resolves it: the attention backends' graph
    support (``get_cudagraph_support``) -> ``resolve_cudagraph_mode_and_sizes`` -> the runner's dispatch
    (Model Runner V2: ``CudaGraphManager.dispatch`` with its graphs captured; V1: ``CudagraphDispatcher``)."""
    import copy

    from vllm.v1.attention.backend import AttentionCGSupport
    support, weakest = AttentionCGSupport.ALWAYS, None
    for backend, spec in _backends(vllm_config, layers):
        s = backend.get_builder_cls().get_cudagraph_support(vllm_config, spec)
        if s.value < support.value:
            support, weakest = s, backend.__name__
    vc, cc = copy.copy(vllm_config), copy.copy(vllm_config.compilation_config)
    for name in ("cudagraph_capture_sizes", "compile_sizes"):  # the lists the resolution rewrites
        if isinstance(getattr(cc, name, None), list):
            object.__setattr__(cc, name, list(getattr(cc, name)))
    object.__setattr__(vc, "compilation_config", cc)  # vLLM's runner resolves on its own copy too
    q, v2 = vllm_config.uniform_decode_query_len, bool(vllm_config.use_v2_model_runner)
    if v2:
        runtime, mode, fn = _v2_dispatch(vc, model, support, weakest, q, tokens, decode, requests)
    else:
        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
        mode = cc.resolve_cudagraph_mode_and_sizes(support, weakest, q, use_v2_model_runner=False,
                                                   max_num_reqs=vllm_config.scheduler_config.max_num_seqs)
        dispatcher = CudagraphDispatcher(vc)
        dispatcher.initialize_cudagraph_keys(mode, q)
        runtime, fn = dispatcher.dispatch(tokens, uniform_decode=decode)[0], CudagraphDispatcher.dispatch
    path = {"FULL": "full", "PIECEWISE": "piecewise", "NONE": "eager"}[runtime.name]
    checks = (Check("configured cudagraph_mode", vllm_config.compilation_config.cudagraph_mode.name, True,
                    cite_of(type(vllm_config.compilation_config))),
              Check("weakest attention backend's graph support", f"{support.name} ({weakest})", True,
                    cite_of(AttentionCGSupport)),
              Check("resolved mode (resolve_cudagraph_mode_and_sizes)", mode.name, mode.name != "NONE",
                    cite_of(type(vllm_config.compilation_config).resolve_cudagraph_mode_and_sizes)),
              Check(f"{'V2' if v2 else 'V1'} runner's dispatch of {tokens} tokens (uniform decode: {decode})",
                    runtime.name, runtime.name != "NONE", cite_of(fn)))
    return Decision("cuda_graphs", "model", "A8", path, (), checks, cite_of(fn),
                    note="indexer + attend run inside FULL graphs for uniform decode; under PIECEWISE capture "
                         "they run eagerly (@eager_break_during_capture)", vllm=runtime.name)


def _v2_dispatch(vc, model, support, weakest, q: int, tokens: int, decode: bool, requests: int):
    """Model Runner V2: the mode its ``initialize`` resolves and what its graph manager dispatches for the
    step, with every graph captured (as after start-up)."""
    import torch
    from vllm import envs
    from vllm.v1.worker.gpu import cudagraph_utils as cg
    piecewise = bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH or cg.has_compiled_submodule(model))
    mode = vc.compilation_config.resolve_cudagraph_mode_and_sizes(
        support, weakest, q, use_v2_model_runner=True, max_num_reqs=vc.scheduler_config.max_num_seqs,
        piecewise_capture_available=piecewise)
    manager = cg.CudaGraphManager(vc, torch.device("cpu"), mode, decode_query_len=q)
    manager._graphs_captured = True
    uniform = tokens // requests if decode else None
    desc = manager.dispatch(requests, tokens, uniform, 0, max_query_len=uniform if decode else tokens)
    return desc.cg_mode, mode, cg.CudaGraphManager.dispatch


def _backends(vllm_config, layers):
    """(attention backend, KV cache spec) of every attention the model holds (dense, sparse, indexer)."""
    for layer in layers.values():
        attn = layer.self_attn
        if hasattr(attn, "indexer"):
            yield attn.get_attn_backend(), attn.get_kv_cache_spec(vllm_config)
            cache = attn.indexer.index_cache
            yield cache.get_attn_backend(), cache.get_kv_cache_spec(vllm_config)
        else:
            yield attn.attn.attn_backend, attn.attn.get_kv_cache_spec(vllm_config)


def monokernel(model, vllm_config, tokens: int, main_md, mode) -> Decision | None:
    """M3: the monokernel (``--monokernel``) for this step, when vLLM accepted it at start-up."""
    spec = getattr(model.language_model.model, "specialized_decode_config", None)
    if spec is None:
        return None
    from vllm.models.minimax_m3.amd.specialized_decode.runtime import routing
    step = routing.decide_step(spec, tokens, mode, main_md)
    checks = (Check("routing.decide_step", step.reason or "monokernel", step.use_mono, cite_of(routing.decide_step)),)
    kernels = (f"minimax_m3_mono_ffn_s{tokens}_tp{vllm_config.parallel_config.tensor_parallel_size}",)
    return Decision("monokernel", "sparse", "M3", "mono_ffn" if step.use_mono else "stock_layers",
                    kernels if step.use_mono else (), checks, cite_of(routing.decide_step),
                    note="replaces the post-attention AR + norm, router, shared + routed experts and the MoE AR of "
                         "each sparse layer with one persistent launch" if step.use_mono else
                         f"this step runs the stock layers ({step.reason})", vllm=str(step.use_mono))

