"""Random weights at any size (including the meta device) in the reference model's internal layout."""
import torch

from m3lab.model.config import LocalDims


def _shapes(dims: LocalDims) -> dict[str, tuple[tuple[int, ...], str]]:
    """Internal weight name -> (shape, kind) with kind in {matrix, norm, router, bias}."""
    c, d = dims.cfg, dims
    h = c.hidden
    out = {"embed": ((d.vocab, h), "matrix"), "lm_head": ((d.vocab, h), "matrix"), "norm": ((h,), "norm")}
    for i in range(c.layers):
        p = f"layers.{i}."
        widths = d.qkv_widths if c.attn_kinds[i] == "sparse" else d.qkv_widths[:3]
        out.update({p + "input_norm": ((h,), "norm"), p + "post_norm": ((h,), "norm"),
                    p + "qkv": ((sum(widths), h), "matrix"), p + "o_proj": ((h, d.q_heads * c.head_dim), "matrix"),
                    p + "q_norm": ((c.head_dim,), "norm"), p + "k_norm": ((c.head_dim,), "norm")})
        if c.attn_kinds[i] == "sparse":
            out.update({p + "iq_norm": ((c.index_dim,), "norm"), p + "ik_norm": ((c.index_dim,), "norm")})
        if c.mlp_kinds[i] == "dense":
            out.update({p + "gate_up": ((2 * d.dense_inter, h), "matrix"), p + "down": ((h, d.dense_inter), "matrix")})
            continue
        e = d.table_experts
        out.update({p + "router": ((c.experts, h), "router"), p + "router_bias": ((c.experts,), "bias"),
                    p + "w13": ((e, 2 * d.expert_inter, h), "matrix"), p + "w2": ((e, h, d.expert_inter), "matrix")})
        if not d.fused_shared_expert:
            out.update({p + "shared_gate_up": ((2 * d.shared_inter, h), "matrix"),
                        p + "shared_down": ((h, d.shared_inter), "matrix")})
    return out


def random_weights(dims: LocalDims, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                   seed: int | None = None, norm_std: float = 0.1) -> dict[str, torch.Tensor]:
    """Random weights for one rank: matrices ~ N(0, 1/fan_in), zero-centred norm weights ~ N(0, norm_std),
    the router (fp32) ~ N(0, 1/H) and its bias ~ N(0, 0.01). On ``device="meta"`` nothing is allocated."""
    gen = None
    if seed is not None and torch.device(device).type != "meta":
        gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, (shape, kind) in _shapes(dims).items():
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
