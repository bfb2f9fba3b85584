"""Elementwise pieces of the decoder: Gemma RMSNorm, partial NeoX RoPE, SwiGLU-OAI MLP math, linear.

All math in fp32, results in the input dtype. Shapes in the docstrings.
"""
import torch
import torch.nn.functional as F

from m3lab.kernels.gemm.reference import linear_ref


def gemma_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x [..., d], zero-centred weight w [d]: x / sqrt(mean(x^2) + eps) * (1 + w)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (y * (1.0 + w.float())).to(x.dtype)


def head_norms(q, k, iq=None, ik=None, *, q_w, k_w, iq_w=None, ik_w=None, eps: float = 1e-6):
    """Per-head Gemma RMSNorm of q [T, Hq, D], k [T, Hkv, D] (and index iq [T, Hi, Di], ik [T, 1, Di])."""
    out = [gemma_rms_norm(q, q_w, eps), gemma_rms_norm(k, k_w, eps)]
    if iq is not None:
        out += [gemma_rms_norm(iq, iq_w, eps), gemma_rms_norm(ik, ik_w, eps)]
    return tuple(out)


def rope_cos_sin(pos: torch.Tensor, rotary_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rotary_dim / 2] (fp32) for positions pos [T]: angle_i = p * theta^(-2i / rotary_dim)."""
    half = rotary_dim // 2
    inv = theta ** (-torch.arange(half, device=pos.device, dtype=torch.float64) * 2 / rotary_dim)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def apply_partial_rope(z: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX (rotate-half) RoPE on the first 2*len(cos) channels of z [T, H, D]; the rest unchanged."""
    half = cos.shape[-1]
    zf = z.float()
    a, b, rest = zf[..., :half], zf[..., half:2 * half], zf[..., 2 * half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([a * c - b * s, b * c + a * s, rest], dim=-1).to(z.dtype)


def rope(q, k, iq=None, ik=None, *, pos, rotary_dim: int, theta: float):
    """Partial RoPE at positions pos [T] on q, k (and the index branch iq, ik with the same angles)."""
    cos, sin = rope_cos_sin(pos, rotary_dim, theta)
    out = [apply_partial_rope(t, cos, sin) for t in (q, k)]
    if iq is not None:
        out += [apply_partial_rope(t, cos, sin) for t in (iq, ik)]
    return tuple(out)


def linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor | None = None, *,
           w_format: str = "bf16") -> torch.Tensor:
    """y = x · w^T: x [M, K], w [N, K] -> [M, N] in x.dtype.

    Plain float weights use torch's matmul (fp32 accumulation); MX/fp8 formats go through
    ``kernels/gemm/reference.py:linear_ref`` (the one place that dequantises).
    """
    if w_format in ("bf16", "fp32", "fp16"):
        return F.linear(x, w.to(x.dtype))
    return linear_ref(x, w, w_format=w_format, w_scale=w_scale)


def router_logits(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Router in fp32 (vLLM upcasts the activations): x [T, H], w [E, H] fp32 -> [T, E] fp32."""
    return F.linear(x.float(), w.float())


def identity_allreduce(x: torch.Tensor) -> torch.Tensor:
    """All-reduce over the TP group as seen by one simulated rank: identity (the op is recorded)."""
    return x
