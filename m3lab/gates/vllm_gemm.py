"""Gate for vLLM's MXFP8 linear against ``kernels/gemm/reference.linear_ref``.

``vllm.mxfp8_linear``: vLLM's own launcher ``_mxfp8_dot_scaled_linear``
(``vllm/model_executor/kernels/linear/mxfp8/rocm_native.py``), called as vLLM calls it: it quantises the
activations per 32 with vLLM's quantiser (``mxfp8_e4m3_quantize`` -> ``torch.ops.vllm.mxfp8_quantize``, whose
body picks the fused Triton quantiser on ROCm and vLLM's torch quantiser ``_mxfp8_e4m3_quantize_torch``
elsewhere: on a CPU or an H200 the latter runs, and the gate's label names it), takes the tile from
``_select_cfg`` and launches ``_mxfp8_linear_kernel``. The gate feeds activations that MXFP8 represents
exactly (a fresh random x quantised and dequantised by kernels/mx), so the result must match ``linear_ref``
to fp32 rounding and any error is the kernel's or the quantiser's. vLLM allocates the output: it runs with
the module's ``torch.empty`` returning NaN-filled tensors (``vllm_act.poisoned_outputs``). CPU: the
interpreter (its ``tl.dot_scaled`` e4m3 × e4m3 is exact), fp16 activations, shapes that take each branch of
``_select_cfg`` (decode, narrow mid-M, prefill), N not a multiple of the tile. CUDA: the M3 TP4 shapes, bf16,
M from decode to prefill. K is a multiple of vLLM's BLOCK_K (its K loop is unmasked; its served K are
multiples of 128).
"""
import torch

from ..kernels.gemm.reference import linear_ref, quantize_weight
from ..kernels.mx.reference import dequantize_mxfp8, quantize_mxfp8
from ..optable.kernel_shapes import model_gemm_shapes
from ..vllm_src.imports import vllm_module
from .inputs import act_dtype
from .registry import Case, Gate, register
from .vllm_act import poisoned_outputs

CPU_PROBLEMS = ((1, 40, 512), (7, 100, 1024), (70, 48, 512), (300, 72, 256))
GPU_MS = (1, 33, 128, 2048)
LINEAR = "vllm.model_executor.kernels.linear.mxfp8.rocm_native"


def _linear_module():
    return vllm_module(LINEAR, "the vllm.mxfp8_linear gate")


def quantiser(device: torch.device) -> str:
    """Which of vLLM's MXFP8 quantisers ``_mxfp8_e4m3_quantize_impl`` takes for this device: its fused Triton
    kernel on ROCm, flashinfer on SM100 with flashinfer, else its torch quantiser."""
    from vllm.platforms import current_platform
    if current_platform.is_rocm():
        return "vllm-triton-quant"
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 10:
        return "vllm-flashinfer-or-torch-quant"
    return "vllm-torch-quant"


def _case(m: int, n: int, k: int, device: torch.device) -> Case:
    dtype = act_dtype(device)

    def run():
        mod = _linear_module()
        w, s = quantize_weight(torch.randn(n, k, device=device) / k**0.5, "mxfp8")
        x = dequantize_mxfp8(*quantize_mxfp8(torch.randn(m, k, device=device))).to(dtype)   # exact in MXFP8
        with poisoned_outputs(mod):
            out = mod._mxfp8_dot_scaled_linear(x, w, s)
        return out, linear_ref(x.float(), w, w_format="mxfp8", w_scale=s)
    return Case(f"M={m},N={n},K={k},{quantiser(device)}", str(dtype).removeprefix("torch."), run)


def _cases(device: torch.device):
    _linear_module()  # vLLM imported (its platform resolved) before the labels ask it
    if device.type != "cuda":
        return [_case(m, n, k, device) for m, n, k in CPU_PROBLEMS]
    return [_case(m, n, k, device) for n, k in model_gemm_shapes() for m in GPU_MS]


register(Gate("vllm.mxfp8_linear", "gemm", _cases,
              doc="vLLM's _mxfp8_dot_scaled_linear (its quantiser, _select_cfg tile, _mxfp8_linear_kernel) vs "
                  "linear_ref (MXFP8-exact activations)"))
