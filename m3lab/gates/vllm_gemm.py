"""Gate for vLLM's MXFP8 linear kernel against ``kernels/gemm/reference.linear_ref``.

``vllm.mxfp8_linear``: ``_mxfp8_linear_kernel`` with the tiles of ``_select_cfg``
(vllm/model_executor/kernels/linear/mxfp8/rocm_native.py:29-81, :128-215), launched by
:func:`m3lab.bench.gemm.vllm_mxfp8_linear` (the benchmark's ``vllm-mxfp8`` peer). vLLM quantises the
activations to MXFP8 per 32 before its ``tl.dot_scaled``; the gate feeds activations that MXFP8
represents exactly (a fresh random x quantised and dequantised by kernels/mx), so the kernel must match
``linear_ref`` to fp32 rounding and any error is the kernel's, not the quantiser's. Outputs are
NaN-poisoned. CPU: the interpreter (its ``tl.dot_scaled`` e4m3 × e4m3 is exact), fp16 activations, shapes
that take each branch of ``_select_cfg`` (decode, narrow mid-M, prefill), N not a multiple of the tile.
CUDA: the M3 TP4 shapes, bf16, M from decode to prefill. K is a multiple of vLLM's BLOCK_K (its K loop
is unmasked; its served K are multiples of 128).
"""
import torch

from ..kernels.gemm.reference import linear_ref, quantize_weight
from ..kernels.mx.reference import dequantize_mxfp8, quantize_mxfp8
from .checks import poison_
from .inputs import act_dtype
from .registry import Case, Gate, register

CPU_PROBLEMS = ((1, 40, 512), (7, 100, 1024), (70, 48, 512), (300, 72, 256))
GPU_MS = (1, 33, 128, 2048)


def _case(m: int, n: int, k: int, device: torch.device) -> Case:
    dtype = act_dtype(device)

    def run():
        from ..bench.gemm import vllm_mxfp8_linear
        w, s = quantize_weight(torch.randn(n, k, device=device) / k**0.5, "mxfp8")
        x = dequantize_mxfp8(*quantize_mxfp8(torch.randn(m, k, device=device))).to(dtype)   # exact in MXFP8
        out = poison_(torch.empty(m, n, device=device, dtype=dtype))
        vllm_mxfp8_linear(x, w, s, out=out)
        return out, linear_ref(x.float(), w, w_format="mxfp8", w_scale=s)
    return Case(f"M={m},N={n},K={k}", str(dtype).removeprefix("torch."), run)


def _cases(device: torch.device):
    if device.type != "cuda":
        return [_case(m, n, k, device) for m, n, k in CPU_PROBLEMS]
    from ..bench.gemm import model_gemm_shapes
    return [_case(m, n, k, device) for n, k in model_gemm_shapes() for m in GPU_MS]


register(Gate("vllm.mxfp8_linear", "gemm", _cases,
              doc="vLLM's _mxfp8_linear_kernel with _select_cfg tiles vs linear_ref (MXFP8-exact activations)"))
