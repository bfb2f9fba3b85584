"""Random weights at any size (including the meta device) in the reference model's internal layout."""
import torch

from m3lab.spec.model import ATTN_SPARSE, MLP_DENSE, ModelSpec
from m3lab.spec.plan import ParallelPlan


def _shapes(model: ModelSpec, plan: ParallelPlan) -> dict[str, tuple[tuple[int, ...], str]]:
    """Internal weight name -> (shape, kind) with kind in {matrix, norm, router, bias} for one rank."""
    m, p = model, plan
    h, hd, v = m.hidden, m.head_dim, p.vocab_local(m)
    fused = p.fuses_shared(m)
    out = {"embed": ((v, h), "matrix"), "lm_head": ((v, h), "matrix"), "norm": ((h,), "norm")}
    for i in range(m.layers):
        pre, sparse = f"layers.{i}.", m.attn_types[i] == ATTN_SPARSE
        out.update({pre + "input_norm": ((h,), "norm"), pre + "post_norm": ((h,), "norm"),
                    pre + "qkv": ((sum(p.qkv_widths(m, sparse)), h), "matrix"),
                    pre + "o_proj": ((h, p.heads_q_local(m) * hd), "matrix"),
                    pre + "q_norm": ((hd,), "norm"), pre + "k_norm": ((hd,), "norm")})
        if sparse:
            out.update({pre + "iq_norm": ((m.sparse.index_dim,), "norm"), pre + "ik_norm": ((m.sparse.index_dim,), "norm")})
        if m.mlp_types[i] == MLP_DENSE:
            inter = p.dense_inter_local(m)
            out.update({pre + "gate_up": ((2 * inter, h), "matrix"), pre + "down": ((h, inter), "matrix")})
            continue
        e, inter = p.expert_rows_local(m), p.expert_inter_local(m)
        out.update({pre + "router": ((m.experts, h), "router"), pre + "router_bias": ((m.experts,), "bias"),
                    pre + "w13": ((e, 2 * inter, h), "matrix"), pre + "w2": ((e, h, inter), "matrix")})
        if m.n_shared and not fused:
            si = p.shared_inter_local(m)
            out.update({pre + "shared_gate_up": ((2 * si, h), "matrix"), pre + "shared_down": ((h, si), "matrix")})
    return out


def random_weights(model: ModelSpec, plan: ParallelPlan, *, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu", seed: int | None = None,
                   norm_std: float = 0.1) -> dict[str, torch.Tensor]:
    """Random weights for one rank: matrices ~ N(0, 1/fan_in), zero-centred norm weights ~ N(0, norm_std),
    the router (fp32) ~ N(0, 1/H) and its bias ~ N(0, 0.01). On ``device="meta"`` nothing is allocated."""
    gen = None
    if seed is not None and torch.device(device).type != "meta":
        gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, (shape, kind) in _shapes(model, plan).items():
        dt = torch.float32 if kind in ("router", "bias") else dtype
        if torch.device(device).type == "meta":
            out[name] = torch.empty(shape, dtype=dt, device="meta")
            continue
        t = torch.randn(shape, generator=gen, dtype=torch.float32, device=device)
        std = {"matrix": shape[-1] ** -0.5, "router": shape[-1] ** -0.5, "norm": norm_std, "bias": 0.01}[kind]
        if name in ("embed",):
            std = 1.0
        out[name] = (t * std).to(dt)
    return out
