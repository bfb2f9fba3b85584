"""A straightforward dense-mask implementation of the same M3 math: the check of the reference model.

Whole sequence at once, no cache, no gathers: the indexer's choice becomes a boolean [heads, T, T]
mask (HF-style), the MoE runs every expert on every token and weighs them with a dense [T, E] gate
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


def _act(h, alpha, limit):
    g, u = h[..., : h.shape[-1] // 2], h[..., h.shape[-1] // 2:]
    g = torch.minimum(g, torch.tensor(limit, dtype=h.dtype))
    u = torch.clamp(u, -limit, limit)
    return g / (1 + torch.exp(-alpha * g)) * (u + 1)


def _selection_mask(iq, ik, cfg, t):
    """Indexer as a dense mask: -> (allowed [Hi, T, T] bool, smallest k-th vs (k+1)-th block-score gap)."""
    s = torch.einsum("thd,jd->htj", iq, ik)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    s = s.masked_fill(~causal, -math.inf)
    bs, k = cfg.block_size, cfg.topk_blocks
    nb = math.ceil(t / bs)
    blocks = torch.full((s.shape[0], t, nb), -math.inf, dtype=s.dtype)
    for b in range(nb):
        blocks[..., b] = s[..., b * bs:(b + 1) * bs].amax(-1)
    own = torch.arange(t) // bs
    for j in range(cfg.local_blocks):
        ok = own - j >= 0
        blocks[:, ok, (own - j)[ok]] = math.inf
    blocks[..., : cfg.init_blocks] = torch.where(blocks[..., : cfg.init_blocks] > -math.inf, math.inf, -math.inf)
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


def _moe(b, w, p, cfg, dims):
    logits = b @ w[p + "router"].double().T
    s = torch.sigmoid(logits)
    ids = torch.topk(s + w[p + "router_bias"].double(), cfg.topk, dim=-1).indices
    gate = torch.zeros_like(s)
    gate.scatter_(1, ids, s.gather(1, ids))
    gate = gate / gate.sum(-1, keepdim=True) * cfg.routed_scaling
    w13, w2 = w[p + "w13"].double(), w[p + "w2"].double()
    y = torch.zeros_like(b)
    for e in range(dims.experts):
        y += gate[:, e:e + 1] * (_act(b @ w13[e].T, cfg.swiglu_alpha, cfg.swiglu_limit) @ w2[e].T)
    if dims.fused_shared_expert:
        shared_up, shared_down = w13[dims.experts], w2[dims.experts]
    else:
        shared_up, shared_down = w[p + "shared_gate_up"].double(), w[p + "shared_down"].double()
    return y + _act(b @ shared_up.T, cfg.swiglu_alpha, cfg.swiglu_limit) @ shared_down.T


def dense_mask_logits(model, tokens: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Logits [T, V] of one whole sequence (float64 math) and the smallest top-k score margin seen.

    The margin (k-th minus (k+1)-th block score over all indexer-computing layers, heads and tokens
    whose choice is contested) tells a test whether top-k ties could flip the selection.
    """
    cfg, dims, w = model.cfg, model.dims, model.weights
    if dims.tp != 1 or dims.ep != 1 or any(f != "bf16" for f in model.formats.values()):
        raise M3LabError("dense_mask_logits needs tp=1, ep=1 and floating-point weights", field="model")
    t = tokens.numel()
    pos = torch.arange(t)
    x = w["embed"].double()[tokens]
    allowed, margin = None, math.inf
    for i in range(cfg.layers):
        p = f"layers.{i}."
        a = _norm(x, w[p + "input_norm"], cfg.eps)
        proj = w[p + "qkv"].double()
        if p + "indexer_qk" in w:
            proj = torch.cat([proj, w[p + "indexer_qk"].double()])
        qkv = a @ proj.T
        wq, wk, wv, wiq, wik = dims.qkv_widths
        q = qkv[:, :wq].reshape(t, -1, cfg.head_dim)
        k = qkv[:, wq:wq + wk].reshape(t, -1, cfg.head_dim)
        v = qkv[:, wq + wk:wq + wk + wv].reshape(t, -1, cfg.head_dim)
        q = _rope(_norm(q, w[p + "q_norm"], cfg.eps), pos, cfg.rotary_dim, cfg.rope_theta)
        k = _rope(_norm(k, w[p + "k_norm"], cfg.eps), pos, cfg.rotary_dim, cfg.rope_theta)
        if cfg.attn_kinds[i] == "dense":
            mask = torch.ones(k.shape[1], t, t, dtype=torch.bool).tril()
        else:
            if cfg.computes_topk(i) or allowed is None:
                off = wq + wk + wv
                iq = qkv[:, off:off + wiq].reshape(t, -1, cfg.index_dim)
                ik = qkv[:, off + wiq:off + wiq + wik].reshape(t, 1, cfg.index_dim)
                iq = _rope(_norm(iq, w[p + "iq_norm"], cfg.eps), pos, cfg.rotary_dim, cfg.rope_theta)
                ik = _rope(_norm(ik, w[p + "ik_norm"], cfg.eps), pos, cfg.rotary_dim, cfg.rope_theta)[:, 0]
                allowed, m = _selection_mask(iq, ik, cfg, t)
                margin = min(margin, m)
            mask = allowed
        o = _attend(q, k, v, mask, cfg.head_dim ** -0.5)
        x = x + o.reshape(t, -1) @ w[p + "o_proj"].double().T
        b = _norm(x, w[p + "post_norm"], cfg.eps)
        if cfg.mlp_kinds[i] == "dense":
            f = _act(b @ w[p + "gate_up"].double().T, cfg.swiglu_alpha, cfg.swiglu_limit) @ w[p + "down"].double().T
        else:
            f = _moe(b, w, p, cfg, dims)
        x = x + f
    return _norm(x, w["norm"], cfg.eps) @ w["lm_head"].double().T, margin
