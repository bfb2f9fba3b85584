"""Analysers of benchmark tables (DataFrames in, DataFrames out): speed-ups, tile gains, the GEMM targets.

Input: a table read by :func:`m3lab.bench.table.read_table` (columns incl. provider, dtype, us_p50,
M, N, K). Speed-ups are always against cuBLAS with bf16 weights measured in the same run.
"""
import numpy as np
import pandas as pd

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
    """Decode tiles (provider triton at small M) vs the shape's prefill tile: gain = prefill_us / decode_us - 1."""
    keys = ["dtype", "M", "N", "K"]
    dec = df[df["provider"] == "triton"].groupby(keys, as_index=False)["us_p50"].median()
    pre = df[df["provider"] == "triton-prefill-tiles"].groupby(keys, as_index=False)["us_p50"].median()
    out = dec.merge(pre, on=keys, suffixes=("_decode", "_prefill"))
    out["gain"] = out["us_p50_prefill"] / out["us_p50_decode"] - 1.0
    out["shape_nk"] = "N=" + out["N"].astype(str) + ",K=" + out["K"].astype(str)
    return out.sort_values(keys).reset_index(drop=True)


def _geomean(x: pd.Series) -> float:
    x = x.dropna()
    return float(np.exp(np.log(x).mean())) if len(x) else float("nan")


def gemm_targets(df: pd.DataFrame) -> pd.DataFrame:
    """The GEMM kernels' H200 targets (kernels/gemm/README.md): measured figure, target, pass/fail (NaN
    measured = not measured). The tile row is a gain: prefill-tile time / decode-tile time − 1."""
    sp = speedups(df)
    tri = sp[sp["provider"] == "triton"]
    bf = tri[tri["dtype"] == "bf16"]
    dec = bf[bf["M"].isin(DECODE_MS)]
    pre = bf[bf["M"] >= PREFILL_MIN_M]
    mx8 = tri[(tri["dtype"] == "mxfp8") & (tri["M"] <= MX_TARGET_MAX_M)]
    mx4 = tri[(tri["dtype"] == "mxfp4") & (tri["M"] <= MX_TARGET_MAX_M)]
    gain = tile_gain(df)
    gain = gain[(gain["dtype"] == "bf16") & (gain["M"] <= DECODE_MAX_M)]
    rows = [
        ("bf16 decode M in {1,8,32,64,128}: geomean vs cuBLAS", _geomean(dec["speedup"]), 1.05, ">="),
        ("bf16 decode: worst point vs cuBLAS", dec["speedup"].min(), 0.9, ">="),
        ("bf16 prefill M >= 2048: worst point vs cuBLAS", pre["speedup"].min(), 0.9, ">="),
        ("MXFP8 decode M <= 32: geomean vs bf16 cuBLAS", _geomean(mx8["speedup"]), 1.6, ">="),
        ("MXFP4 decode M <= 32: geomean vs bf16 cuBLAS", _geomean(mx4["speedup"]), 2.4, ">="),
        (f"bf16 decode vs prefill tiles, M <= {DECODE_MAX_M}: geomean gain", _geomean(1 + gain["gain"]) - 1, 0.0, ">"),
    ]
    out = pd.DataFrame(rows, columns=["target", "measured", "threshold", "op"])
    out["passed"] = [(m >= t if op == ">=" else m > t) if not np.isnan(m) else False
                     for m, t, op in zip(out["measured"], out["threshold"], out["op"])]
    return out


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
