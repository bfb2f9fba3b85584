"""Load a HF safetensors checkpoint into the reference model's internal weights for one rank.

Formats are detected per tensor: floating -> ``bf16`` (converted to the compute dtype; router and
correction bias stay fp32); ``float8_e4m3fn`` + ``<name>.weight_scale_inv`` (E8M0 uint8) -> ``mxfp8``;
``uint8`` packed E2M1 + ``<name>.weight_scale`` (AMD Quark) -> ``mxfp4``. Quantised tensors keep
their payload and scales (``<internal>.scale``); ``formats[internal]`` names the format. Parts are
sharded by their rule (``m3lab.weights.names``) for ``rank`` and concatenated along the output rows.
"""
from dataclasses import dataclass

import torch

from m3lab.errors import M3LabError
from m3lab.model.config import LocalDims
from m3lab.weights import names as N
from m3lab.weights.checkpoint import CheckpointReader

FP32_PARTS = (".gate", "e_score_correction_bias")  # router weight and bias stay fp32


@dataclass
class Loaded:
    """One (sharded) tensor: payload, scale (None unless MX) and format."""

    data: torch.Tensor
    scale: torch.Tensor | None
    fmt: str


def _read(r: CheckpointReader, name: str, dtype: torch.dtype) -> Loaded:
    key = name + ".weight" if name + ".weight" in r else name
    t = r.get(key)
    if t.dtype == torch.float8_e4m3fn:
        if name + ".weight_scale_inv" not in r:
            raise M3LabError(f"fp8 tensor {key} has no {name}.weight_scale_inv", field="checkpoint",
                             hint="only MXFP8 (E8M0 scales per 32 along K) fp8 checkpoints are supported")
        return Loaded(t, r.get(name + ".weight_scale_inv"), "mxfp8")
    if t.dtype == torch.uint8:
        if name + ".weight_scale" not in r:
            raise M3LabError(f"uint8 tensor {key} has no {name}.weight_scale", field="checkpoint",
                             hint="expected AMD Quark MXFP4: packed E2M1 with E8M0 weight_scale")
        return Loaded(t, r.get(name + ".weight_scale"), "mxfp4")
    if not t.is_floating_point():
        raise M3LabError(f"tensor {key} has unsupported dtype {t.dtype}", field="checkpoint")
    keep32 = any(name.endswith(s) for s in FP32_PARTS)
    return Loaded(t.float() if keep32 else t.to(dtype), None, "bf16")


def _shard(t: torch.Tensor, rule: str, dims: LocalDims, rank: int, per_head: int, what: str) -> torch.Tensor:
    tp = dims.tp
    if rule == N.REPLICATE or (tp == 1 and rule != N.VOCAB):
        return t
    if rule == N.VOCAB:
        return t[rank * dims.vocab:(rank + 1) * dims.vocab]
    dim = 1 if rule == N.ROW else 0
    if rule == N.KV_HEADS:
        heads = t.shape[0] // per_head
        if tp > heads:  # replicated KV head: rank r holds head r // (tp / heads)
            h = rank // (tp // heads)
            return t[h * per_head:(h + 1) * per_head]
    if t.shape[dim] % tp:
        raise M3LabError(f"{what}: dim {dim} of size {t.shape[dim]} does not split over tp={tp}", field="tp")
    return t.chunk(tp, dim)[rank]


def _part(r, part: N.Part, dims: LocalDims, rank: int, dtype) -> Loaded:
    t = _read(r, part.name, dtype)
    per_head = dims.cfg.index_dim if "index_q" in part.name else dims.cfg.head_dim
    data = _shard(t.data, part.rule, dims, rank, per_head, part.name)
    scale = None if t.scale is None else _shard(t.scale, part.rule, dims, rank, per_head, part.name + " scale")
    return Loaded(data, scale, t.fmt)


def _concat(name: str, parts: list[Loaded]) -> Loaded:
    fmts = {p.fmt for p in parts}
    if len(fmts) > 1:
        raise M3LabError(f"{name}: parts mix formats {sorted(fmts)}", field="checkpoint",
                         hint="fused projections need one weight format")
    scale = None if parts[0].scale is None else torch.cat([p.scale for p in parts])
    return Loaded(torch.cat([p.data for p in parts]), scale, parts[0].fmt)


def _experts(r, dims: LocalDims, i: int, rank: int, dtype) -> dict[str, Loaded]:
    """Stacked w13 [E, 2I, H] and w2 [E, H, I] (+ the shared expert as the last row when fused)."""
    start = rank * dims.experts if dims.ep > 1 else 0
    rule_up, rule_down = (N.REPLICATE, N.REPLICATE) if dims.ep > 1 else (N.COL, N.ROW)
    rows13, rows2 = [], []
    for e in range(start, start + dims.experts):
        w1, w3, w2 = N.expert_names(i, e)
        rows13.append(_concat(w1, [_part(r, N.Part(w1, rule_up), dims, rank, dtype),
                                   _part(r, N.Part(w3, rule_up), dims, rank, dtype)]))
        rows2.append(_part(r, N.Part(w2, rule_down), dims, rank, dtype))
    if dims.fused_shared_expert:
        m = f"{N.PREFIX}layers.{i}.block_sparse_moe.shared_experts."
        shared13 = _concat(m + "gate_up", [_part(r, N.Part(m + "gate_proj", rule_up), dims, rank, dtype),
                                           _part(r, N.Part(m + "up_proj", rule_up), dims, rank, dtype)])
        shared2 = _part(r, N.Part(m + "down_proj", rule_down), dims, rank, dtype)
        if shared13.data.shape != rows13[0].data.shape or shared13.fmt != rows13[0].fmt:
            raise M3LabError(f"layer {i}: the shared expert ({tuple(shared13.data.shape)}, {shared13.fmt}) cannot "
                             f"be fused with experts ({tuple(rows13[0].data.shape)}, {rows13[0].fmt})",
                             field="fused_shared_expert", hint="load with fused_shared_expert=False")
        rows13.append(shared13)
        rows2.append(shared2)
    out = {}
    for key, rows in ((f"layers.{i}.w13", rows13), (f"layers.{i}.w2", rows2)):
        fmts = {x.fmt for x in rows}
        if len(fmts) > 1:
            raise M3LabError(f"layer {i}: experts mix formats {sorted(fmts)}", field="checkpoint")
        scale = None if rows[0].scale is None else torch.stack([x.scale for x in rows])
        out[key] = Loaded(torch.stack([x.data for x in rows]), scale, rows[0].fmt)
    return out


def load_weights(path, dims: LocalDims, *, rank: int = 0, dtype: torch.dtype = torch.bfloat16,
                 device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Checkpoint at ``path`` -> (weights, formats) of rank ``rank`` (internal names, see m3lab.model.decoder)."""
    cfg = dims.cfg
    r = CheckpointReader(path)
    loaded: dict[str, Loaded] = {}
    parts = N.global_parts()
    for i in range(cfg.layers):
        parts.update(N.attn_parts(cfg, i))
        mlp = N.mlp_parts(cfg, i)
        if cfg.mlp_kinds[i] == "moe":
            if dims.fused_shared_expert:
                mlp = {k: v for k, v in mlp.items() if "shared" not in k}
            elif dims.ep > 1:  # the shared expert is replicated whole under EP
                mlp = {k: [N.Part(p.name, N.REPLICATE) if "shared" in k else p for p in v] for k, v in mlp.items()}
            loaded.update(_experts(r, dims, i, rank, dtype))
        parts.update(mlp)
    for name, plist in parts.items():
        loaded[name] = _concat(name, [_part(r, p, dims, rank, dtype) for p in plist])
    for i in range(cfg.layers):  # one fused projection when the indexer shares qkv's format
        q, ix = f"layers.{i}.qkv", f"layers.{i}.indexer_qk"
        if ix in loaded and loaded[ix].fmt == loaded[q].fmt:
            loaded[q] = _concat(q, [loaded[q], loaded.pop(ix)])
    weights, formats = {}, {}
    for name, t in loaded.items():
        weights[name] = t.data.to(device)
        formats[name] = t.fmt
        if t.scale is not None:
            weights[name + ".scale"] = t.scale.to(device)
    return weights, formats
