"""The dense GEMMs of vLLM's M3 (G1 unquantised, G2 MXFP8): which kernel runs, decided by vLLM's own code.

Per linear layer of the built model (:mod:`m3lab.vllm.vllm_build`) the quant method vLLM bound and, for
MXFP8, the linear kernel class its selector chose (``RocmDotScaledMxfp8LinearKernel`` on gfx95x,
``EmulationMxfp8LinearKernel`` on gfx942, ``MarlinMxfp8LinearKernel`` on CUDA). Then, per step, the body that
runs for ``m`` rows is called on fake tensors (:mod:`m3lab.vllm.recorder`):

- MXFP8 on ROCm: ``rocm_native._mxfp8_dot_scaled_linear`` (quantiser + ``_mxfp8_linear_kernel`` with the tile
  ``_select_cfg`` picked, imported under the target so its gfx950 stage constant is the target's);
- unquantised: the function ``dispatch_unquantized_gemm()`` returns for the platform (on ROCm the body of
  ``rocm_unquantized_gemm``: skinny ``wvSplitKrc`` / ``wvSplitK`` / ``LLMM1``, AITER Triton or ``tgemm``,
  or hipBLASLt via ``F.linear``; on CUDA ``F.linear``).

The local shape printed is :class:`~m3lab.spec.plan.ParallelPlan`'s (the owner of local widths), checked
against the width vLLM's module holds.
"""
from __future__ import annotations

from m3lab.vllm import recorder
from m3lab.vllm.cite import cite_of
from m3lab.vllm.emulate import Target, emulate
from m3lab.vllm.fastpath_types import Check, Decision, GemmShape

# The library entry or compiled op where vLLM's unquantised body went -> path id
UNQUANTIZED_PATHS = {
    "torch.ops._rocm_C.wvSplitKrc": "skinny_wvsplitkrc",
    "torch.ops._rocm_C.wvSplitK": "skinny_wvsplitk",
    "torch.ops._rocm_C.LLMM1": "skinny_llmm1",
    "aiter.ops.triton.gemm_a16w16.gemm_a16w16": "aiter_triton_gemm",
    "aiter.tuned_gemm.tgemm.mm": "aiter_tgemm",
}
# MXFP8 linear kernel class vLLM selected -> (path id, what it launches) for the kernels m3lab cannot run here
MXFP8_KERNELS = {
    "EmulationMxfp8LinearKernel": ("mxfp8_bf16_emulation", ("MXFP8 weights dequantised to BF16", "BF16 GEMM")),
    "MarlinMxfp8LinearKernel": ("marlin_mxfp8", ("Marlin MXFP8 weight-only GEMM (BF16 activations)",)),
}


def _width_check(module, shape: GemmShape) -> Check:
    n, k = module.output_size_per_partition, module.input_size_per_partition
    ok = (n, k) == (shape.n, shape.k)
    return Check("ParallelPlan's local width = vLLM's module", f"plan N={shape.n} K={shape.k}, vLLM N={n} K={k}",
                 ok, cite_of(type(module).__init__))


def gemm(op: str, kind: str, module, shape: GemmShape, note: str = "") -> Decision:
    """The G1/G2 decision for ``module`` (a vLLM linear layer of the built model) at ``shape``."""
    method = module.quant_method
    kernel = getattr(method, "kernel", None)
    checks = [_width_check(module, shape),
              Check("quant method vLLM bound", type(method).__name__, True, cite_of(type(method)))]
    if kernel is not None:
        return _mxfp8(op, kind, module, kernel, shape, checks, note)
    return _unquantized(op, kind, shape, checks, note)


def _mxfp8(op, kind, module, kernel, shape: GemmShape, checks: list, note: str) -> Decision:
    import torch
    name = type(kernel).__name__
    ok, why = type(kernel).is_supported()
    checks.append(Check(f"{name}.is_supported", why or "yes", ok, cite_of(type(kernel).is_supported)))
    if name in MXFP8_KERNELS:
        path, kernels = MXFP8_KERNELS[name]
        return Decision(op, kind, "G2", path, kernels, tuple(checks), cite_of(type(kernel).apply_weights),
                        shape=shape, note=note, vllm=name)
    native = recorder_module()
    x, w, s = recorder.fake_cuda(((shape.m, shape.k), torch.bfloat16), ((shape.n, shape.k), torch.float8_e4m3fn),
                                 ((shape.n, shape.k // 32), torch.uint8))
    trace = recorder.record(native._mxfp8_dot_scaled_linear, x, w, s)
    launch = trace.launch("_mxfp8_linear_kernel")
    tile = (launch.get("BLOCK_M"), launch.get("BLOCK_N"), launch.get("BLOCK_K"), launch.get("num_warps"),
            launch.get("num_stages"))
    decode_tile = tuple(native._select_cfg(1, shape.n, shape.k))
    regime = "decode" if tile == decode_tile else "prefill"
    checks.append(Check("tile vLLM launches (_select_cfg): BLOCK_M x N x K, warps, stages",
                        f"{tile[0]}x{tile[1]}x{tile[2]}, {tile[3]} warps, {tile[4]} stages",
                        True, trace.sites.get("_mxfp8_linear_kernel")))
    checks.append(Check("the one-row (decode) tile", "yes" if regime == "decode" else f"no: {decode_tile}",
                        regime == "decode", cite_of(native._select_cfg)))
    return Decision(op, kind, "G2", f"mxfp8_dot_scaled_{regime}", trace.kernels, tuple(checks),
                    cite_of(native._select_cfg), shape=shape, note=note, vllm=f"{name}, tile {tile}")


def recorder_module():
    """vLLM's ROCm native MXFP8 linear module (imported under the emulated target)."""
    from vllm.model_executor.kernels.linear.mxfp8 import rocm_native
    return rocm_native


def is_decode_tile(m: int, n: int, k: int) -> bool:
    """Whether vLLM's MXFP8 ``_select_cfg`` gives ``m`` rows the tile of one row (its decode tile)."""
    native = recorder_module()
    return tuple(native._select_cfg(m, n, k)) == tuple(native._select_cfg(1, n, k))


def _unquantized(op, kind, shape: GemmShape, checks: list, note: str) -> Decision:
    import torch
    from vllm.model_executor.layers import utils
    chosen = utils.dispatch_unquantized_gemm()
    body = utils.rocm_unquantized_gemm_impl if chosen is utils.rocm_unquantized_gemm else chosen
    x, w = recorder.meta(((shape.m, shape.k), torch.bfloat16), ((shape.n, shape.k), torch.bfloat16))
    args = (x, w) if body is utils.rocm_unquantized_gemm_impl else (None, x, w)
    trace = recorder.record(body, *args)
    if trace.stopped_at:
        path = UNQUANTIZED_PATHS.get(trace.stopped_at, trace.stopped_at.rsplit(".", 1)[-1])
        site = trace.stop_site
    else:
        path = "hipblaslt" if body is utils.rocm_unquantized_gemm_impl else "cublas"
        site = next((trace.sites[e] for e in trace.events if e.startswith("aten.")), None)
    checks.append(Check("dispatch_unquantized_gemm() for the platform", chosen.__name__, True,
                        cite_of(utils.dispatch_unquantized_gemm)))
    checks.append(Check(f"{body.__name__} at {shape.m} rows reaches", trace.stopped_at or ", ".join(trace.ops),
                        True, site))
    kernels = trace.kernels or ("F.linear",)
    return Decision(op, kind, "G1", path, kernels, tuple(checks), site or cite_of(body), shape=shape,
                    note=note, vllm=f"{body.__name__} -> {kernels[-1]}")


def lm_head(module, shape: GemmShape) -> Decision:
    """The LM head (vocab-parallel, BF16 in every M3 checkpoint): the unquantised GEMM for ``shape``."""
    n, k = module.num_embeddings_per_partition, module.embedding_dim
    checks = [Check("ParallelPlan's local vocab = vLLM's (padded to 64, then split)",
                    f"plan N={shape.n} K={shape.k}, vLLM N={n} K={k}", (n, k) == (shape.n, shape.k),
                    cite_of(type(module).__init__)),
              Check("quant method vLLM bound", type(module.quant_method).__name__, True,
                    cite_of(type(module.quant_method)))]
    return _unquantized("lm_head", "model", shape, checks, "logits only for the sampled rows")


def tile_regime(hardware, m: int, n: int, k: int) -> str:
    """``"decode"`` when vLLM's MXFP8 ``_select_cfg`` on ``hardware`` gives (m, n, k) the one-row tile, else
    ``"prefill"`` (run in the target's worker process: it enters the emulated platform)."""
    with emulate(Target.of(hardware)):
        return "decode" if is_decode_tile(m, n, k) else "prefill"
