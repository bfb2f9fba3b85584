"""Analysers of benchmark tables (DataFrames in, DataFrames out): speed-ups, tile gains, the GEMM targets.

Input: a table read by :func:`m3lab.bench.table.read_table` (columns incl. provider, dtype, us_p50,
M, N, K). Speed-ups are always against cuBLAS with bf16 weights measured in the same run.
"""
import numpy as np
import pandas as pd

from ..analysis.targets import add_verdicts, missing
from ..kernels.gemm.tables import DECODE_MAX_M

DECODE_MS = (1, 8, 32, 64, 128)      # the bf16 decode points of the targets
MX_TARGET_MAX_M = 32                 # MX targets: decode M <= 32
PREFILL_MIN_M = 2048


def speedups(df: pd.DataFrame, baseline: str = "cublas") -> pd.DataFrame:
    """Every non-baseline row with ``base_us`` (cuBLAS bf16 at the same M, N, K) and ``speedup`` = base_us / us_p50."""
    keys = ["M", "N", "K", "device"]
    base = (df[(df["provider"] == baseline) & (df["dtype"] == "bf16")]
            .groupby(keys, as_index=False)["us_p50"].median().rename(columns={"us_p50": "base_us"}))
    out = df[df["provider"] != baseline].merge(base, on=keys, how="inner")
    out["speedup"] = out["base_us"] / out["us_p50"]
    out["shape_nk"] = "N=" + out["N"].astype(str) + ",K=" + out["K"].astype(str)
    return out[["provider", "dtype", "shape_nk", "M", "N", "K", "us_p50", "base_us", "speedup", "tbps", "tflops",
                "frac_ceiling", "device"]].sort_values(["provider", "dtype", "N", "K", "M"]).reset_index(drop=True)


def tile_gain(df: pd.DataFrame) -> pd.DataFrame:
    """Decode tiles (provider triton at small M) vs the shape's prefill tile: ``ratio`` = prefill_us / decode_us
    (how many times faster the decode tiles run), ``gain`` = ratio - 1."""
    keys = ["dtype", "M", "N", "K"]
    dec = df[df["provider"] == "triton"].groupby(keys, as_index=False)["us_p50"].median()
    pre = df[df["provider"] == "triton-prefill-tiles"].groupby(keys, as_index=False)["us_p50"].median()
    out = dec.merge(pre, on=keys, suffixes=("_decode", "_prefill"))
    out["ratio"] = out["us_p50_prefill"] / out["us_p50_decode"]
    out["gain"] = out["ratio"] - 1.0
    out["shape_nk"] = "N=" + out["N"].astype(str) + ",K=" + out["K"].astype(str)
    return out.sort_values(keys).reset_index(drop=True)


def stream_fraction(df: pd.DataFrame, provider: str = "triton") -> pd.DataFrame:
    """Each ``provider`` row with a ``read-only`` row at the same point (a kernel that only reads the same weight
    bytes): ``frac_stream`` = read-only us / provider us, the fraction of the streaming ceiling reached."""
    keys = ["dtype", "M", "N", "K"]
    tri = df[df["provider"] == provider].groupby(keys, as_index=False)["us_p50"].median()
    ro = df[df["provider"] == "read-only"].groupby(keys, as_index=False)["us_p50"].median()
    out = tri.merge(ro, on=keys, suffixes=("", "_read_only"))
    out["frac_stream"] = out["us_p50_read_only"] / out["us_p50"]
    out["provider"] = provider
    return out.sort_values(keys).reset_index(drop=True)


MX_DECODE_PROVIDERS = ("triton", "triton-mx-layout")   # MX weights as stored (OCP) / packed once into the decode layout


def mx_decode_path(sp: pd.DataFrame, w_format: str) -> tuple[pd.DataFrame, str]:
    """The MX decode rows (M <= MX_TARGET_MAX_M) of the weight path that serves them faster overall: weights
    are packed one way at load, so the path is chosen for all M by geomean, never point by point.
    ``sp``: :func:`speedups` rows. -> (its rows, provider name)."""
    best, rows = "triton", sp.iloc[:0]
    for prov in MX_DECODE_PROVIDERS:
        r = sp[(sp["provider"] == prov) & (sp["dtype"] == w_format) & (sp["M"] <= MX_TARGET_MAX_M)]
        if len(r) and (not len(rows) or _geomean(r["speedup"]) > _geomean(rows["speedup"])):
            best, rows = prov, r
    return rows, best


def _geomean(x: pd.Series) -> float:
    x = x.dropna()
    return float(np.exp(np.log(x).mean())) if len(x) else float("nan")


def newest_harness(df: pd.DataFrame) -> pd.DataFrame:
    """The rows timed by the current harness (m3lab.bench.timing.HARNESS) when the table has any, else all."""
    from .timing import HARNESS
    if "harness" in df.columns and (df["harness"] == HARNESS).any():
        return df[df["harness"] == HARNESS]
    return df


def gemm_targets(df: pd.DataFrame) -> pd.DataFrame:
    """The GEMM kernels' H200 targets (kernels/gemm/README.md): measured figure, threshold, the named points
    the table lacks (``missing``) and ``status``/``passed`` (m3lab.analysis.targets: a target with a missing
    point is ``incomplete``, never passed); rows with op "info" are reported figures without a target."""
    df = newest_harness(df)
    sp = speedups(df)
    tri = sp[sp["provider"] == "triton"]
    bf = tri[tri["dtype"] == "bf16"]
    dec = bf[bf["M"].isin(DECODE_MS)]
    pre = bf[bf["M"] >= PREFILL_MIN_M]
    mx8, path8 = mx_decode_path(sp, "mxfp8")
    mx4, path4 = mx_decode_path(sp, "mxfp4")
    fp8 = tri[(tri["dtype"] == "fp8") & (tri["M"].isin(DECODE_MS))]
    peer = sp[(sp["provider"] == "vllm-mxfp8") & (sp["M"] <= MX_TARGET_MAX_M)]
    gain = tile_gain(df)
    gain = gain[(gain["dtype"] == "bf16") & (gain["M"] <= DECODE_MAX_M)]
    fs = pd.concat([stream_fraction(df, path8), stream_fraction(df, path4)])
    fs = fs[((fs["dtype"] == "mxfp8") & (fs["provider"] == path8) | (fs["dtype"] == "mxfp4") & (fs["provider"] == path4))
            & (fs["M"] <= MX_TARGET_MAX_M)]
    mx_ms = [m for m in DECODE_MS if m <= MX_TARGET_MAX_M]                  # the points each title names
    both_mx = set(fs.loc[fs["dtype"] == "mxfp8", "M"]) & set(fs.loc[fs["dtype"] == "mxfp4", "M"])
    rows = [
        ("bf16 decode M in {1,8,32,64,128}: geomean vs cuBLAS", _geomean(dec["speedup"]), 1.05, ">=",
         missing(dec["M"], DECODE_MS)),
        ("bf16 decode: worst point vs cuBLAS", dec["speedup"].min(), 0.9, ">=", missing(dec["M"], DECODE_MS)),
        ("bf16 prefill M >= 2048: worst point vs cuBLAS", pre["speedup"].min(), 0.9, ">=",
         "" if len(pre) else f"M >= {PREFILL_MIN_M} not measured"),
        (f"MXFP8 decode M <= 32 ({path8}): geomean vs bf16 cuBLAS", _geomean(mx8["speedup"]), 1.6, ">=",
         missing(mx8["M"], mx_ms)),
        (f"MXFP4 decode M <= 32 ({path4}): geomean vs bf16 cuBLAS", _geomean(mx4["speedup"]), 2.4, ">=",
         missing(mx4["M"], mx_ms)),
        ("MX decode M <= 32: worst fraction of the streaming ceiling", fs["frac_stream"].min(), 0.7, ">=",
         missing(both_mx, mx_ms)),
        (f"bf16 decode tiles vs prefill tiles, M <= {DECODE_MAX_M}: speed ratio (geomean)",
         _geomean(gain["ratio"]), 1.0, ">", missing(gain["M"], [m for m in DECODE_MS if m <= DECODE_MAX_M])),
        ("fp8 per-channel decode: geomean vs bf16 cuBLAS", _geomean(fp8["speedup"]), float("nan"), "info", ""),
        ("vLLM MXFP8 (peer) decode M <= 32: geomean vs bf16 cuBLAS", _geomean(peer["speedup"]), float("nan"), "info",
         ""),
    ]
    return add_verdicts(pd.DataFrame(rows, columns=["target", "measured", "threshold", "op", "missing"]))


def committed_targets(path=None) -> pd.DataFrame:
    """:func:`gemm_targets` on the committed rows of the newest commit in traces/bench/gemm.csv (or ``path``)."""
    from .table import TRACES_BENCH, read_table
    df = read_table(path or TRACES_BENCH / "gemm.csv")
    if not len(df):
        return gemm_targets(df)
    return gemm_targets(df[df["commit"] == df["commit"].iloc[-1]])


def copy_ceiling(df: pd.DataFrame) -> float | None:
    """The measured copy ceiling (TB/s) quoted in a table's ``ceiling`` column, if any."""
    vals = df.loc[df["ceiling"] == "copy_tbps", "ceiling_value"].dropna().astype(float)
    return float(vals.median()) if len(vals) else None


def tuned_configs(device_name: str = "NVIDIA_H200") -> pd.DataFrame:
    """Every tuned GEMM table of a device as rows: N, K, w_format, M, kernel, tiles, SPLIT_K, warps, stages."""
    import re

    from ..kernels.gemm.tables import CONFIG_DIR, load_table
    rows = []
    for path in sorted(CONFIG_DIR.glob(f"*,device={device_name}.json")):
        n, k, w = re.match(r"N=(\d+),K=(\d+),w=(\w+),", path.name).groups()
        for m, cfg in load_table(path).items():
            rows.append({"N": int(n), "K": int(k), "w_format": w, "M": m, **cfg.to_dict()})
    return pd.DataFrame(rows)


def main(targets: bool = False, path: str = "") -> None:
    """``python -m m3lab.bench.analysis --targets [--path traces/bench/peers.csv]``: the kernels' targets against
    their peers, from the rows of the newest commit of the peers table (m3lab.bench.peers: every peer at its
    best, in rounds); no other table is read."""
    from .table import TRACES_BENCH, read_table
    if not targets:
        print("nothing to do: pass --targets")
        return
    file = path or TRACES_BENCH / PEERS_TABLE
    df = read_table(file)
    commit = df["commit"].iloc[-1] if len(df) else "-"
    df = df[df["commit"] == commit]
    rounds = int(df["round"].max()) if len(df) else 0
    with pd.option_context("display.width", 220, "display.max_colwidth", 90):
        print(f"{file}: commit {commit}, {len(df)} rows, {rounds} rounds")
        print(peer_targets(df).to_string(index=False, float_format=lambda v: f"{v:.3f}"))


# --- the peers run (m3lab.bench.peers): every peer at its best configuration, repeated rounds ------------------
PEERS_TABLE = "peers.csv"
OURS = {"moe": ("m3lab", "table=m3lab"), "sparse_attn": ("ours", None), "sparse_indexer": ("ours", None)}
PEER_OF = {"moe": "vllm-triton", "sparse_attn": "vllm", "sparse_indexer": "vllm"}
GEMM_KEY = ["M", "N", "K"]


def _rounds(df: pd.DataFrame) -> pd.DataFrame:
    """Per (op, shape, dtype, provider, config): ``us`` (median p50 over rounds), ``by_round`` {round: p50} and
    ``power_limited`` (a clock note of any round says so)."""
    from .clocks import power_limited
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
        if len(r) and _geomean(r["ratio"]) > score:
            best, score = prov, _geomean(r["ratio"])
    return best


def peer_targets(df: pd.DataFrame) -> pd.DataFrame:
    """The kernels' targets against their peers (peers rows only): the worst ratio, where, its spread over
    rounds, threshold, the points of the peers run (m3lab.bench.peers) the rows lack (``missing``),
    ``status``/``passed`` (m3lab.analysis.targets: a missing point makes a target ``incomplete``, never
    passed), and how many of the target's points ran power-limited."""
    from .peers import GEMM_MS, MOE_TS, OGS_MS, SPARSE_POINTS   # heavy: m3lab.bench.peers imports torch
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


if __name__ == "__main__":
    import typer
    typer.run(main)


TILE_MS = (1, 8, 32, 64, 128, 2048, 4096)


def tile_choices(device_name: str = "NVIDIA_H200", ms=TILE_MS, w_format: str = "mxfp8",
                 table: pd.DataFrame | None = None, sms: int = 132) -> pd.DataFrame:
    """Shape by shape (the M3 TP4 GEMMs × ``ms``): the tiles our launcher picks for ``w_format`` on
    ``device_name`` (its tuned table, else the heuristic; MX prefill runs the bf16 table's tiles on
    dequantised weights, as ``launcher.launch_config`` does) beside vLLM's ``_select_cfg``
    (vllm/model_executor/kernels/linear/mxfp8/rocm_native.py:128-215, tuned on gfx950). ``programs``: grid
    size; ``w_passes``: M tiles, i.e. how often the weights are streamed. With a benchmark ``table``, the
    measured µs of both (providers ``triton`` and ``vllm-mxfp8``) and ``ours_speedup`` = vLLM µs / ours.
    ``sms``: the device's SM count (H200: 132), for the stream-K kernel's fixed grid."""
    import math

    from ..kernels.gemm.tables import heuristic_config, load_table, nearest, table_path
    from ..vllm_src.imports import vllm_module
    from .gemm import VLLM_MXFP8, model_gemm_shapes
    select = vllm_module(VLLM_MXFP8, "vLLM's MXFP8 tile table")._select_cfg
    rows = []
    for n, k in model_gemm_shapes():
        for m in ms:
            ours = nearest(load_table(table_path(n, k, w_format, device_name)), m)
            source = "table" if ours is not None else "heuristic"
            ours = ours or heuristic_config(m, n, k, w_format)
            if ours.kernel in ("tiled", "persistent") and w_format in ("mxfp8", "mxfp4"):
                ours = nearest(load_table(table_path(n, k, "bf16", device_name)), m) or heuristic_config(m, n, k)
                source += ", dequantised + bf16 tiles"
            split = ours.SPLIT_K if ours.kernel in ("splitk", "gemv") else 1
            programs = math.ceil(m / ours.BLOCK_M) * math.ceil(n / ours.BLOCK_N) * split
            if ours.kernel == "streamk":                  # a fixed grid: PER_SM x SMs, at most one per K-step
                programs = min(ours.PER_SM * sms, programs * math.ceil(k / ours.BLOCK_K))
            bm, bn, bk, warps, stages = select(m, n, k)
            rows.append({"N": n, "K": k, "M": m, "ours_kernel": ours.kernel,
                         "ours_tile": f"{ours.BLOCK_M}x{ours.BLOCK_N}x{ours.BLOCK_K}", "ours_split_k": split,
                         "ours_programs": programs,
                         "ours_w_passes": math.ceil(m / ours.BLOCK_M), "ours_source": source,
                         "vllm_tile": f"{bm}x{bn}x{bk}", "vllm_warps_stages": f"{warps}/{stages}",
                         "vllm_programs": math.ceil(m / bm) * math.ceil(n / bn), "vllm_w_passes": math.ceil(m / bm)})
    out = pd.DataFrame(rows)
    if table is not None:
        t = newest_harness(table)
        t = t[t["dtype"] == w_format]
        for prov, col in (("triton", "ours_us"), ("vllm-mxfp8", "vllm_us")):
            us = t[t["provider"] == prov].groupby(["N", "K", "M"], as_index=False)["us_p50"].median()
            out = out.merge(us.rename(columns={"us_p50": col}).astype({"N": int, "K": int, "M": int}),
                            on=["N", "K", "M"], how="left")
        out["ours_speedup"] = out["vllm_us"] / out["ours_us"]
    return out

