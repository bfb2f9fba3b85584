"""Load a HF safetensors checkpoint into the reference model's internal weights for one rank.

Formats are detected per tensor: floating -> ``bf16`` (converted to the compute dtype; router and
correction bias stay fp32); ``float8_e4m3fn`` + ``<name>.weight_scale_inv`` (E8M0 uint8) -> ``mxfp8``;
``uint8`` packed E2M1 + ``<name>.weight_scale`` (AMD Quark) -> ``mxfp4``. Quantised tensors keep
their payload and scales (``<internal>.scale``); ``formats[internal]`` names the format. Parts are
sharded by their rule (``m3lab.weights.names``) for ``rank`` and concatenated along the output rows; a fused
weight needs one format (the q/k/v/index projection is one vLLM module with one quant method). The shared expert
joins the expert table only when the plan asks for fusion, there is no EP and its format equals the routed
experts' (vLLM turns fusion off quietly otherwise, ``amd/model.py:404-424``).
"""
from dataclasses import dataclass

import torch

from m3lab.errors import M3LabError
from m3lab.spec.model import MLP_MOE, ModelSpec
from m3lab.spec.plan import ParallelPlan
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


@dataclass(frozen=True)
class _Rank:
    """What sharding needs: the model, the plan and this rank."""

    model: ModelSpec
    plan: ParallelPlan
    rank: int


def _shard(t: torch.Tensor, rule: str, r: _Rank, per_head: int, what: str) -> torch.Tensor:
    tp, rank = r.plan.tp, r.rank
    if rule == N.REPLICATE or (tp == 1 and rule != N.VOCAB):
        return t
    if rule == N.VOCAB:
        v = r.plan.vocab_local(r.model)
        return t[rank * v:(rank + 1) * v]
    dim = 1 if rule == N.ROW else 0
    if rule == N.KV_HEADS:
        heads = t.shape[0] // per_head
        if tp > heads:  # replicated KV head: rank r holds head r // (tp / heads)
            h = rank // (tp // heads)
            return t[h * per_head:(h + 1) * per_head]
    if t.shape[dim] % tp:
        raise M3LabError(f"{what}: dim {dim} of size {t.shape[dim]} does not split over tp={tp}", field="tp")
    return t.chunk(tp, dim)[rank]


def _part(reader, part: N.Part, r: _Rank, dtype) -> Loaded:
    t = _read(reader, part.name, dtype)
    m = r.model
    per_head = m.sparse.index_dim if "index_q" in part.name else m.head_dim
    data = _shard(t.data, part.rule, r, per_head, part.name)
    scale = None if t.scale is None else _shard(t.scale, part.rule, r, per_head, part.name + " scale")
    return Loaded(data, scale, t.fmt)


def _concat(name: str, parts: list[Loaded], names: list[str] | None = None) -> Loaded:
    fmts = {p.fmt for p in parts}
    if len(fmts) > 1:
        detail = ", ".join(f"{n.rsplit('.', 1)[-1]}={p.fmt}" for n, p in zip(names, parts)) if names else \
            ", ".join(sorted(fmts))
        raise M3LabError(f"{name}: parts mix formats ({detail})", field="checkpoint",
                         hint="a fused projection is one GEMM with one weight format (vLLM loads index q/k into "
                              "the qkv module); quantise all its parts alike")
    scale = None if parts[0].scale is None else torch.cat([p.scale for p in parts])
    return Loaded(torch.cat([p.data for p in parts]), scale, parts[0].fmt)


def _load(reader, name: str, plist: list[N.Part], r: _Rank, dtype) -> Loaded:
    return _concat(name, [_part(reader, p, r, dtype) for p in plist], [p.name for p in plist])


def _experts(reader, r: _Rank, i: int, dtype) -> tuple[dict[str, Loaded], bool]:
    """Stacked w13 [E, 2I, H] and w2 [E, H, I] (+ the shared expert as the last row when fused); -> (weights,
    fused)."""
    m, plan = r.model, r.plan
    local = plan.experts_local(m)
    start = r.rank * local if plan.ep > 1 else 0
    rule_up, rule_down = (N.REPLICATE, N.REPLICATE) if plan.ep > 1 else (N.COL, N.ROW)
    rows13, rows2 = [], []
    for e in range(start, start + local):
        w1, w3, w2 = N.expert_names(i, e)
        rows13.append(_load(reader, w1, [N.Part(w1, rule_up), N.Part(w3, rule_up)], r, dtype))
        rows2.append(_part(reader, N.Part(w2, rule_down), r, dtype))
    fused = False
    if plan.fuses_shared(m):
        pre = f"{N.PREFIX}layers.{i}.block_sparse_moe.shared_experts."
        shared13 = _load(reader, pre + "gate_up", [N.Part(pre + "gate_proj", N.COL), N.Part(pre + "up_proj", N.COL)],
                         r, dtype)
        shared2 = _part(reader, N.Part(pre + "down_proj", N.ROW), r, dtype)
        if shared13.data.shape != rows13[0].data.shape:
            raise M3LabError(f"layer {i}: the shared expert {tuple(shared13.data.shape)} cannot be fused with experts "
                             f"{tuple(rows13[0].data.shape)}", field="fused_shared_expert",
                             hint="load with fused_shared_expert=False")
        if shared13.fmt == rows13[0].fmt == shared2.fmt == rows2[0].fmt:  # else vLLM keeps it apart
            rows13.append(shared13)
            rows2.append(shared2)
            fused = True
    out = {}
    for key, rows in ((f"layers.{i}.w13", rows13), (f"layers.{i}.w2", rows2)):
        fmts = {x.fmt for x in rows}
        if len(fmts) > 1:
            raise M3LabError(f"layer {i}: experts mix formats {sorted(fmts)}", field="checkpoint")
        scale = None if rows[0].scale is None else torch.stack([x.scale for x in rows])
        out[key] = Loaded(torch.stack([x.data for x in rows]), scale, rows[0].fmt)
    return out, fused


def load_weights(path, model: ModelSpec, plan: ParallelPlan, *, rank: int = 0, dtype: torch.dtype = torch.bfloat16,
                 device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Checkpoint at ``path`` -> (weights, formats) of rank ``rank`` (internal names, see m3lab.model.decoder)."""
    reader = CheckpointReader(path)
    r = _Rank(model, plan, rank)
    loaded: dict[str, Loaded] = {}
    parts = N.global_parts()
    for i in range(model.layers):
        parts.update(N.attn_parts(model, plan, i))
        mlp = N.mlp_parts(model, i)
        if model.mlp_types[i] == MLP_MOE:
            experts, fused = _experts(reader, r, i, dtype)
            loaded.update(experts)
            if fused:
                mlp = {k: v for k, v in mlp.items() if "shared" not in k}
        parts.update(mlp)
    for name, plist in parts.items():
        loaded[name] = _load(reader, name, plist, r, dtype)
    weights, formats = {}, {}
    for name, t in loaded.items():
        weights[name] = t.data.to(device)
        formats[name] = t.fmt
        if t.scale is not None:
            weights[name + ".scale"] = t.scale.to(device)
    return weights, formats
