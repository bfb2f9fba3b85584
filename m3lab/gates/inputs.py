"""Fresh random inputs for the gates and the benchmarks (never zeros, never a fixed seed)."""
import torch

from ..kernels.moe import routing
from ..kernels.mx.reference import quantize_mxfp4, quantize_mxfp8


def blocky(rows: int, k: int, device: torch.device, dtype=torch.float32, spread: int = 8) -> torch.Tensor:
    """[rows, k] normal values whose 32-element blocks span 2**-spread … 2**spread in magnitude."""
    x = torch.randn(rows, k, device=device)
    nb = (k + 31) // 32
    e = torch.randint(-spread, spread + 1, (rows, nb), device=device).float()
    return (x * torch.exp2(e).repeat_interleave(32, 1)[:, :k]).to(dtype)


def act_dtype(device: torch.device) -> torch.dtype:
    """bf16 on a GPU; fp16 in the CPU interpreter (whose bf16 tl.dot is wrong)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float16


def make_weights(e: int, h: int, i: int, fmt: str, dtype: torch.dtype, device) -> dict:
    """w13 [E, 2I, H], w2 [E, H, I] (± MX scales) as fused_moe takes them; values scaled to keep act O(1)."""
    w13 = torch.randn(e, 2 * i, h, device=device) * (2.0 / h ** 0.5)
    w2 = torch.randn(e, h, i, device=device) / i ** 0.5
    if fmt == "bf16":
        return {"w13": w13.to(dtype), "w2": w2.to(dtype), "fmt": fmt}
    q = {"mxfp8": quantize_mxfp8, "mxfp4": quantize_mxfp4}[fmt]
    w13q, s13 = q(w13)
    w2q, s2 = q(w2)
    return {"w13": w13q, "w2": w2q, "w13_scale": s13, "w2_scale": s2, "fmt": fmt}


def make_routing(t: int, experts: int, topk: int, device, shared: bool = True, convention: str = "scaled_weights",
                 skew: float = 0.0) -> routing.Routing:
    """vLLM's routing on random logits (skew > 0: Zipf-like logits favouring low expert ids)."""
    logits = torch.randn(t, experts, device=device)
    if skew:
        logits = logits - skew * torch.log1p(torch.arange(experts, device=device, dtype=torch.float32))
    bias = 0.1 * torch.randn(experts, device=device)
    return routing.route(logits, bias, topk=topk, routed_scaling=2.0, shared_id=experts if shared else None,
                         convention=convention)
