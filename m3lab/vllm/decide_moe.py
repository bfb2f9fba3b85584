"""vLLM's M3 MoE decisions (G3 router GEMM, M1 routing and shared-expert fusion, M2 experts), read off the
MoE layer vLLM built (``amd/model.py::MiniMaxM3MoE`` / ``nvidia/model.py``) and run on fake tensors.

- shared-expert fusion: ``MiniMaxM3MoE.is_fused_shared_expert_enabled`` / ``use_aiter_moe_fse`` as the
  constructor set them;
- routing: the router object vLLM built (``GroupedTopKRouter`` / ``FusedTopKBiasRouter``), whose
  ``select_experts`` is run on meta tensors (it reaches AITER ``biased_grouped_topk`` or vLLM's
  ``_moe_C.topk_sigmoid``);
- router GEMM: ``GateLinear.forward`` on a meta copy of the built gate picks the tier (after vLLM's own
  post-load hook built the bf16x3 weight split); the tier's custom-op body is run on fake CUDA tensors for
  the step's rows;
- experts: the backend and expert class the quant method's oracle chose (``select_mxfp8_moe_backend``,
  ``select_mxfp4_moe_backend``, ``select_unquantized_moe_backend``) while vLLM built the layer.
"""
from __future__ import annotations

import contextlib
import re
import sys

from m3lab.vllm import recorder
from m3lab.vllm.cite import cite_of
from m3lab.vllm.fastpath_types import Check, Decision, ExpertShape

# expert class vLLM selected -> (path id, what it launches: vLLM's Triton kernels or the library call)
EXPERTS = {
    "AiterMxfp8Experts": ("aiter_mxfp8_flydsl", ("aiter fused_moe (FlyDSL MXFP8 2-stage)",)),
    "Mxfp8NativeTritonExperts": ("triton_mxfp8_native", ("moe_align_block_size", "_mxfp8_grouped_gemm_kernel",
                                                         "_swiglu_oai_quant_kernel", "_mxfp8_grouped_gemm_kernel")),
    "Mxfp8EmulationTritonExperts": ("mxfp8_emulation", ("MXFP8 experts dequantised to BF16", "fused_moe_kernel")),
    "AiterMxfp4Experts": ("aiter_mxfp4_mxfp4", ("aiter fused_moe (CK W4A4, BLOCK_1X32)",)),
    "AiterUnquantizedExperts": ("aiter_ck_fused_moe", ("aiter fused_moe (CK 2-stage, BF16)",)),
    "TritonExperts": ("triton_fused_moe", ("fused_moe_kernel",)),
    "OCP_MXQuantizationEmulationTritonExperts": ("mxfp4_emulation", ("dequant_mxfp4 (every local expert, each forward)",
                                                                     "fused_moe_kernel")),
    "MarlinExperts": ("marlin", ("Marlin MoE GEMM (weight-only)",)),
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name.removesuffix("Experts")).lower()


def fusion(kind: str, moe, asked: bool) -> Decision | None:
    """The ``shared_expert_fusion`` row when fusion was asked for and vLLM turned it off (else None)."""
    if not asked or getattr(moe, "is_fused_shared_expert_enabled", False):
        return None
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.layers.quantization.utils.config_utils import is_shared_expert_quant_fse_compatible
    cfg = get_current_vllm_config()
    ep = cfg.parallel_config.enable_expert_parallel
    prefix = moe.experts.layer_name.rsplit(".experts", 1)[0] if hasattr(moe.experts, "layer_name") else ""
    compat, why = is_shared_expert_quant_fse_compatible(cfg.quant_config, f"{prefix}.experts",
                                                        f"{prefix}.shared_experts")
    checks = (Check("enable_expert_parallel", ep, not ep, cite_of(type(moe).__init__, "enable_expert_parallel")),
              Check("is_shared_expert_quant_fse_compatible", why or "yes", compat,
                    cite_of(is_shared_expert_quant_fse_compatible)))
    reason = "; ".join(c.name + ("" if c.value in (True, False) else f": {c.value}") for c in checks if not c.holds)
    return Decision("shared_expert_fusion", kind, "M1", "fse_off", (), checks, cite_of(type(moe).__init__),
                    status="off", note=f"asked for but vLLM turns it off ({reason or 'not built'})",
                    vllm="is_fused_shared_expert_enabled=False")


def routing(kind: str, moe, tokens: int) -> Decision:
    """M1: the router vLLM built and the top-k kernel its ``select_experts`` reaches."""
    import torch
    router = moe.experts.router
    fse = bool(getattr(moe, "is_fused_shared_expert_enabled", False))
    aiter_append = bool(getattr(moe, "use_aiter_moe_fse", False))
    h, logits = recorder.meta(((tokens, moe.experts.moe_config.hidden_dim), torch.bfloat16),
                              ((tokens, moe.experts.moe_config.num_experts), torch.float32))
    trace = recorder.record(router.select_experts, h, logits)
    reached = trace.stopped_at or ", ".join(trace.kernels)
    aiter = "biased_grouped_topk" in reached
    path = ("aiter_biased_grouped_topk" + ("_fse" if aiter_append else "") if aiter else
            "topk_bias_router_cat_shared" if fse else "topk_bias_router")
    fusion = (Check("shared expert fused (MiniMaxM3MoE.is_fused_shared_expert_enabled)", fse, fse,
                    cite_of(type(moe).__init__, "self.is_fused_shared_expert_enabled = True")),
              Check("appended inside AITER's top-k (use_aiter_moe_fse)", aiter_append, aiter_append,
                    cite_of(type(moe).__init__, "self.use_aiter_moe_fse = ")))
    checks = (*(fusion if "amd" in type(moe).__module__ else ()),  # the NVIDIA model has no fusion
              Check(f"{type(router).__name__}.select_experts reaches", reached, True, trace.stop_site))
    note = ("shared expert id appended in AITER's kernel (top-k + 1), routed scaling inside AITER" if aiter_append
            else "shared expert appended by the vLLM router (torch.cat)" if fse else
            "top-k routed; separate shared-expert MLP" if getattr(moe, "shared_experts", None) is not None else "top-k routed")
    return Decision("routing", kind, "M1", path, trace.kernels, checks, trace.stop_site or cite_of(type(router)),
                    note=note, vllm=f"{type(router).__name__} -> {reached}")


def router(kind: str, moe, tokens: int) -> Decision:
    """G3: the router GEMM tier ``GateLinear.forward`` takes, then that tier's body at ``tokens`` rows."""
    import torch
    gate = moe.gate
    if getattr(gate, "_bf16x3_weight", None) is None and getattr(gate, "allow_rocm_bf16x3_router_gemm", False):
        # vLLM's post-load hook builds the bf16x3 split and refuses a weight holding inf/NaN; a checkpoint's router
        # weight is finite, the emulated model's is uninitialised memory, so it is zeroed first (values unused)
        with torch.no_grad():
            gate.weight.zero_()
        gate.quant_method.process_weights_after_loading(gate)
    (x,) = recorder.meta(((tokens, gate.weight.shape[1]), torch.bfloat16))
    with _on_meta(gate):
        tier = recorder.record(gate.forward, x)
    op = next((o for o in tier.ops if o.startswith("vllm.")), None)
    checks = [Check("GateLinear.forward tier", op or ", ".join(tier.ops), True, tier.sites.get(op or "", None))]
    body = _custom_op_impl(op) if op else None
    if body is None:
        return Decision("router", kind, "G3", "fp32_linear", tier.kernels, tuple(checks),
                        tier.sites.get(tier.events[0]) if tier.events else cite_of(type(gate).forward),
                        vllm=f"GateLinear.forward -> {', '.join(tier.kernels)}")
    args = [((tokens, gate.weight.shape[1]), torch.bfloat16), (tuple(gate.weight.shape), gate.weight.dtype)]
    if "bf16x3" in op:
        args.append((tuple(gate._bf16x3_weight.shape), torch.bfloat16))
    fakes = recorder.fake_cuda(*args)
    extra = () if "bf16x3" in op else (bool(getattr(gate, "allow_bf16x3_router_gemm", False)),)
    trace = recorder.record(body, *fakes, *extra)
    kernels = trace.kernels
    path = ("rocm_bf16x3" if "_reduce_terms_kernel" in kernels else
            "rocm_fp32_router_gemm" if "_rocm_fp32_router_gemm_kernel" in kernels else
            "fp32_router_gemm" if any("fp32_router_gemm" in k for k in kernels) else "fp32_linear")
    site = next((trace.sites[e] for e in trace.events if trace.sites.get(e)), None) or trace.stop_site
    checks.append(Check(f"{body.__name__} at {tokens} rows", ", ".join(kernels), True, site))
    return Decision("router", kind, "G3", path, kernels, tuple(checks), site or cite_of(body),
                    vllm=f"{op} -> {', '.join(kernels)}")


@contextlib.contextmanager
def _on_meta(module):
    """``module``'s parameters and its bf16x3 split as meta tensors while the block runs (restored after)."""
    import torch
    saved = dict(module._parameters)
    split = getattr(module, "_bf16x3_weight", None)
    for name, p in saved.items():
        if p is not None:
            module._parameters[name] = torch.empty(p.shape, dtype=p.dtype, device="meta")
    if split is not None:
        module._bf16x3_weight = torch.empty(split.shape, dtype=split.dtype, device="meta")
    try:
        yield
    finally:
        module._parameters.update(saved)
        if split is not None:
            module._bf16x3_weight = split


def _custom_op_impl(op: str):
    """The Python body vLLM registered for custom op ``vllm.<name>`` (vLLM names it ``<name>_impl``)."""
    name = op.split(".", 1)[1] + "_impl"
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith("vllm.") and callable(getattr(mod, name, None)):
            return getattr(mod, name)
    return None


def experts(kind: str, moe, shape: ExpertShape) -> Decision:
    """M2: the expert backend and class vLLM's oracle chose while building the layer."""
    method = moe.experts._quant_method
    backend = next((v for k, v in vars(method).items() if k.endswith("_backend")), None)
    cls = getattr(method, "experts_cls", None)
    name = cls.__name__ if cls is not None else type(method).__name__
    path, kernels = EXPERTS.get(name, (_snake(name), (name,)))
    mc = moe.experts.moe_config
    ok = (mc.num_local_experts, mc.intermediate_size_per_partition) == (shape.experts, shape.inter)
    checks = (Check("ParallelPlan's expert rows / width = vLLM's", f"plan {shape.experts} x {shape.inter}, "
                    f"vLLM {mc.num_local_experts} x {mc.intermediate_size_per_partition}", ok, cite_of(type(mc))),
              Check(f"{type(method).__name__} backend (the oracle's pick)", str(backend), True,
                    cite_of(type(method).__init__)),
              Check("expert class", name, True, cite_of(cls) if cls is not None else None))
    return Decision("experts", kind, "M2", path, kernels, checks, cite_of(cls) if cls is not None else
                    cite_of(type(method)), shape=shape, vllm=f"{getattr(backend, 'name', backend)} -> {name}")
