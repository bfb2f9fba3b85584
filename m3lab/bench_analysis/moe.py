"""The grouped-MoE benchmark's recorded table (``traces/bench/moe.csv``, written by :mod:`m3lab.bench.moe`) as the
notebooks read it: the table with T and routing parsed, the kernel's H200 targets against it, and the MoE's share
of one decode step with the measured kernel time in place of the projected one.
"""
import numpy as np
import pandas as pd

from ..analysis.targets import add_verdicts, missing
from ..bench.moe import TS
from ..bench.table import TRACES_BENCH, read_table
from ..serving.step_cost import cost_step
from ..spec.hardware import load_hardware
from ..spec.serving import make_deployment
from ..workload.step import EngineStep
from .gemm import copy_ceiling

SMALL_T_MAX = 128   # the speed target covers every T <= 128
BW_MIN_T = 32


def moe_table(path=None, latest: bool = True):
    """The recorded benchmark table (traces/bench/moe.csv) with T and routing parsed; ``latest``: for each
    (provider, shape, dtype) only the most recent row (a later run may cover only some token counts)."""
    df = read_table(path or TRACES_BENCH / "moe.csv")
    df["routing"] = df["shape"].str.extract(r"routing=(\w+)")[0]
    if latest and len(df):
        df = df.drop_duplicates(["op", "provider", "shape", "dtype"], keep="last")
    return df.reset_index(drop=True)


def _p50(df, provider: str, fmt: str | None = None):
    sel = df[df["provider"] == provider]
    if fmt:
        sel = sel[sel["dtype"] == fmt]
    return sel.set_index(["routing", "T"])["us_p50"]


def moe_targets(df):
    """The grouped MoE's H200 targets against a recorded table (moe_table()): one row per target and routing,
    measured figure over the T its title names (``TS``), the named T the table lacks (``missing``), threshold,
    ``status``/``passed`` (m3lab.analysis.targets: a missing T is ``incomplete``, never passed)."""
    ours = _p50(df, "m3lab")
    peer = pd.concat([_p50(df, "vllm-triton"), _p50(df, "torch-grouped-mm")], axis=1).min(axis=1)
    gmm = _p50(df, "torch-grouped-mm")
    mine = df[df["provider"] == "m3lab"].set_index(["routing", "T"])
    tb = mine["tbps"]
    intensity = mine["tflops"] / mine["tbps"]            # FLOP per byte of the problem (same bytes as tbps)
    copy = copy_ceiling(df) or np.nan
    h200 = load_hardware("h200").measured
    ridge = h200["bf16_gemm_flops"] / h200["hbm_copy_bw"]   # ~162 FLOP/B: above it a problem is compute-bound
    rows = []
    for routing in sorted(df["routing"].dropna().unique()):
        def worst(series, ts):   # -> (worst value over the named T, the named T the series lacks)
            vals = [series.get((routing, t), np.nan) for t in ts]
            gap = missing([t for t, v in zip(ts, vals) if not np.isnan(v)], ts, "T")
            return (float(np.nanmin(vals)) if not all(np.isnan(vals)) else np.nan), gap
        speed = (peer / ours)
        memory_bound = [t for t in TS if t >= BW_MIN_T and intensity.get((routing, t), 0) < ridge]
        rows += [
            (routing, "T <= 128: m3lab vs the faster of vllm-triton and torch._grouped_mm (worst T)",
             *worst(speed, [t for t in TS if t <= SMALL_T_MAX]), 1.2),
            (routing, "T >= 32 and memory-bound (FLOP/byte under the measured H200 ridge): fraction of copy "
                      "bandwidth on touched weight bytes (worst T)",
             *worst(tb / copy, memory_bound or [BW_MIN_T]), 0.75),
            (routing, "T = 8192: m3lab vs torch._grouped_mm", *worst(gmm / ours, [8192]), 1.2),
            (routing, "MXFP8 weights, T <= 32: speed-up over our bf16 (worst T)",
             *worst(ours / _p50(df, "m3lab-mxfp8"), [t for t in TS if t <= 32]), 1.5),
            (routing, "MXFP4 weights, T <= 32: speed-up over our bf16 (worst T)",
             *worst(ours / _p50(df, "m3lab-mxfp4"), [t for t in TS if t <= 32]), 2.2),
            (routing, "T = 1: fused shared expert vs separate (speed-up; write-up +30.2% at concurrency 1)",
             *worst(_p50(df, "m3lab-separate-shared") / ours, [1]), 1.0),
        ]
    return add_verdicts(pd.DataFrame(rows, columns=["routing", "target", "measured", "missing", "threshold"]))


def decode_share(df, batch: int = 32, context: int = 8192, hardware: str = "h200", routing: str = "balanced",
                 quant: str = "bf16"):
    """The MoE's share of one TP4 decode step: the OpTable costed for ``hardware`` (projected), and the same
    step with every layer's grouped GEMMs replaced by our measured fused-MoE time at T = batch (nearest T).

    -> DataFrame: kind, projected_us, with_measured_moe_us (whole model, one step).
    """
    dep = make_deployment(None, model="minimax-m3", hardware=hardware, tp=4, quant=quant)
    costed = cost_step(dep, EngineStep.decode(batch, context), calibration=None)
    by_kind = costed.groupby("kind")["t_us"].sum()
    moe_layers = costed.loc[costed["kind"] == "grouped_gemm", "layer"].nunique()
    ours = _p50(df, "m3lab")
    ts = sorted(t for r, t in ours.index if r == routing)
    t_near = min(ts, key=lambda t: abs(t - batch))
    measured = by_kind.copy()
    measured["grouped_gemm"] = float(ours[(routing, t_near)]) * moe_layers
    out = pd.DataFrame({"projected_us": by_kind, "with_measured_moe_us": measured}).fillna(0.0)
    out.attrs.update({"batch": batch, "measured_T": t_near, "moe_layers": moe_layers, "hardware": hardware})
    return out.reset_index().rename(columns={"index": "kind"})
