"""Calibrate achievable GEMM efficiency from measured tables.

A measured table (an AITER tuned-GEMM CSV, or m3lab's own long-format benchmark CSV under
``traces/bench/``) is read into normalised rows ``[m, n, k, w_dtype, us, device, source]``.
For each row the roofline bound (``m3lab.cost.roofline``) on the hardware profile gives an
efficiency ``eff = t_bound / us``. :class:`GemmFit` predicts ``log(eff)`` at a new shape by a
Gaussian-weighted local-linear regression over the op's regime ``(log2 M, log2 N, log2 K)`` — M is
the tokens, N·K the weight bytes, and together they fix the arithmetic intensity — with queries
clamped to the measured range (no wild extrapolation). Residuals of every fit are kept
(:meth:`Calibration.residuals`).

A :class:`Calibration` holds one fit per measured weight dtype (no dtype borrows another's: the cost source of
each kernel, :mod:`m3lab.cost.sources`, names the table it reads) plus the measured launch floors, and names
itself (with its fits) in every projection. Shipped calibrations (``CALIBRATIONS``) live in ``m3lab/cost/data``
(SOURCE.md).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from m3lab.cost.roofline import bound_times_us, compute_dtype, peak_flops
from m3lab.errors import M3LabError
from m3lab.optable.routing import balanced
from m3lab.spec.gemm_cost import dense_equivalent, gemm_cost
from m3lab.spec.hardware import load_hardware

DATA_DIR = Path(__file__).with_name("data")
BANDWIDTH = 1.0          # kernel width in log2 units of M, N and K (chosen by the out-of-sample check)
FIT_DTYPES = ("fp8", "mxfp8", "mxfp4", "bf16", "fp16")   # weight dtypes a measured table can fit
TORCH_DTYPES = {"torch.float8_e4m3fn": "fp8", "torch.float8_e4m3fnuz": "fp8", "torch.bfloat16": "bf16",
                "torch.float16": "fp16", "torch.int8": "int8"}
GFX_HARDWARE = {("gfx950", 256): "mi355x", ("gfx942", 304): "mi300x"}
UNCALIBRATED = "uncalibrated bound"
# Activation dtype of the measured GEMMs: AITER's fp8 tables are a8w8 (fp8 activations, per-token scales);
# every other table is read as bf16 activations.
MEASURED_ACT = {"fp8": "fp8", "mxfp8": "fp8"}


def measured_cost(m, n, k, w_dtype: str, weights_read=1.0):
    """:func:`m3lab.spec.gemm_cost.gemm_cost` of a measured GEMM (activation dtype: :data:`MEASURED_ACT`)."""
    return gemm_cost(m, n, k, w_dtype, MEASURED_ACT.get(str(w_dtype), "bf16"), weights_read=weights_read)


# ---------------------------------------------------------------- reading measured tables
def _read_aiter(df: pd.DataFrame, source: str) -> pd.DataFrame:
    if "q_dtype_w" in df.columns:
        w = df["q_dtype_w"].map(lambda s: TORCH_DTYPES.get(str(s), str(s)))
    elif "dtype" in df.columns:
        w = df["dtype"].map(lambda s: TORCH_DTYPES.get(str(s), str(s)))
    else:
        raise M3LabError(f"{source}: AITER table without q_dtype_w or dtype column", field="columns")
    device = [GFX_HARDWARE.get((g, int(c)), f"{g}/{c}CU") for g, c in zip(df["gfx"], df["cu_num"])]
    return pd.DataFrame({"op": "gemm", "m": df["M"].astype(int), "n": df["N"].astype(int),
                         "k": df["K"].astype(int), "w_dtype": w, "us": df["us"].astype(float),
                         "provider": df.get("libtype", "aiter"), "device": device, "source": source})


def _read_aiter_fmoe(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """AITER tuned fused-MoE CSV: one row per (tokens, model_dim, inter_dim, experts, topk) with its µs."""
    w = df["q_dtype_w"].map(lambda s: TORCH_DTYPES.get(str(s), str(s))) if "q_dtype_w" in df else "bf16"
    gfx = df["gfx"] if "gfx" in df else pd.Series(["?"] * len(df))
    device = [GFX_HARDWARE.get((g, int(c)), f"{g}/{c}CU") for g, c in zip(gfx, df["cu_num"])]
    return pd.DataFrame({"op": "fused_moe", "tokens": df["token"].astype(int), "hidden": df["model_dim"].astype(int),
                         "inter": df["inter_dim"].astype(int), "experts": df["expert"].astype(int),
                         "topk": df["topk"].astype(int), "w_dtype": w, "us": df["us"].astype(float),
                         "provider": "aiter", "device": device, "source": source})


_SHAPE_RE = re.compile(r"([mnk])\s*[=:_]?\s*(\d+)", re.IGNORECASE)


def _parse_shape(shape: str) -> tuple[int, int, int]:
    """'M=1,N=2560,K=6144' / 'm1_n2560_k6144' / '1x2560x6144' / '[1, 2560, 6144]' -> (m, n, k)."""
    text = str(shape)
    named = dict((key.lower(), int(v)) for key, v in _SHAPE_RE.findall(text))
    if {"m", "n", "k"} <= named.keys():
        return named["m"], named["n"], named["k"]
    nums = [int(v) for v in re.findall(r"\d+", text)]
    if len(nums) == 3:
        return nums[0], nums[1], nums[2]
    raise M3LabError(f"cannot read (M, N, K) from shape {shape!r}", field="shape",
                     hint="write shapes as 'M=1,N=2560,K=6144' or give m, n, k columns")


def _weight_dtype(text) -> str:
    """'mxfp8' / 'bf16xmxfp8' / 'a=bf16,w=fp8' / 'torch.bfloat16' -> the weight dtype (the last one named)."""
    s = TORCH_DTYPES.get(str(text), str(text)).lower()
    found = re.findall(r"mxfp8|mxfp4|fp8|bf16|fp16", s)
    return found[-1] if found else s


def _read_long(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """m3lab's long benchmark format: op, provider, shape (or m/n/k), dtype, us_p50, device, ..."""
    if {"m", "n", "k"} <= set(df.columns):
        mnk = df[["m", "n", "k"]].astype(int).to_numpy()
    else:
        mnk = np.array([_parse_shape(s) for s in df["shape"]], dtype=int).reshape(-1, 3)
    dtype_col = "w_dtype" if "w_dtype" in df.columns else "dtype"
    out = pd.DataFrame({"op": df["op"].astype(str), "m": mnk[:, 0], "n": mnk[:, 1], "k": mnk[:, 2],
                        "w_dtype": df[dtype_col].map(_weight_dtype),
                        "us": df["us_p50"].astype(float), "provider": df.get("provider", "?"),
                        "device": df.get("device", "?"), "source": source})
    out = out[out["op"].str.contains("gemm") & ~out["op"].str.contains("grouped")]
    # achievable = the best provider per shape and dtype
    return out.sort_values("us").drop_duplicates(["m", "n", "k", "w_dtype"]).reset_index(drop=True)


def read_measured_table(path: str | Path) -> pd.DataFrame:
    """Read an AITER GEMM CSV, an AITER fused-MoE CSV or an m3lab long-format bench CSV into rows
    ``[op, m, n, k, w_dtype, us, provider, device, source]`` (GEMMs; op "gemm") or ``[op, tokens, hidden,
    inter, experts, topk, w_dtype, us, ...]`` (op "fused_moe"); µs measured on ``device``."""
    p = Path(path)
    if not p.is_file():
        raise M3LabError(f"measured table {str(p)!r} does not exist", field="calibration",
                         hint=f"give a CSV path or one of {', '.join(CALIBRATIONS)}")
    try:
        df = pd.read_csv(p)
    except Exception as err:  # pandas raises several parser error types
        raise M3LabError(f"{p}: not a readable CSV ({err.__class__.__name__})", field="calibration") from None
    cols = set(df.columns)
    if {"token", "model_dim", "inter_dim", "expert", "topk", "us", "cu_num"} <= cols:
        out = _read_aiter_fmoe(df, p.name)
    elif {"gfx", "cu_num", "M", "N", "K", "us"} <= cols:
        out = _read_aiter(df, p.name)
    elif {"op", "us_p50"} <= cols and ({"shape"} <= cols or {"m", "n", "k"} <= cols):
        out = _read_long(df, p.name)
    else:
        raise M3LabError(f"{p}: unknown measured-table columns {sorted(cols)[:8]}...", field="calibration",
                         hint="expected an AITER tuned GEMM CSV (gfx,cu_num,M,N,K,...,us) or "
                              "m3lab's long format (op,provider,shape,dtype,us_p50,...)")
    out = out[(out["us"] > 0) & np.isfinite(out["us"])]
    if out.empty:
        raise M3LabError(f"{p}: no GEMM rows with a positive time", field="calibration")
    return out.reset_index(drop=True)


# ---------------------------------------------------------------- the fit
def gemm_regime(df: pd.DataFrame, hw) -> pd.DataFrame:
    """Add flops, bytes, roofline terms (µs), the bound and ``eff = t_bound / us`` to GEMM rows."""
    out = df.copy()
    flops, nbytes = np.zeros(len(out)), np.zeros(len(out))
    for w, idx in out.groupby("w_dtype").indices.items():
        c = measured_cost(out["m"].to_numpy(float)[idx], out["n"].to_numpy(float)[idx],
                          out["k"].to_numpy(float)[idx], str(w))
        flops[idx], nbytes[idx] = c.flops, c.bytes
    peak = np.array([peak_flops(hw, compute_dtype(w, None, hw)) for w in out["w_dtype"]])
    t_c, t_m, _, t_b, bound = bound_times_us(flops, nbytes, 0.0, peak, hw.hbm_bw, 1.0)
    out["flops"], out["bytes"], out["t_compute_us"], out["t_memory_us"] = flops, nbytes, t_c, t_m
    out["t_bound_us"], out["bound"] = t_b, bound
    out["intensity"] = flops / nbytes
    if "us" in out:
        out["eff"] = out["t_bound_us"] / out["us"]
    return out


def grouped_regime(df: pd.DataFrame, hw) -> pd.DataFrame:
    """Fused-MoE rows -> the roofline bound of its two grouped GEMMs (each its own max of compute and memory,
    weights of the expected touched experts under balanced routing) and ``eff = t_bound / us``."""
    out = df.copy()
    routed = out["tokens"].to_numpy(float) * out["topk"].to_numpy(float)
    active = np.array([balanced(int(e), int(k_top)).active_experts(t)[0]
                       for e, k_top, t in zip(out["experts"], out["topk"], out["tokens"])])
    inter, hidden = out["inter"].to_numpy(float), out["hidden"].to_numpy(float)
    t_bound = np.zeros(len(out))
    for w, idx in out.groupby("w_dtype").indices.items():
        peak = peak_flops(hw, compute_dtype(str(w), None, hw))
        for n, k in ((2 * inter[idx], hidden[idx]), (hidden[idx], inter[idx])):
            c = measured_cost(routed[idx], n, k, str(w), weights_read=active[idx])  # every touched expert's weights
            t_bound[idx] += np.maximum(c.flops / peak, c.bytes / hw.hbm_bw) * 1e6
    m_eq, side = dense_equivalent(routed, active, 3.0 * inter, hidden)
    out["m"], out["n"], out["k"] = m_eq, side, side
    out["t_bound_us"], out["eff"] = t_bound, t_bound / out["us"]
    out["bound"] = "memory"
    return out


def _features(m, n, k) -> np.ndarray:
    return np.log2(np.column_stack([np.asarray(m, float), np.asarray(n, float), np.asarray(k, float)]))


@dataclass(frozen=True)
class GemmFit:
    """Local-linear fit of log efficiency over (log2 M, log2 N, log2 K) for one dtype family."""

    family: str
    points: pd.DataFrame            # measured rows with gemm_regime() columns
    bandwidth: float = BANDWIDTH

    def efficiency(self, m, n, k) -> np.ndarray:
        """Predicted achievable fraction of the roofline bound at each (m, n, k)."""
        xt = _features(self.points["m"], self.points["n"], self.points["k"])
        y = np.log(self.points["eff"].to_numpy())
        xq = np.clip(_features(np.maximum(m, 1), np.maximum(n, 1), np.maximum(k, 1)), xt.min(0), xt.max(0))
        out = np.empty(len(xq))
        for i, q in enumerate(xq):
            d = (xt - q) / self.bandwidth
            w = np.exp(-0.5 * (d * d).sum(axis=1))
            a = np.column_stack([np.ones(len(xt)), xt - q]) * np.sqrt(w)[:, None]
            coef, *_ = np.linalg.lstsq(a, y * np.sqrt(w), rcond=None)
            out[i] = coef[0]
        lo = float(self.points["eff"].min()) / 2
        return np.clip(np.exp(out), lo, 1.0)


def fit_gemm(table: pd.DataFrame, hw, bandwidth: float = BANDWIDTH) -> dict[str, GemmFit]:
    """Fit one :class:`GemmFit` per weight dtype present in a measured table on hardware ``hw``; fused-MoE
    rows fit ``"<dtype>_grouped"`` over their dense-equivalent regime (:func:`m3lab.spec.gemm_cost.dense_equivalent`)."""
    fits = {}
    op = table["op"] if "op" in table else pd.Series(["gemm"] * len(table), index=table.index)
    known = table["w_dtype"].where(table["w_dtype"].isin(list(FIT_DTYPES)))
    for fam, rows in table.assign(family=known, _op=op).dropna(subset=["family"]).groupby("family"):
        dense, moe = rows[rows["_op"] != "fused_moe"], rows[rows["_op"] == "fused_moe"]
        if len(dense):
            fits[str(fam)] = GemmFit(str(fam), gemm_regime(dense.drop(columns="_op").reset_index(drop=True), hw), bandwidth)
        if len(moe):
            name = f"{fam}_grouped"
            fits[name] = GemmFit(name, grouped_regime(moe.drop(columns="_op").reset_index(drop=True), hw), bandwidth)
    if not fits:
        raise M3LabError("measured table has no GEMM rows of a known dtype", field="calibration",
                         hint=f"dtypes known: {', '.join(FIT_DTYPES)}")
    return fits


@dataclass(frozen=True)
class Calibration:
    """Achievable efficiencies for one hardware profile, fitted from named measured tables."""

    name: str
    hardware: str
    source: str
    fits: dict = field(default_factory=dict)          # family -> GemmFit
    floors_us: dict = field(default_factory=dict)     # kind -> µs, the measured tables' least times

    @property
    def label(self) -> str:
        fams = ", ".join(sorted(self.fits))
        return (f"calibrated on {self.hardware} by {self.name} (tables: {fams}); each kernel costed by the source "
                f"of the path vLLM runs (m3lab.cost.sources), assumptions in m3lab.cost.assumptions")

    def residuals(self) -> pd.DataFrame:
        """In-sample residuals: measured vs fitted µs for every calibration point."""
        parts = []
        for fam, fit in self.fits.items():
            pts = fit.points
            eff = fit.efficiency(pts["m"], pts["n"], pts["k"])
            parts.append(pts.assign(family=fam, predicted_us=pts["t_bound_us"] / eff))
        out = pd.concat(parts, ignore_index=True)
        out["rel_error"] = out["predicted_us"] / out["us"] - 1
        return out[["family", "m", "n", "k", "w_dtype", "us", "predicted_us", "rel_error", "eff", "bound"]]



def calibrate(tables, hw, name: str | None = None, bandwidth: float = BANDWIDTH) -> Calibration:
    """Fit a :class:`Calibration` for hardware ``hw`` from measured table paths (or DataFrames)."""
    frames, names = [], []
    for t in ([tables] if isinstance(tables, (str, Path, pd.DataFrame)) else tables):
        frames.append(t if isinstance(t, pd.DataFrame) else read_measured_table(t))
        names.append("<frame>" if isinstance(t, pd.DataFrame) else Path(t).name)
    table = pd.concat(frames, ignore_index=True)
    fits = fit_gemm(table, hw, bandwidth)
    dense_min = [float(f.points["us"].min()) for name, f in fits.items() if not name.endswith("_grouped")]
    moe_min = [float(f.points["us"].min()) for name, f in fits.items() if name.endswith("_grouped")]
    floors = {"gemm": min(dense_min), "lm_head": min(dense_min)} if dense_min else {}
    if moe_min:  # a fused MoE is two grouped GEMMs: each carries half the fused kernel's least time
        floors["grouped_gemm"] = min(moe_min) / 2
    return Calibration(name=name or "+".join(names), hardware=hw.name, source="; ".join(names),
                       fits=fits, floors_us=floors)


# ---------------------------------------------------------------- shipped calibrations
@dataclass(frozen=True)
class CalibrationEntry:
    hardware: str
    files: tuple
    source: str


CALIBRATIONS = {
    "aiter-mi355x": CalibrationEntry(
        hardware="mi355x",
        files=("aiter_mi355x_fp8_gemm_minimax_m3.csv", "aiter_mi355x_bf16_gemm_minimax_m3.csv",
               "aiter_mi355x_fp8_fmoe_minimax_m2_5.csv"),
        source="ROCm/aiter tuned GEMM tables for MiniMax M3 @e4048607 and fused-MoE table for MiniMax-M2.5 "
               "@6d00eb74 (measured on MI355X, gfx950 256 CU)"),
}
DEFAULT_FOR_HARDWARE = {"mi355x": "aiter-mi355x"}


def _resolve_hardware(hw):
    if isinstance(hw, str):
        return load_hardware(hw)
    return hw


@functools.lru_cache(maxsize=16)
def _load_named(name: str, hw_name: str) -> Calibration:
    entry = CALIBRATIONS[name]
    hw = _resolve_hardware(hw_name)
    cal = calibrate([DATA_DIR / f for f in entry.files], hw, name=name)
    return Calibration(name=name, hardware=hw.name, source=entry.source, fits=cal.fits, floors_us=cal.floors_us)


def load_calibration(name_or_path: str, hw=None) -> Calibration:
    """A shipped calibration by name (``"aiter-mi355x"``) or a fit of a measured CSV on ``hw``."""
    if name_or_path in CALIBRATIONS:
        entry = CALIBRATIONS[name_or_path]
        hw_name = entry.hardware if hw is None else _resolve_hardware(hw).name
        if hw_name != entry.hardware:
            raise M3LabError(f"calibration {name_or_path!r} was measured on {entry.hardware}, not {hw_name}",
                             field="calibration", hint="pass a table measured on that hardware, or none")
        return _load_named(name_or_path, hw_name)
    if hw is None:
        raise M3LabError(f"calibration table {name_or_path!r} needs the hardware it was measured on",
                         field="hardware")
    return calibrate([name_or_path], _resolve_hardware(hw))


def default_calibration(hw) -> Calibration | None:
    """The shipped calibration of a hardware profile (MI355X: the AITER tables), else None."""
    hw = _resolve_hardware(hw)
    name = DEFAULT_FOR_HARDWARE.get(hw.name)
    return load_calibration(name, hw) if name else None
