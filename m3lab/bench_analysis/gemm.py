"""The GEMM benchmark's tables as the notebooks read them (DataFrames in, DataFrames out): the recorded table,
speed-ups, tile gains, the GEMM targets, the tuned configs and the tiles chosen beside vLLM's.

Input: a table read by :func:`m3lab.bench.table.read_table` (columns incl. provider, dtype, us_p50,
M, N, K). Speed-ups are always against cuBLAS with bf16 weights measured in the same run.
"""
import math
import re

import numpy as np
import pandas as pd

from ..analysis.targets import add_verdicts, missing
from ..bench.table import TRACES_BENCH, read_table
from ..bench.timing import HARNESS
from ..kernels.gemm.tables import (CONFIG_DIR, DECODE_MAX_M, heuristic_config, load_table, nearest,
                                   table_path)
from ..optable.kernel_shapes import model_gemm_shapes
from ..spec.hardware import load_hardware
from ..vllm_src.imports import vllm_module

DECODE_MS = (1, 8, 32, 64, 128)      # the bf16 decode points of the targets
MX_TARGET_MAX_M = 32                 # MX targets: decode M <= 32
PREFILL_MIN_M = 2048


def gemm_table(path=None, latest: bool = True) -> pd.DataFrame:
    """The committed GEMM benchmark table (traces/bench/gemm.csv, or ``path``). The table keeps every run appended
    over time; ``latest`` keeps only the rows of the last run appended (its commit), so that kernels of different
    commits are never mixed in one comparison."""
    df = read_table(path or TRACES_BENCH / "gemm.csv")
    return df[df["commit"] == df["commit"].iloc[-1]].reset_index(drop=True) if latest and len(df) else df


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
        if len(r) and (not len(rows) or geomean(r["speedup"]) > geomean(rows["speedup"])):
            best, rows = prov, r
    return rows, best


def geomean(x: pd.Series) -> float:
    x = x.dropna()
    return float(np.exp(np.log(x).mean())) if len(x) else float("nan")


def newest_harness(df: pd.DataFrame) -> pd.DataFrame:
    """The rows timed by the current harness (m3lab.bench.timing.HARNESS) when the table has any, else all."""
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
        ("bf16 decode M in {1,8,32,64,128}: geomean vs cuBLAS", geomean(dec["speedup"]), 1.05, ">=",
         missing(dec["M"], DECODE_MS)),
        ("bf16 decode: worst point vs cuBLAS", dec["speedup"].min(), 0.9, ">=", missing(dec["M"], DECODE_MS)),
        ("bf16 prefill M >= 2048: worst point vs cuBLAS", pre["speedup"].min(), 0.9, ">=",
         "" if len(pre) else f"M >= {PREFILL_MIN_M} not measured"),
        (f"MXFP8 decode M <= 32 ({path8}): geomean vs bf16 cuBLAS", geomean(mx8["speedup"]), 1.6, ">=",
         missing(mx8["M"], mx_ms)),
        (f"MXFP4 decode M <= 32 ({path4}): geomean vs bf16 cuBLAS", geomean(mx4["speedup"]), 2.4, ">=",
         missing(mx4["M"], mx_ms)),
        ("MX decode M <= 32: worst fraction of the streaming ceiling", fs["frac_stream"].min(), 0.7, ">=",
         missing(both_mx, mx_ms)),
        (f"bf16 decode tiles vs prefill tiles, M <= {DECODE_MAX_M}: speed ratio (geomean)",
         geomean(gain["ratio"]), 1.0, ">", missing(gain["M"], [m for m in DECODE_MS if m <= DECODE_MAX_M])),
        ("fp8 per-channel decode: geomean vs bf16 cuBLAS", geomean(fp8["speedup"]), float("nan"), "info", ""),
        ("vLLM MXFP8 (peer) decode M <= 32: geomean vs bf16 cuBLAS", geomean(peer["speedup"]), float("nan"), "info",
         ""),
    ]
    return add_verdicts(pd.DataFrame(rows, columns=["target", "measured", "threshold", "op", "missing"]))


def committed_targets(path=None) -> pd.DataFrame:
    """:func:`gemm_targets` on the committed rows of the newest commit in traces/bench/gemm.csv (or ``path``)."""
    df = read_table(path or TRACES_BENCH / "gemm.csv")
    if not len(df):
        return gemm_targets(df)
    return gemm_targets(df[df["commit"] == df["commit"].iloc[-1]])


def copy_ceiling(df: pd.DataFrame) -> float | None:
    """The measured copy ceiling (TB/s) quoted in a benchmark table's ``ceiling`` column (median over its rows),
    if any (any op's table: the column is the long format's)."""
    vals = df.loc[df["ceiling"] == "copy_tbps", "ceiling_value"].dropna().astype(float)
    return float(vals.median()) if len(vals) else None


def tuned_configs(device_name: str = "NVIDIA_H200") -> pd.DataFrame:
    """Every tuned GEMM table of a device as rows: N, K, w_format, M, kernel, tiles, SPLIT_K, warps, stages."""
    rows = []
    for path in sorted(CONFIG_DIR.glob(f"*,device={device_name}.json")):
        n, k, w = re.match(r"N=(\d+),K=(\d+),w=(\w+),", path.name).groups()
        for m, cfg in load_table(path).items():
            rows.append({"N": int(n), "K": int(k), "w_format": w, "M": m, **cfg.to_dict()})
    return pd.DataFrame(rows)



TILE_MS = (1, 8, 32, 64, 128, 2048, 4096)


def tile_choices(device_name: str = "NVIDIA_H200", ms=TILE_MS, w_format: str = "mxfp8",
                 table: pd.DataFrame | None = None, sms: int | None = None, hardware: str = "h200") -> pd.DataFrame:
    """Shape by shape (the M3 TP4 GEMMs × ``ms``): the tiles our launcher picks for ``w_format`` on
    ``device_name`` (its tuned table, else the heuristic; MX prefill runs the bf16 table's tiles on
    dequantised weights, as ``launcher.launch_config`` does) beside vLLM's ``_select_cfg``
    (vllm/model_executor/kernels/linear/mxfp8/rocm_native.py:128-215, tuned on gfx950). ``programs``: grid
    size; ``w_passes``: M tiles, i.e. how often the weights are streamed. With a benchmark ``table``, the
    measured µs of both (providers ``triton`` and ``vllm-mxfp8``) and ``ours_speedup`` = vLLM µs / ours.
    ``sms``: the device's SM count for the stream-K kernel's fixed grid (default: the ``hardware`` profile's)."""
    sms = sms or load_hardware(hardware).compute_units
    from ..bench.gemm import VLLM_MXFP8   # heavy: the GEMM runner imports torch and the kernels
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
