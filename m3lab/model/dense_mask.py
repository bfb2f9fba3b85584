"""A straightforward dense-mask implementation of the same M3 math: the check of the reference model.

Reads the same :class:`~m3lab.spec.model.ModelSpec` (``model.model``). Whole sequence at once, no cache, no
gathers: the indexer's choice becomes a boolean [heads, T, T] mask (HF-style), the MoE runs every expert on every token and weighs them with a dense [T, E] gate
matrix. Written independently of ``kernels/*/reference.py`` (own RoPE, norm, mask and softmax code),
for tp = 1 and floating-point weights.
"""
import math

import torch

from m3lab.errors import M3LabError


def _norm(x, w, eps):
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w.double())


def _rope(z, pos, rotary_dim, theta):
    """z [T, H, D] (float64): rotate pairs (i, i + rotary_dim/2) of the first rotary_dim channels."""
    out = z.clone()
    half = rotary_dim // 2
    for i in range(half):
        ang = pos.double() * theta ** (-2.0 * i / rotary_dim)
        c, s = torch.cos(ang)[:, None], torch.sin(ang)[:, None]
        out[..., i] = z[..., i] * c - z[..., i + half] * s
        out[..., i + half] = z[..., i + half] * c + z[..., i] * s
    return out


def _act(h, spec):
    """SwiGLU-OAI on [gate | up]: min(g, limit) * sigmoid(alpha * min(g, limit)) * (clip(u, +-limit) + beta)."""
    alpha, limit, beta = spec.swiglu_alpha, spec.swiglu_limit, spec.swiglu_beta
    g, u = h[..., : h.shape[-1] // 2], h[..., h.shape[-1] // 2:]
    g = torch.minimum(g, torch.tensor(limit, dtype=h.dtype))
    u = torch.clamp(u, -limit, limit)
    return g / (1 + torch.exp(-alpha * g)) * (u + beta)


def _selection_mask(iq, ik, sp, t):
    """Indexer as a dense mask: -> (allowed [Hi, T, T] bool, smallest k-th vs (k+1)-th block-score gap)."""
    s = torch.einsum("thd,jd->htj", iq, ik)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    s = s.masked_fill(~causal, -math.inf)
    bs, k = sp.block_size, sp.topk_blocks
    nb = math.ceil(t / bs)
    blocks = torch.full((s.shape[0], t, nb), -math.inf, dtype=s.dtype)
    for b in range(nb):
        blocks[..., b] = s[..., b * bs:(b + 1) * bs].amax(-1)
    own = torch.arange(t) // bs
    for j in range(sp.local_blocks):
        ok = own - j >= 0
        blocks[:, ok, (own - j)[ok]] = math.inf
    blocks[..., : sp.init_blocks] = torch.where(blocks[..., : sp.init_blocks] > -math.inf, math.inf, -math.inf)
    margin = math.inf
    if nb > k:
        top = torch.topk(blocks, k + 1, dim=-1).values
        contested = top[..., k] > -math.inf
        if contested.any():
            margin = float((top[..., k - 1] - top[..., k])[contested].min())
    chosen = torch.zeros_like(blocks, dtype=torch.bool)
    vals, idx = torch.topk(blocks, min(k, nb), dim=-1)
    chosen.scatter_(-1, idx, vals > -math.inf)
    key_block = torch.arange(t) // bs
    return chosen[..., key_block] & causal, margin


def _attend(q, k, v, allowed_kv, scale):
    """q [T, Hq, D], k, v [T, Hkv, D], allowed_kv [Hkv, T, T] -> [T, Hq, D]."""
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    allowed = allowed_kv.repeat_interleave(g, dim=0)
    s = torch.einsum("thd,jhd->htj", q, kk) * scale
    p = torch.softmax(s.masked_fill(~allowed, -math.inf), dim=-1)
    return torch.einsum("htj,jhd->thd", p, vv)


def _moe(b, w, p, spec, experts, fused):
    logits = b @ w[p + "router"].double().T
    s = torch.sigmoid(logits)
    ids = torch.topk(s + w[p + "router_bias"].double(), spec.topk, dim=-1).indices
    gate = torch.zeros_like(s)
    gate.scatter_(1, ids, s.gather(1, ids))
    gate = gate / gate.sum(-1, keepdim=True) * spec.routed_scaling
    w13, w2 = w[p + "w13"].double(), w[p + "w2"].double()
    y = torch.zeros_like(b)
    for e in range(experts):
        y += gate[:, e:e + 1] * (_act(b @ w13[e].T, spec) @ w2[e].T)
    if fused:
        shared_up, shared_down = w13[experts], w2[experts]
    else:
        shared_up, shared_down = w[p + "shared_gate_up"].double(), w[p + "shared_down"].double()
    return y + _act(b @ shared_up.T, spec) @ shared_down.T


def dense_mask_logits(model, tokens: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Logits [T, V] of one whole sequence (float64 math) and the smallest top-k score margin seen.

    The margin (k-th minus (k+1)-th block score over all indexer-computing layers, heads and tokens
    whose choice is contested) tells a test whether top-k ties could flip the selection.
    """
    spec, plan, w = model.model, model.plan, model.weights
    if plan.tp != 1 or plan.ep != 1 or any(f != "bf16" for f in model.formats.values()):
        raise M3LabError("dense_mask_logits needs tp=1, ep=1 and floating-point weights", field="model")
    sp, hd, eps = spec.sparse, spec.head_dim, spec.norm_eps
    rot = (spec.rotary_dim, spec.rope_theta)
    t = tokens.numel()
    pos = torch.arange(t)
    x = w["embed"].double()[tokens]
    allowed, margin = None, math.inf
    wq, wk, wv = spec.heads_q * hd, spec.heads_kv * hd, spec.heads_kv * hd   # tp = 1: whole widths
    for i in range(spec.layers):
        p = f"layers.{i}."
        a = _norm(x, w[p + "input_norm"], eps)
        qkv = a @ w[p + "qkv"].double().T
        q = qkv[:, :wq].reshape(t, -1, hd)
        k = qkv[:, wq:wq + wk].reshape(t, -1, hd)
        v = qkv[:, wq + wk:wq + wk + wv].reshape(t, -1, hd)
        q = _rope(_norm(q, w[p + "q_norm"], eps), pos, *rot)
        k = _rope(_norm(k, w[p + "k_norm"], eps), pos, *rot)
        if spec.attn_types[i] != "sparse":
            mask = torch.ones(k.shape[1], t, t, dtype=torch.bool).tril()
        else:
            if spec.computes_topk(i) or allowed is None:
                off, wiq = wq + wk + wv, sp.index_heads * sp.index_dim
                iq = qkv[:, off:off + wiq].reshape(t, -1, sp.index_dim)
                ik = qkv[:, off + wiq:off + wiq + sp.index_dim].reshape(t, 1, sp.index_dim)
                iq = _rope(_norm(iq, w[p + "iq_norm"], eps), pos, *rot)
                ik = _rope(_norm(ik, w[p + "ik_norm"], eps), pos, *rot)[:, 0]
                allowed, m = _selection_mask(iq, ik, sp, t)
                margin = min(margin, m)
            mask = allowed
        o = _attend(q, k, v, mask, hd ** -0.5)
        x = x + o.reshape(t, -1) @ w[p + "o_proj"].double().T
        b = _norm(x, w[p + "post_norm"], eps)
        if spec.mlp_types[i] != "moe":
            f = _act(b @ w[p + "gate_up"].double().T, spec) @ w[p + "down"].double().T
        else:
            f = _moe(b, w, p, spec, spec.experts, model.fused_shared)
        x = x + f
    return _norm(x, w["norm"], eps) @ w["lm_head"].double().T, margin
