"""Measured efficiencies of vLLM's own Triton kernels (H200 rows under ``traces/bench/``), and their check
against a real MI300X decode step.

On an H200 (``device`` NVIDIA_H200 in the tables) vLLM 0.33.0's MiniMax-M3 kernels were timed at TP4 shapes
(CUDA-graph replay, bf16):

- ``traces/bench/sparse_attn.csv``: provider ``vllm`` = ``_gqa_sparse_decode_kernel`` + merge (decode, the same
  common kernel ROCm runs as its Triton fallback) and ``_gqa_sparse_fwd_kernel`` (prefill); ``vllm-amd`` = the
  AMD decode indexer (``amd/ops/index_topk.py``: score + fused top-k); ``vllm`` indexer rows = the common
  indexer (prefill); ``dense-sdpa`` = torch SDPA decode (the dense layers' peer);
- ``traces/bench/moe.csv``: provider ``vllm-triton`` = vLLM's Triton ``fused_experts`` (bf16, 129 experts, top-5).

Each measured point becomes an efficiency: the roofline bound of the same step's OpTable rows on the H200
profile (:mod:`m3lab.optable`, :mod:`m3lab.cost.roofline`) divided by the measured µs. The MoE benchmark's
``balanced`` routing gives every token distinct experts (``T * 4`` consecutive picks of a permutation), so it
touches ``min(4 T, 128) + 1`` experts, where the OpTable's balanced routing expects fewer (independent uniform
picks: about 83 at T = 32): the bound takes the expert-weight bytes the benchmark recorded for the call (its
``tbps`` x ``us_p50``) in place of the OpTable's, and the regime (rows per active expert) the benchmark's count. A row on another GPU takes
the efficiency at its own regime (interpolated in log space over the measured grid, clamped to it) times the
assumption ``amd_vs_h200_fraction`` on AMD GPUs: labelled projected.

:func:`amd_check` compares with ``m3lab/cost/data/mi300x_m3_decode_profile.csv`` (index score and sparse attend
of one steady decode step on 8 x MI300X, 8K/c256, with their traffic): the fraction of MI300X's HBM roofline they
reached, over the H200 fraction at the same regime: the basis of ``amd_vs_h200_fraction``.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from m3lab.cost.roofline import bound_times_us
from m3lab.errors import M3LabError
from m3lab.optable import build_optable
from m3lab.provenance import TRACES_BENCH
from m3lab.spec.hardware import load_hardware
from m3lab.spec.model import load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.workload.step import EngineStep

BENCH = TRACES_BENCH
DATA_DIR = Path(__file__).with_name("data")
PEER_DEVICE = "NVIDIA_H200"
PEER_HARDWARE = "h200"
# (table, op, provider, a shape filter) of every peer kernel family
FAMILIES = {
    "sparse_decode": ("sparse_attn.csv", "sparse_attn", "vllm", ""),
    "sparse_prefill": ("sparse_attn.csv", "sparse_prefill_attn", "vllm", ""),
    "indexer_decode": ("sparse_attn.csv", "sparse_indexer", "vllm-amd", ""),
    "indexer_prefill": ("sparse_attn.csv", "sparse_prefill_indexer", "vllm", ""),
    "dense_decode": ("sparse_attn.csv", "sparse_attn", "dense-sdpa", "q=1"),   # SDPA's q>1 path is no decode peer
    "fused_moe": ("moe.csv", "moe", "vllm-triton", "routing=balanced"),      # the estimates' routing
}


def _fields(shape: str) -> dict:
    out = {}
    for part in str(shape).split(","):
        k, v = part.split("=")
        out[k.strip()] = int(v) if v.strip().isdigit() else v.strip()
    return out


def _reference_rows(family: str, f: dict) -> pd.DataFrame:
    """The OpTable rows (on one TP4 layer of MiniMax M3, bf16) that the measured kernel of ``family`` runs."""
    m = load_model("minimax-m3")
    if family == "fused_moe":
        t = int(f["T"])
        ot = build_optable(m, ParallelPlan(tp=4, fused_shared_expert=True), "bf16", EngineStep.decode(t, 2),
                           "balanced" if f.get("routing", "balanced") == "balanced" else f["routing"])
        return ot[(ot.layer == 3) & ot.op.isin(["moe_gate_up", "moe_down"])]
    b, ctx, q = int(f["B"]), int(f["ctx"]), int(f["q"])
    step = EngineStep(np.full(b, q), np.full(b, ctx))
    ot = build_optable(m, ParallelPlan(tp=4), "bf16", step)
    layer = 0 if family == "dense_decode" else 3
    op = "indexer" if family.startswith("indexer") else "attention"
    return ot[(ot.layer == layer) & (ot.op == op)]


@lru_cache(maxsize=8)
def _peer_table(family: str, mtime: float) -> pd.DataFrame:
    """Measured points of ``family``: regime columns, ``us`` and ``eff`` = H200 bound / µs."""
    name, op, provider, keep = FAMILIES[family]
    df = pd.read_csv(BENCH / name)
    df = df[(df["op"] == op) & (df["provider"] == provider) & (df["device"] == PEER_DEVICE)
            & df["shape"].str.contains(keep, regex=False)]
    if df.empty:
        raise M3LabError(f"traces/bench/{name} has no {PEER_DEVICE} rows of {provider} {op}", field="peers",
                         hint="the cost model needs vLLM's measured kernels; restore the table from git")
    hw = load_hardware(PEER_HARDWARE)
    touched = (df["tbps"] * df["us_p50"] * 1e6).groupby(df["shape"]).median()   # bytes (TB/s x µs)
    rows = []
    for shape, us in df.groupby("shape")["us_p50"].median().items():  # repeated sessions: the median
        f = _fields(shape)
        ref = _reference_rows(family, f)
        weight = ref["bytes_weight"].fillna(0).to_numpy(float)
        if family == "fused_moe":   # the experts the benchmark touched, not the OpTable's expectation
            weight = weight * float(touched[shape]) / max(weight.sum(), 1.0)
        mem = ref[["bytes_compute", "bytes_kv"]].fillna(0).to_numpy().sum(axis=1) + weight
        flops = ref["flops"].fillna(0).to_numpy()
        bound = float(bound_times_us(flops, mem, 0.0, hw.peak_flops["bf16"], hw.hbm_bw, hw.link_bw)[3].sum())
        regime = {"rpe": _bench_rpe(ref, weight)} if family == "fused_moe" else \
            {"B": float(f["B"]), "ctx": float(f["ctx"]), "q": float(f["q"])}
        rows.append({**regime, "shape": shape, "us": float(us), "bound_us": bound, "eff": min(bound / float(us), 1.0)})
    return pd.DataFrame(rows)


def _bench_rpe(ref: pd.DataFrame, weight: np.ndarray) -> float:
    """Rows per active expert of the benchmark's call: the OpTable's routed rows over the experts whose weight bytes
    the call read (``weight``: per reference row, the OpTable's bytes per active expert unchanged)."""
    per_expert = ref["bytes_weight"].to_numpy(float) / np.maximum(ref["experts_active"].to_numpy(float), 1e-9)
    active = weight / np.maximum(per_expert, 1e-9)
    return float(ref["routed_tokens"].sum() / max(active.sum(), 1.0))


def peer_table(family: str) -> pd.DataFrame:
    """The measured points of one peer family (see the module docstring); read once per process."""
    if family not in _LOADED:
        p = BENCH / FAMILIES[family][0]
        if not p.is_file():
            raise M3LabError(f"measured table {p} is missing", field="peers", hint="restore traces/bench from git")
        _LOADED[family] = _peer_table(family, p.stat().st_mtime)
    return _LOADED[family]


_LOADED: dict = {}


def efficiency(family: str, requests=None, context=None, rows_per_req=1.0, rpe=None) -> np.ndarray:
    """Measured H200 efficiency of ``family`` at each regime point (interpolated in log space, clamped to the
    measured grid).

    Attention / indexer: ``requests`` in the phase, their mean ``context`` and ``rows_per_req`` query rows per
    request (decode: 1, speculative verify 1 + k: the nearest measured of 1 and 4; prefill: the chunk, measured
    at 1024 only). Fused MoE: ``rpe`` rows per active expert."""
    if family == "fused_moe":
        x = np.log(np.maximum(np.atleast_1d(np.asarray(rpe, float)), 1e-3))
        lx, ly = _moe_curve()
        return np.exp(np.interp(x, lx, ly))
    reqs = np.atleast_1d(np.asarray(requests, float))
    ctx = np.broadcast_to(np.asarray(context, float), reqs.shape)
    rpr = np.broadcast_to(np.asarray(rows_per_req, float), reqs.shape)
    out = np.empty(reqs.shape)
    for i, (b, c, r) in enumerate(zip(reqs, ctx, rpr)):
        key = (family, float(b), float(c), float(r))
        if key not in _POINTS:
            if len(_POINTS) > 100_000:
                _POINTS.clear()
            _POINTS[key] = _point(family, *key[1:])
        out[i] = _POINTS[key]
    return out


_POINTS: dict = {}   # (family, requests, context, rows per request) -> efficiency: steps repeat their regimes


def _point(family: str, b: float, c: float, r: float) -> float:
    """:func:`efficiency` of an attention / indexer family at one regime point."""
    grids = _grids(family)
    qs = np.array(sorted(grids))
    lb, lc, le = grids[qs[np.argmin(np.abs(np.log(qs) - np.log(max(r, 1.0))))]]
    x, y = np.clip(np.log(max(b, 1.0)), lb[0], lb[-1]), np.clip(np.log(max(c, 1.0)), lc[0], lc[-1])
    along_b = [np.interp(x, lb, le[:, j]) for j in range(len(lc))]
    return float(np.exp(np.interp(y, lc, along_b)))


@lru_cache(maxsize=1)
def _moe_curve() -> tuple[np.ndarray, np.ndarray]:
    pts = peer_table("fused_moe").sort_values("rpe")
    return np.log(pts["rpe"].to_numpy(float)), np.log(pts["eff"].to_numpy(float))


@lru_cache(maxsize=16)
def _grids(family: str) -> dict:
    """{rows per request: (log B grid, log ctx grid, log eff [B, ctx])} of an attention / indexer family."""
    t = peer_table(family)
    out = {}
    for q, sub in t.groupby("q"):
        grid = sub.pivot_table(index="B", columns="ctx", values="eff").sort_index().sort_index(axis=1)
        out[float(q)] = (np.log(grid.index.to_numpy(float)), np.log(grid.columns.to_numpy(float)),
                         np.log(grid.to_numpy(float)))
    return out


# ---------------------------------------------------------------- the AMD check
def mi300x_profile() -> pd.DataFrame:
    """The MI300X decode-step phases shipped in ``m3lab/cost/data`` (see SOURCE.md there)."""
    return pd.read_csv(DATA_DIR / "mi300x_m3_decode_profile.csv", comment="#")


def amd_check() -> pd.DataFrame:
    """Per kernel family with a measured traffic on MI300X: the fraction of MI300X's HBM roofline reached
    (profile GB / ms), the H200 fraction of vLLM's same kernel at the profile's regime (this module), and their
    ratio: ``[family, point, mi300x_fraction, h200_fraction, ratio]``."""
    hbm = load_hardware("mi300x").hbm_bw
    prof = mi300x_profile()
    rows = []
    for r in prof[prof["gb"].notna()].itertuples():
        amd = r.gb * 1e9 / (r.ms * 1e-3) / hbm
        h200 = float(efficiency(r.family, requests=r.requests, context=r.context)[0])
        rows.append({"family": r.family, "point": r.point, "mi300x_fraction": amd, "h200_fraction": h200,
                     "ratio": amd / h200})
    return pd.DataFrame(rows)
