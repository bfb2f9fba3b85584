"""Checklist step 3, byte-plane separation: compute tensors, persistent state and communication apart.

Input: an OpTable (one engine step, local shapes of ONE GPU; all ranks are alike). Planes:

- ``compute``: activations read and written (``bytes_compute``);
- ``persistent``: weights by dtype, MX scales included (``bytes_weight``), and the KV cache and
  index-key cache reads and writes (``bytes_kv``: attention ops -> "KV cache", indexer -> "index-key cache",
  linear attention and its conv -> "recurrent state", a fixed size per request);
- ``communication``: on-the-wire bytes per GPU with the algorithm's factor already applied
  (``bytes_comm``: TP all-reduce, all-gather of logits, EP all-to-all dispatch and combine).

:func:`byte_planes` returns one row per (plane, part) with bytes per GPU and over all GPUs, per step
and per request. :func:`pd_kv_handoff` gives the P/D hand-off bytes per request and per layer.
"""
from __future__ import annotations

import pandas as pd

from m3lab.errors import M3LabError

PLANES = ("compute", "persistent", "communication")
KV_PART = {"indexer": "index-key cache", "linear_attention": "recurrent state", "conv": "recurrent state"}


def _parts(optable: pd.DataFrame) -> pd.DataFrame:
    """Long rows ``[plane, part, op, bytes]`` of one OpTable (per GPU)."""
    rows = []
    t = optable
    rows.append(pd.DataFrame({"plane": "compute", "part": "activations", "op": t["op"],
                              "bytes": t["bytes_compute"].fillna(0)}))
    w_dtype = t["w_dtype"].fillna("none").astype(str) if "w_dtype" in t else "?"
    rows.append(pd.DataFrame({"plane": "persistent", "part": "weights " + w_dtype, "op": t["op"],
                              "bytes": t["bytes_weight"].fillna(0)}))
    kv_part = t["kind"].map(KV_PART).fillna("KV cache")
    rows.append(pd.DataFrame({"plane": "persistent", "part": kv_part, "op": t["op"], "bytes": t["bytes_kv"].fillna(0)}))
    algo = t["comm_algo"].fillna("").astype(str) if "comm_algo" in t else ""
    comm_part = t["op"].astype(str) + (" (" + algo + ")").where(algo != "", "")
    rows.append(pd.DataFrame({"plane": "communication", "part": comm_part, "op": t["op"],
                              "bytes": t["bytes_comm"].fillna(0)}))
    out = pd.concat(rows, ignore_index=True)
    return out[out["bytes"] > 0]


def byte_planes(optable: pd.DataFrame, gpus: int, active_requests: float | None = None) -> pd.DataFrame:
    """Bytes by plane and part for one engine step: ``[plane, part, bytes_per_gpu, bytes_all_gpus,
    share_of_plane, bytes_per_gpu_per_request, bytes_all_gpus_per_request]`` (per-request columns when
    ``active_requests`` is given: the step's bytes divided by the requests it serves)."""
    if not isinstance(gpus, int) or gpus < 1:
        raise M3LabError(f"gpus={gpus!r} must be a positive integer", field="gpus",
                         hint="pass the deployment's GPU count (tp x dp)")
    parts = _parts(optable).groupby(["plane", "part"], sort=False)["bytes"].sum().reset_index()
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
    from m3lab.spec.memory import index_layers, kv_bytes
    from m3lab.spec.quant import load_quant

    q = load_quant(quant)
    kb = kv_bytes(model, q.kv_dtype, q.index_dtype, plan)
    kv_layers = model.kv_layers
    rows = [{"layer": i, "part": "main KV", "bytes_per_token_per_rank": kb.main / len(kv_layers)}
            for i in kv_layers]
    idx = index_layers(model)
    rows += [{"layer": i, "part": "index-key cache", "bytes_per_token_per_rank": kb.index / len(idx)}
             for i in idx]
    return pd.DataFrame(rows)
