"""Checklist step 3, byte-plane separation: compute tensors, persistent state and communication apart.

Input: an OpTable (one engine step, local shapes of ONE GPU; all ranks are alike). Planes:

- ``compute``: activations read and written (``bytes_compute``);
- ``persistent``: weights by dtype, MX scales included (``bytes_weight``), and the KV cache and
  index-key cache reads and writes (``bytes_kv``: attention ops -> "KV cache", indexer -> "index-key cache",
  linear attention and its conv -> "recurrent state", a fixed size per request);
- ``communication``: on-the-wire bytes per GPU with the algorithm's factor already applied
  (``bytes_comm``: TP all-reduce, all-gather of logits, EP all-to-all dispatch and combine).

:func:`byte_planes` returns one row per (plane, part) with bytes per GPU and over all GPUs, per step
and per request; :func:`op_planes` one row per (op, plane) with bytes read and written and FLOPs, and
:func:`planes_totals` their sums by plane (what ``m3lab planes`` prints). :func:`pd_kv_handoff` gives
the P/D hand-off bytes per request and per layer.
"""
from __future__ import annotations

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.optable.ops import ACT as OUT_DTYPE
from m3lab.spec.memory import index_layers, kv_bytes
from m3lab.spec.quant import load_quant

PLANES = ("compute", "persistent", "communication")
NORM_WEIGHT_DTYPE = OUT_DTYPE   # rows without a w_dtype are norms: their weight vector is bf16 (optable.ops)
KV_PART = {"indexer": "index-key cache", "linear_attention": "recurrent state", "conv": "recurrent state"}


def _written(t: pd.DataFrame, written: str, total: str) -> pd.Series:
    """The written part of a plane's bytes; a row that moves bytes of the plane without saying how many it
    writes is a broken OpTable row (every row formula in m3lab.optable sets both)."""
    w = t[written] if written in t else pd.Series(float("nan"), index=t.index)
    broken = w.isna() & (t[total].fillna(0) > 0)
    if broken.any():
        raise ValueError(f"OpTable rows {sorted(set(t.loc[broken, 'op']))} have {total} but no {written}")
    return w.fillna(0.0)


def _parts(optable: pd.DataFrame) -> pd.DataFrame:
    """Long rows ``[op, kind, plane, part, bytes, bytes_read, bytes_written, flops]`` of one OpTable (per GPU,
    one per OpTable row and plane it touches). Communication rows have on-the-wire ``bytes`` and no
    read/written split (NaN): the HBM side of a collective is in its compute row. FLOPs sit on the compute
    row only, so that they sum right."""
    t = optable
    comp, kv = t["bytes_compute"].fillna(0), t["bytes_kv"].fillna(0)
    comp_w, kv_w = _written(t, "bytes_compute_written", "bytes_compute"), _written(t, "bytes_kv_written", "bytes_kv")
    w_dtype = t["w_dtype"].fillna(NORM_WEIGHT_DTYPE).astype(str) if "w_dtype" in t else "?"
    algo = t["comm_algo"].fillna("").astype(str) if "comm_algo" in t else ""
    nan = float("nan")
    frames = [
        dict(plane="compute", part="activations", bytes=comp, bytes_read=comp - comp_w, bytes_written=comp_w,
             flops=t["flops"].fillna(0)),
        dict(plane="persistent", part="weights " + w_dtype, bytes=t["bytes_weight"].fillna(0),
             bytes_read=t["bytes_weight"].fillna(0), bytes_written=0.0, flops=0.0),
        dict(plane="persistent", part=t["kind"].map(KV_PART).fillna("KV cache"), bytes=kv, bytes_read=kv - kv_w,
             bytes_written=kv_w, flops=0.0),
        dict(plane="communication", part=t["op"].astype(str) + (" (" + algo + ")").where(algo != "", ""),
             bytes=t["bytes_comm"].fillna(0), bytes_read=nan, bytes_written=nan, flops=0.0),
    ]
    out = pd.concat([pd.DataFrame({"op": t["op"], "kind": t["kind"], **f}) for f in frames], ignore_index=True)
    return out[(out["bytes"] > 0) | (out["flops"] > 0)]


def op_planes(optable: pd.DataFrame) -> pd.DataFrame:
    """Per op and plane, one engine step on one GPU: ``[op, kind, plane, part, calls, bytes, bytes_read,
    bytes_written, flops]`` summed over the layers (``calls``: OpTable rows, i.e. layers the op runs in), in
    the order the ops run. ``bytes`` = read + written, except communication: on-the-wire bytes per GPU
    (algorithm factor applied) with read/written NaN. FLOPs are on the op's compute row only."""
    order = {op: i for i, op in enumerate(dict.fromkeys(optable["op"]))}
    plane_order = {p: i for i, p in enumerate(PLANES)}
    long = _parts(optable).assign(calls=1)
    keys = ["op", "kind", "plane", "part"]
    agg = long.groupby(keys, sort=False).agg(calls=("calls", "sum"), bytes=("bytes", "sum"),
                                             bytes_read=("bytes_read", lambda s: s.sum(min_count=1)),
                                             bytes_written=("bytes_written", lambda s: s.sum(min_count=1)),
                                             flops=("flops", "sum")).reset_index()
    agg = agg.assign(_o=agg["op"].map(order), _p=agg["plane"].map(plane_order))
    return agg.sort_values(["_o", "_p"], kind="stable").drop(columns=["_o", "_p"]).reset_index(drop=True)


def planes_totals(ops: pd.DataFrame, gpus: int = 1) -> pd.DataFrame:
    """:func:`op_planes` summed by plane: ``[plane, bytes, bytes_read, bytes_written, flops, bytes_all_gpus]``
    (per GPU; ``bytes_all_gpus`` = x ``gpus``, all ranks being alike)."""
    tot = ops.groupby("plane", sort=False)[["bytes", "bytes_read", "bytes_written", "flops"]].sum(min_count=1)
    tot = tot.reindex([p for p in PLANES if p in tot.index]).reset_index()
    tot["bytes_all_gpus"] = tot["bytes"] * gpus
    return tot


def byte_planes(optable: pd.DataFrame, gpus: int, active_requests: float | None = None) -> pd.DataFrame:
    """Bytes by plane and part for one engine step: ``[plane, part, bytes_per_gpu, bytes_all_gpus,
    share_of_plane, bytes_per_gpu_per_request, bytes_all_gpus_per_request]`` (per-request columns when
    ``active_requests`` is given: the step's bytes divided by the requests it serves)."""
    if not isinstance(gpus, int) or gpus < 1:
        raise M3LabError(f"gpus={gpus!r} must be a positive integer", field="gpus",
                         hint="pass the deployment's GPU count (tp x dp)")
    long = _parts(optable)
    parts = long[long["bytes"] > 0].groupby(["plane", "part"], sort=False)["bytes"].sum().reset_index()
    parts = parts.rename(columns={"bytes": "bytes_per_gpu"})
    parts["bytes_all_gpus"] = parts["bytes_per_gpu"] * gpus
    parts["share_of_plane"] = parts["bytes_per_gpu"] / parts.groupby("plane")["bytes_per_gpu"].transform("sum")
    if active_requests:
        parts["bytes_per_gpu_per_request"] = parts["bytes_per_gpu"] / active_requests
        parts["bytes_all_gpus_per_request"] = parts["bytes_all_gpus"] / active_requests
    order = {p: i for i, p in enumerate(PLANES)}
    return parts.sort_values(["plane", "bytes_per_gpu"], key=lambda s: s.map(order) if s.name == "plane" else -s,
                             ).reset_index(drop=True)


def plane_totals(optable: pd.DataFrame) -> dict:
    """Per-GPU bytes of one step by plane, persistent split into weights and KV: the four numbers a
    hand count checks (``activations``, ``weights``, ``kv``, ``communication``)."""
    return {"activations": float(optable["bytes_compute"].fillna(0).sum()),
            "weights": float(optable["bytes_weight"].fillna(0).sum()),
            "kv": float(optable["bytes_kv"].fillna(0).sum()),
            "communication": float(optable["bytes_comm"].fillna(0).sum())}


def pd_kv_handoff(kv_bytes_per_token_layer: pd.DataFrame, isl: int, tp: int, link_bw: float | None = None) -> pd.DataFrame:
    """P/D disaggregation: the KV a prefill worker hands to a decode worker for one request of ``isl``
    tokens, per layer. ``kv_bytes_per_token_layer`` has ``[layer, part, bytes_per_token_per_rank]``
    (main KV and, for sparse layers, the index-key cache). Returns per layer and part the bytes per
    rank and over the ``tp`` ranks, and the transfer time at ``link_bw`` (B/s per GPU) when given."""
    if isl < 1:
        raise M3LabError(f"isl={isl!r} must be a positive token count", field="isl")
    out = kv_bytes_per_token_layer.copy()
    out["bytes_per_rank"] = out["bytes_per_token_per_rank"] * isl
    out["bytes_all_ranks"] = out["bytes_per_rank"] * tp
    if link_bw:
        out["transfer_ms"] = out["bytes_per_rank"] / link_bw * 1e3
    return out


def time_by_plane(costed: pd.DataFrame) -> pd.DataFrame:
    """Attribute a costed OpTable's time to planes: compute-bound time to "compute (FLOPs)", memory-bound
    time to activations / weights / KV in proportion to their bytes, link-bound time to "communication",
    and time spent only because of a kernel's launch floor to "launch floor". Returns ``[plane, us]``."""
    import numpy as np

    t = costed
    work = (t["t_bound_us"] / t["efficiency"]).to_numpy(dtype=float)
    floor_extra = np.maximum(t["t_us"].to_numpy(dtype=float) - work, 0.0)
    mem_parts = {"activations": "bytes_compute", "weights": "bytes_weight", "KV + index cache": "bytes_kv"}
    mem = sum(t[c].fillna(0).to_numpy(dtype=float) for c in mem_parts.values())
    bound = t["bound"].to_numpy()
    out = {"compute (FLOPs)": work[bound == "compute"].sum(), "communication": work[bound == "comm"].sum(),
           "launch floor": floor_extra.sum()}
    is_mem = bound == "memory"
    for name, col in mem_parts.items():
        frac = np.divide(t[col].fillna(0).to_numpy(dtype=float), mem, out=np.zeros(len(t)), where=mem > 0)
        out[name] = float((work * frac)[is_mem].sum())
    return pd.DataFrame({"plane": list(out), "us": [float(v) for v in out.values()]})


def kv_per_layer(model, plan, quant) -> pd.DataFrame:
    """KV-cache bytes per token per rank of every layer: ``[layer, part, bytes_per_token_per_rank]`` (main
    K/V on every layer with a KV cache (not linear-attention layers, whose state is per request); the
    index-key cache on the layers with an indexer, replicated on every rank)."""
    q = load_quant(quant)
    kb = kv_bytes(model, q.kv_dtype, q.index_dtype, plan)
    kv_layers = model.kv_layers
    rows = [{"layer": i, "part": "main KV", "bytes_per_token_per_rank": kb.main / len(kv_layers)}
            for i in kv_layers]
    idx = index_layers(model)
    rows += [{"layer": i, "part": "index-key cache", "bytes_per_token_per_rank": kb.index / len(idx)}
             for i in idx]
    return pd.DataFrame(rows)
