"""fp8 weights (e4m3 codes, fp32 scales per output channel or per SB_N x SB_K block) -> x's dtype, once.

The prefill kernels take fp8 weights dequantised this way (``launcher.DEQUANT_PREFILL``), as MX weights
(kernels/mx/triton_mx.dequantize): converting e4m3 to bf16 inside the K loop sends every weight tile from
shared memory through registers and back before the MMA, which ran the persistent kernel at about half its
bf16 rate on the H200 (M 2048, N 2304, K 6144: 211 µs with fp8 codes against 97 µs with bf16 weights;
dequantised first, 107 µs).
"""
import torch
import triton
import triton.language as tl

from ..launches import launch

BLOCK_N, BLOCK_K = 64, 128


@triton.jit
def fp8_dequant_kernel(p_w, p_s, p_out, N, K, s_wn, s_wk, s_sn, s_sk, s_on, s_ok,
                       SB_N: tl.constexpr, SB_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[n, k] = w[n, k] · scale (SB_K == 0: scale[n]; else scale[n // SB_N, k // SB_K]), rounded once."""
    o_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    m = (o_n[:, None] < N) & (o_k[None, :] < K)
    w = tl.load(p_w + o_n[:, None] * s_wn + o_k[None, :] * s_wk, mask=m, other=0.0).to(tl.float32)
    if SB_K == 0:
        s = tl.load(p_s + o_n * s_sn, mask=o_n < N, other=0.0)[:, None]
    else:
        s = tl.load(p_s + (o_n // SB_N)[:, None] * s_sn + (o_k // SB_K)[None, :] * s_sk, mask=m, other=0.0)
    tl.store(p_out + o_n[:, None] * s_on + o_k[None, :] * s_ok, (w * s).to(p_out.dtype.element_ty), mask=m)


def dequantize_fp8(w: torch.Tensor, s: torch.Tensor, s_sn: int, s_sk: int, sb_n: int, sb_k: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """w e4m3 [N, K] with scales ``s`` as ``launcher._scale_args`` gives them -> [N, K] in ``dtype``."""
    n, k = w.shape
    out = torch.empty(n, k, device=w.device, dtype=dtype)
    launch(fp8_dequant_kernel, (triton.cdiv(n, BLOCK_N), triton.cdiv(k, BLOCK_K)), w, s, out, n, k,
           w.stride(0), w.stride(1), s_sn, s_sk, out.stride(0), out.stride(1), SB_N=max(sb_n, 1), SB_K=sb_k,
           BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return out
