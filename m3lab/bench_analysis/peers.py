"""Targets of the peers run (:mod:`m3lab.bench.peers`): every peer at its best configuration, repeated rounds;
ratios peer µs / ours with their spread over rounds (rows of ``traces/bench/peers.csv``).
"""
import numpy as np
import pandas as pd

from ..analysis.targets import add_verdicts, missing
from ..bench.clocks import power_limited
from ..bench.peers import GEMM_MS, MOE_TS, OGS_MS, SPARSE_POINTS
from ..bench.table import TRACES_BENCH, read_table
from .gemm import DECODE_MS, MX_DECODE_PROVIDERS, MX_TARGET_MAX_M, PREFILL_MIN_M, geomean

PEERS_TABLE = "peers.csv"
OURS = {"moe": ("m3lab", "table=m3lab"), "sparse_attn": ("ours", None), "sparse_indexer": ("ours", None)}
PEER_OF = {"moe": "vllm-triton", "sparse_attn": "vllm", "sparse_indexer": "vllm"}
GEMM_KEY = ["M", "N", "K"]


def _rounds(df: pd.DataFrame) -> pd.DataFrame:
    """Per (op, shape, dtype, provider, config): ``us`` (median p50 over rounds), ``by_round`` {round: p50} and
    ``power_limited`` (a clock note of any round says so)."""
    out = []
    keys = ["op", "shape", "dtype", "provider", "config"]
    for key, g in df.groupby(keys, dropna=False, sort=False):
        out.append({**dict(zip(keys, key)), "us": float(g["us_p50"].median()),
                    "by_round": dict(zip(g["round"], g["us_p50"])),
                    "power_limited": any(power_limited(c) for c in g["clock"])})
    return pd.DataFrame(out, columns=keys + ["us", "by_round", "power_limited"])


def _ratio(ours: pd.Series, peer_rows: pd.DataFrame) -> dict:
    """Peer at its best (the configuration with the lowest median) over ours: ratio, its per-round spread."""
    best = peer_rows.loc[peer_rows["us"].idxmin()]
    per = [best["by_round"][r] / u for r, u in ours["by_round"].items() if r in best["by_round"]]
    return {"ours_us": ours["us"], "peer_us": best["us"], "peer": best["provider"], "peer_config": best["config"],
            "ratio": best["us"] / ours["us"], "ratio_lo": min(per, default=np.nan),
            "ratio_hi": max(per, default=np.nan), "rounds": len(per),
            "power_limited": bool(ours["power_limited"] or best["power_limited"])}


def peer_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point and comparison: ``ratio`` = the peer's best median / ours (> 1: ours faster), with the
    spread over rounds (``ratio_lo``, ``ratio_hi``) and whether any of its timings ran power-limited."""
    r = _rounds(df)
    out = []
    for op, (prov, cfg) in OURS.items():
        for shape, g in r[r["op"] == op].groupby("shape"):
            ours = g[(g["provider"] == prov) & ((g["config"] == cfg) if cfg else True)]
            peer = g[g["provider"] == PEER_OF[op]]
            if len(ours) and len(peer):
                out.append({"op": op, "shape": shape, "dtype": "bf16", "versus": PEER_OF[op],
                            **_ratio(ours.iloc[0], peer)})
    gm = r[r["op"] == "gemm"].copy()
    dims = gm["shape"].str.extract(r"M=(\d+),N=(\d+),K=(\d+)").astype(int)
    gm[GEMM_KEY] = dims.to_numpy()
    comparisons = [("bf16", ("triton", "table"), "bf16", "cublas"),
                   ("fp8", ("triton", "per-channel"), "bf16", "cublas"),
                   ("fp8", ("triton", "per-channel"), "fp8", "scaled-mm"),
                   ("mxfp4", ("triton", "table"), "mxfp4", "ogs"),
                   ("mxfp4", ("triton-mx-layout", "table"), "mxfp4", "ogs"),
                   ("mxfp8", ("triton", "table"), "bf16", "cublas"), ("mxfp4", ("triton", "table"), "bf16", "cublas"),
                   ("mxfp8", ("triton-mx-layout", "table"), "bf16", "cublas"),
                   ("mxfp4", ("triton-mx-layout", "table"), "bf16", "cublas")]
    for dtype, (prov, cfg), peer_dtype, peer in comparisons:
        mine = gm[(gm["dtype"] == dtype) & (gm["provider"] == prov) & (gm["config"] == cfg)]
        theirs = gm[(gm["dtype"] == peer_dtype) & (gm["provider"] == peer)]
        for _, o in mine.iterrows():
            p = theirs[(theirs[GEMM_KEY] == o[GEMM_KEY].to_numpy()).all(axis=1)]
            if len(p):
                out.append({"op": "gemm", "shape": o["shape"], "dtype": dtype, "provider": prov, "versus": peer,
                            "M": int(o["M"]), **_ratio(o, p)})
    return pd.DataFrame(out)


def _worst(rows: pd.DataFrame, label: str, threshold: float, gap: str = "") -> dict:
    """One peer target: the worst ratio over ``rows``, where, its spread; ``gap``: the named points it lacks."""
    if not len(rows):
        return {"target": label, "measured": np.nan, "where": "not measured", "spread": "", "threshold": threshold,
                "missing": gap, "power_limited": 0}
    w = rows.loc[rows["ratio"].idxmin()]
    return {"target": label, "measured": float(w["ratio"]),
            "where": f"{w['shape']} vs {w['peer_config'] or w['versus']}",
            "spread": f"{w['ratio_lo']:.3f}-{w['ratio_hi']:.3f} over {w['rounds']} rounds",
            "threshold": threshold, "missing": gap, "power_limited": int(rows["power_limited"].sum())}


def mx_layout_or_ocp(ratios: pd.DataFrame, dtype: str) -> str:
    """Our MX decode path for a format (weights are packed one way at load): the provider whose decode rows
    (M <= MX_TARGET_MAX_M) are faster against bf16 cuBLAS by geomean."""
    best, score = "triton", -1.0
    for prov in MX_DECODE_PROVIDERS:
        r = ratios[(ratios["dtype"] == dtype) & (ratios["provider"] == prov) & (ratios["versus"] == "cublas")
                   & (ratios["M"] <= MX_TARGET_MAX_M)]
        if len(r) and geomean(r["ratio"]) > score:
            best, score = prov, geomean(r["ratio"])
    return best


def peer_targets(df: pd.DataFrame) -> pd.DataFrame:
    """The kernels' targets against their peers (peers rows only): the worst ratio, where, its spread over
    rounds, threshold, the points of the peers run (m3lab.bench.peers) the rows lack (``missing``),
    ``status``/``passed`` (m3lab.analysis.targets: a missing point makes a target ``incomplete``, never
    passed), and how many of the target's points ran power-limited."""
    r = peer_ratios(df)
    if not len(r):
        return pd.DataFrame(columns=["target", "measured", "where", "spread", "threshold", "missing", "status",
                                     "passed", "power_limited"])
    r = r.reindex(columns=list(dict.fromkeys([*r.columns, "M", "provider"])))
    g = r[r["op"] == "gemm"]
    path4 = mx_layout_or_ocp(g, "mxfp4") if len(g) else "triton"
    sparse = [f"B={b},ctx={c},q=1" for b, c in SPARSE_POINTS]

    def gemm(sel, label, threshold, named):
        return _worst(sel, label, threshold, missing(sel["M"], named))

    def op_rows(op, label, named, name):   # moe points by T, sparse ones by their whole shape
        sel = r[r["op"] == op]
        present = sel["shape"].str.extract(r"T=(\d+)", expand=False).dropna().astype(int) if name == "T" \
            else sel["shape"]
        return _worst(sel, label, 1.0, missing(present, named, name))
    rows = [op_rows("moe", "MoE bf16 vs vLLM fused_moe at its best config (every T)", MOE_TS, "T"),
            op_rows("sparse_attn", "sparse attention vs vLLM decode (PDL), every B x ctx", sparse, "points"),
            op_rows("sparse_indexer", "indexer vs vLLM index decode, every B x ctx", sparse, "points"),
            gemm(g[(g["dtype"] == "mxfp4") & (g["provider"] == path4) & (g["versus"] == "ogs")],
                 f"MXFP4 decode ({path4}) vs matmul_ogs best variant, M <= {MX_TARGET_MAX_M}", 1.0,
                 [m for m in OGS_MS if m <= MX_TARGET_MAX_M]),
            gemm(g[(g["dtype"] == "bf16") & g["M"].isin(DECODE_MS)], "bf16 decode vs cuBLAS, worst point", 0.85,
                 DECODE_MS),
            gemm(g[(g["dtype"] == "bf16") & (g["M"] >= PREFILL_MIN_M)], "bf16 prefill vs cuBLAS, worst point", 0.85,
                 [m for m in GEMM_MS["bf16"] if m >= PREFILL_MIN_M]),
            gemm(g[(g["dtype"] == "fp8") & (g["versus"] == "cublas") & (g["M"] >= PREFILL_MIN_M)],
                 "fp8 (W8A16) prefill vs bf16 cuBLAS, worst point", 0.85,
                 [m for m in GEMM_MS["fp8"] if m >= PREFILL_MIN_M]),
            _worst(g[(g["dtype"] == "fp8") & (g["versus"] == "scaled-mm") & (g["M"] >= PREFILL_MIN_M)],
                   "fp8 prefill vs torch._scaled_mm (W8A8, fp8 MMA; reported)", np.nan)]
    out = pd.DataFrame(rows)
    out["op"] = np.where(out["threshold"].isna(), "info", ">=")
    out = add_verdicts(out).drop(columns="op")
    return out[["target", "measured", "where", "spread", "threshold", "missing", "status", "passed",
                "power_limited"]]


def print_targets(path: str = "") -> None:
    """Print the kernels' targets against their peers, from the rows of the newest commit of the peers table
    (``traces/bench/peers.csv``, or ``path``; m3lab.bench.peers: every peer at its best, in rounds); no other
    table is read. ``m3lab bench targets``."""
    file = path or TRACES_BENCH / PEERS_TABLE
    df = read_table(file)
    commit = df["commit"].iloc[-1] if len(df) else "-"
    df = df[df["commit"] == commit]
    rounds = int(df["round"].max()) if len(df) else 0
    with pd.option_context("display.width", 220, "display.max_colwidth", 90):
        print(f"{file}: commit {commit}, {len(df)} rows, {rounds} rounds")
        print(peer_targets(df).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
