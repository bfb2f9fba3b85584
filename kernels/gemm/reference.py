"""``y = x @ Wᵀ`` in plain torch for every weight format: the ground truth for the Triton GEMMs.

Weight formats (``w`` is ``[N, K]`` in every case except mxfp4):

- ``"bf16"``: unquantised floating weights (bf16 on a GPU; fp16/fp32 in CPU tests), no scale.
- ``"fp8"``: ``float8_e4m3fn [N, K]`` with ``w_scale`` float32 either per output channel ``[N]`` or
  per block ``[ceil(N/128), ceil(K/128)]`` (DeepSeek-style 128×128 blocks); ``W = q * scale``.
- ``"mxfp8"``: ``float8_e4m3fn [N, K]`` with E8M0 ``w_scale`` uint8 ``[N, K/32]``.
- ``"mxfp4"``: packed E2M1 ``uint8 [N, K/2]`` (first element in the low nibble) with ``w_scale`` uint8 ``[N, K/32]``.

Accumulation is fp32 on weights dequantised to fp32; the result is returned in ``x.dtype``.
"""
import torch

from ..mx.reference import dequantize_mxfp4, dequantize_mxfp8, quantize_mxfp4, quantize_mxfp8

W_FORMATS = ("bf16", "fp8", "mxfp8", "mxfp4")
FP8_BLOCK = 128  # block-scaled fp8: one fp32 scale per 128×128 weight block


def dequantize_weight(w: torch.Tensor, w_format: str, w_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Weights in any format -> float32 [N, K]."""
    if w_format not in W_FORMATS:
        raise ValueError(f"w_format: {w_format!r} is not one of {W_FORMATS}")
    if w_format == "bf16":
        return w.float()
    if w_scale is None:
        raise ValueError(f"w_scale: required for w_format={w_format!r}")
    if w_format == "mxfp8":
        return dequantize_mxfp8(w, w_scale)
    if w_format == "mxfp4":
        return dequantize_mxfp4(w, w_scale)
    n, k = w.shape
    if w_scale.dim() == 1:                      # per output channel [N]
        return w.float() * w_scale.float()[:, None]
    s = w_scale.float().repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:n, :k]
    return w.float() * s


def linear_ref(x: torch.Tensor, w: torch.Tensor, *, w_format: str = "bf16",
               w_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K], w as above -> y [M, N] = x @ dequant(w)ᵀ, fp32 accumulation, returned in x.dtype."""
    wf = dequantize_weight(w, w_format, w_scale)
    if x.shape[-1] != wf.shape[1]:
        raise ValueError(f"x: K={x.shape[-1]} does not match the weight's K={wf.shape[1]}")
    return (x.float() @ wf.T).to(x.dtype)


def quantize_weight(w: torch.Tensor, w_format: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float weights [N, K] -> (w in w_format, w_scale) as :func:`linear_ref` takes them (test/bench helper).

    fp8 uses per-channel scales (amax / 448); bf16 returns ``w.to(bfloat16)`` unless w is fp16/fp32 already.
    """
    if w_format == "bf16":
        return w, None
    if w_format == "fp8":
        scale = (w.float().abs().amax(dim=1) / 448.0).clamp(min=1e-12)
        return (w.float() / scale[:, None]).to(torch.float8_e4m3fn), scale
    if w_format == "mxfp8":
        return quantize_mxfp8(w)
    if w_format == "mxfp4":
        return quantize_mxfp4(w)
    raise ValueError(f"w_format: {w_format!r} is not one of {W_FORMATS}")
