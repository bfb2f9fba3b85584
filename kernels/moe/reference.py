"""Plain-torch reference of the MiniMax M3 MoE (vLLM ``vllm/models/minimax_m3/amd/model.py``).

Router: logits r = x·Wg^T in fp32, s = sigmoid(r), experts = top-k of (s + bias), weights = the
unbiased s of the chosen experts renormalised to sum 1, times ``routed_scaling`` (2.0).
Experts: gate_up weight w13 [E, 2I, H] = [all gate rows ; all up rows] (not interleaved), down
weight w2 [E, H, I]; act = SwiGLU-OAI: min(g, limit)·σ(alpha·min(g, limit))·(clip(u, ±limit) + 1).
A fused shared expert is one more expert row (id E_routed) with weight 1.0 for every token.
Weights may be MX-quantised: pass the scales and the format; they are dequantised per expert with
``kernels/mx/reference.py``. The SwiGLU constants (alpha, limit, beta) are always passed by the caller:
they are model facts (MiniMax M3: 1.702, 7.0, 1.0), held by the model description, not here.
"""
import torch


def swiglu_oai(h: torch.Tensor, *, alpha: float, limit: float, beta: float) -> torch.Tensor:
    """SwiGLU-OAI on uninterleaved [..., 2I] = [gate | up] -> [..., I] (computed in fp32, returned in h.dtype).

    act = min(g, limit) * sigmoid(alpha * min(g, limit)) * (clip(u, -limit, limit) + beta).
    """
    g, u = h.float().chunk(2, dim=-1)
    g = g.clamp(max=limit)
    u = u.clamp(min=-limit, max=limit)
    return (g * torch.sigmoid(alpha * g) * (u + beta)).to(h.dtype)


def route_sigmoid_bias(logits: torch.Tensor, bias: torch.Tensor, topk: int,
                       routed_scaling: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Router: logits [T, E] fp32, bias [E] fp32 -> (weights [T, topk] fp32 incl. scaling, ids [T, topk] int64)."""
    s = torch.sigmoid(logits.float())
    _, ids = torch.topk(s + bias.float(), topk, dim=-1)
    w = s.gather(1, ids)
    w = w / w.sum(dim=-1, keepdim=True)
    return w * routed_scaling, ids


def append_shared_expert(weights: torch.Tensor, ids: torch.Tensor, shared_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused shared expert: add expert ``shared_id`` with weight 1.0 to every token: [T, k] -> [T, k+1]."""
    t = ids.shape[0]
    sid = torch.full((t, 1), shared_id, dtype=ids.dtype, device=ids.device)
    one = torch.ones((t, 1), dtype=weights.dtype, device=weights.device)
    return torch.cat([weights, one], dim=1), torch.cat([ids, sid], dim=1)


def expert_weight(w: torch.Tensor, e: int, dtype: torch.dtype, scale: torch.Tensor | None = None,
                  fmt: str = "bf16") -> torch.Tensor:
    """One expert's weight [N, K] in ``dtype`` from a stacked [E, N, K] (mxfp4: [E, N, K/2]) tensor."""
    if fmt in ("bf16", "fp32", "fp16"):
        return w[e].to(dtype)
    from ..mx import reference as mx
    if fmt == "mxfp8":
        return mx.dequantize_mxfp8(w[e], scale[e], dtype=dtype)
    if fmt == "mxfp4":
        return mx.dequantize_mxfp4(w[e], scale[e], dtype=dtype)
    raise ValueError(f"expert weight format {fmt!r} is not one of bf16, mxfp8, mxfp4")


def grouped_gemm_ref(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, *, scale: torch.Tensor | None = None,
                     fmt: str = "bf16") -> torch.Tensor:
    """Grouped GEMM: row t of x times each chosen expert's weight.

    x [T, K] or [T, k, K] (per-slot inputs); w [E, N, K]; ids [T, k] -> y [T, k, N] in x.dtype
    (fp32 accumulation). One loop over the experts that received tokens; ids < 0 (experts of
    another rank) give zero rows.
    """
    t, k = ids.shape
    n = w.shape[1]
    if x.is_meta:  # shapes only: per-expert token counts depend on values
        return x.new_empty(t, k, n)
    y = torch.zeros(t, k, n, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        if e < 0:
            continue
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        xe = x[rows] if x.dim() == 2 else x[rows, slots]
        we = expert_weight(w, e, torch.float32, scale, fmt)
        y[rows, slots] = xe.float() @ we.t()
    return y.to(x.dtype)


def combine_ref(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum over the k slots: y [T, k, H], weights [T, k] -> [T, H] (fp32 sum, y's dtype)."""
    return (y.float() * weights.float()[..., None]).sum(dim=1).to(y.dtype)


def fused_moe_ref(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                  ids: torch.Tensor, *, alpha: float, limit: float, beta: float, w13_scale=None, w2_scale=None,
                  fmt: str = "bf16", act_format: str = "bf16", output_scale: float = 1.0) -> torch.Tensor:
    """Whole routed MoE: x [T, H], w13 [E, 2I, H], w2 [E, H, I], weights/ids [T, k] -> [T, H].

    The gate_up output is rounded to x.dtype before the activation and the activation before the down
    GEMM, as the grouped kernels store them. ``act_format="mxfp8"``: the activation is quantised per 32
    (OCP rule, kernels/mx) before the down GEMM, as vLLM's MXFP8 MoE does. ``output_scale`` multiplies
    the result (vLLM's "scaled output" convention of the fused shared expert).
    """
    h = grouped_gemm_ref(x, w13, ids, scale=w13_scale, fmt=fmt)
    a = swiglu_oai(h, alpha=alpha, limit=limit, beta=beta)
    if act_format == "mxfp8":
        from ..mx import reference as mx
        a = mx.dequantize_mxfp8(*mx.quantize_mxfp8(a.float()), dtype=a.dtype)
    y = grouped_gemm_ref(a, w2, ids, scale=w2_scale, fmt=fmt)
    return combine_ref(y, weights.float() * output_scale)
