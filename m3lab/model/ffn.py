"""FFN pieces the decoder dispatches: embedding, router (the experts: ``kernels/moe/reference.fused_moe_ref``)."""
import torch
import torch.nn.functional as F

from m3lab.kernels.moe.reference import route_sigmoid_bias
from m3lab.model.layers import router_logits


def embedding(tokens: torch.Tensor, w: torch.Tensor, *, vocab_start: int = 0) -> torch.Tensor:
    """Vocab-parallel embedding: tokens [T], local rows w [V_local, H] -> [T, H] (zeros for other ranks' rows)."""
    local = tokens - vocab_start
    ok = (local >= 0) & (local < w.shape[0])
    return F.embedding(local.clamp(0, w.shape[0] - 1), w) * ok[:, None].to(w.dtype)


def route(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, *, topk: int, routed_scaling: float,
          expert_start: int = 0, local_experts: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 sigmoid router + bias: x [T, H], w [E, H], bias [E] -> (weights [T, k] fp32, ids [T, k]).

    Under expert parallelism, ids are made local (``id - expert_start``) and other ranks' experts become -1.
    """
    weights, ids = route_sigmoid_bias(router_logits(x, w), bias, topk, routed_scaling)
    if local_experts is not None:
        ids = ids - expert_start
        ids = ids.masked_fill((ids < 0) | (ids >= local_experts), -1)
    return weights, ids

