"""Routing as vLLM runs it for MiniMax M3, and the two top-k table conventions of shared-expert fusion.

Router (``reference.route_sigmoid_bias``): fp32 logits, s = sigmoid, top-k of s + correction bias (the
bias selects, it never weighs), weights = the chosen unbiased s renormalised to sum 1.

With the shared expert fused, it is one more slot (id ``shared_id``, 128 for M3) of a top-(k+1) table.
vLLM has two conventions that give the same output:

- ``"scaled_weights"``: routed weights × routed_scaling, shared weight 1.0, output × 1 (AITER's fused path:
  ``experts/rocm_aiter_moe.py:64-110``, ``fused_moe/expert_map_manager.py:263-276``);
- ``"scaled_output"``: routed weights unscaled, shared weight 1/routed_scaling, output × routed_scaling
  (``router/fused_topk_bias_router.py:452-470``; the runner scales: ``fused_moe/layer.py:317-339``).

The grouped kernel applies ``output_scale`` in its down-GEMM epilogue, so neither costs a launch.
"""
from typing import NamedTuple

import torch

from .reference import route_sigmoid_bias

CONVENTIONS = ("scaled_weights", "scaled_output")


class Routing(NamedTuple):
    """weights fp32 [T, k(+1)], ids int32 [T, k(+1)], and the factor the output is multiplied by."""
    weights: torch.Tensor
    ids: torch.Tensor
    output_scale: float


def route(logits: torch.Tensor, bias: torch.Tensor, *, topk: int, routed_scaling: float,
          shared_id: int | None = None, convention: str = "scaled_weights") -> Routing:
    """logits [T, E] (upcast to fp32), bias [E] -> Routing; ``shared_id`` appends the fused shared expert."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention: {convention!r} is not one of {CONVENTIONS}")
    scaled = convention == "scaled_weights"
    weights, ids = route_sigmoid_bias(logits, bias, topk, routed_scaling if scaled else 1.0)
    if shared_id is not None:
        t = ids.shape[0]
        sid = torch.full((t, 1), shared_id, dtype=ids.dtype, device=ids.device)
        sw = torch.full((t, 1), 1.0 if scaled else 1.0 / routed_scaling, dtype=weights.dtype, device=weights.device)
        weights, ids = torch.cat([weights, sw], dim=1), torch.cat([ids, sid], dim=1)
    return Routing(weights.float().contiguous(), ids.to(torch.int32).contiguous(),
                   1.0 if scaled else float(routed_scaling))
