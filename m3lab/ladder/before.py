"""m3lab's representation of the state before a fix that vLLM 0.33.0 has as code: there is no switch to turn it off.

Two such fixes slow one kind of kernel down, and are represented as the ratio m3lab measured between the two
states with its own kernels on an H200 (**projected**: the ratio is carried to the deployment's hardware profile,
an assumption whose :data:`SCALE` the sensitivity table moves):

- ``decode_gemm_launcher``: before it, the decode-M (at most ``DECODE_MAX_M`` rows) MXFP8 GEMMs run the large-M
  tile. Their time is multiplied by the prefill-tile / decode-tile time of m3lab's GEMM kernel at the nearest
  measured (M, N, K) (``traces/bench/gemm.csv``, bf16, ``m3lab.bench.analysis.tile_gain``).
- ``moe_program_order``: before it, the grouped GEMMs run the slower of the two program orders m3lab's MoE kernel
  was measured with (``traces/bench/moe.csv``: order=token, vLLM's GROUP_SIZE_M swizzle, vs order=expert; balanced
  routing), at the nearest tokens per touched expert.

They act through the calibration (:class:`BeforeCalibration`): a calibrated estimate's GEMM efficiencies divided
by the ratio, so a ceiling (efficiency 1) does not move; the program order needs a fused-MoE fit of the weights'
family (the dense fallback of a grouped GEMM is left as it is). The speculative-decoding code fixes
(``request_level_index_batching``, ``multi_token_verification``) change the indexer and the attention, which no
calibration reaches: :data:`REPRESENTED` leaves them out and the ladder reports their step as not estimated.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from m3lab.bench.analysis import newest_harness, tile_gain
from m3lab.bench.table import TRACES_BENCH, read_table
from m3lab.errors import M3LabError
from m3lab.kernels.gemm.tables import DECODE_MAX_M

SCALE = 1.0      # assumed: the H200 before/after ratio carries to the target hardware unchanged (1 = as measured)
LAUNCHER_DTYPES = ("mxfp8",)   # the weights vLLM's shape-aware launcher serves (_mxfp8_linear_kernel)
MOE_TOPK, MOE_EXPERTS = 5, 129  # the measured MoE rows: M3 with the shared expert fused (traces/bench/moe.csv)
REPRESENTED = {
    "decode_gemm_launcher": "H200 tile ratio (traces/bench/gemm.csv), projected",
    "moe_program_order": "H200 program-order ratio (traces/bench/moe.csv), projected",
}


@functools.lru_cache(maxsize=1)
def launcher_ratios() -> pd.DataFrame:
    """``[M, N, K, ratio]``: prefill-tile / decode-tile time of m3lab's bf16 GEMM on the H200, M <= DECODE_MAX_M."""
    g = tile_gain(newest_harness(read_table(TRACES_BENCH / "gemm.csv")))
    g = g[(g["dtype"] == "bf16") & (g["M"] <= DECODE_MAX_M)]
    return g[["M", "N", "K", "ratio"]].astype(float).reset_index(drop=True)


@functools.lru_cache(maxsize=1)
def program_order_ratios() -> pd.DataFrame:
    """``[tokens, rows_per_expert, ratio]``: slower / faster of the two measured program orders (balanced routing)."""
    df = read_table(TRACES_BENCH / "moe.csv")
    df = df[df["shape"].str.contains("routing=balanced")]
    wide = df.pivot_table(index="T", columns="provider", values="us_p50", aggfunc="median")
    both = wide[["m3lab-order=token", "m3lab-order=expert"]].dropna()
    tokens = both.index.to_numpy(float)
    routed = MOE_TOPK * tokens
    return pd.DataFrame({"tokens": tokens, "rows_per_expert": routed / np.minimum(MOE_EXPERTS, routed),
                         "ratio": (both.max(axis=1) / both.min(axis=1)).to_numpy()})


def _nearest(table: pd.DataFrame, keys: list[str], query: np.ndarray) -> np.ndarray:
    """``ratio`` of the row nearest each query in log2 of ``keys`` (the mean over rows equally near)."""
    pts = np.log2(table[keys].to_numpy(float))
    q = np.log2(np.maximum(np.atleast_2d(query), 1.0))
    d = np.sqrt(((q[:, None, :] - pts[None, :, :]) ** 2).sum(axis=2))
    near = np.isclose(d, d.min(axis=1, keepdims=True))
    ratio = table["ratio"].to_numpy(float)
    return (near * ratio).sum(axis=1) / near.sum(axis=1)


def launcher_slowdown(m, n, k, scale: float = SCALE) -> np.ndarray:
    """Time factor (>= 1) of GEMMs ``(m, n, k)`` before the decode launcher: 1 above DECODE_MAX_M rows."""
    m, n, k = (np.atleast_1d(np.asarray(x, float)) for x in (m, n, k))
    ratio = _nearest(launcher_ratios(), ["M", "N", "K"], np.column_stack([m, n, k]))
    return np.where(m <= DECODE_MAX_M, 1.0 + scale * (ratio - 1.0), 1.0)


def program_order_slowdown(rows_per_expert, scale: float = SCALE) -> np.ndarray:
    """Time factor (>= 1) of grouped GEMMs with ``rows_per_expert`` rows per touched expert before the program order."""
    q = np.atleast_1d(np.asarray(rows_per_expert, float))[:, None]
    return 1.0 + scale * (_nearest(program_order_ratios(), ["rows_per_expert"], q) - 1.0)


@dataclass(frozen=True)
class BeforeCalibration:
    """A calibration (``m3lab.cost.calibration.Calibration``) with the code fixes ``undone`` in their state before:
    the GEMM efficiencies of ``base`` divided by the fixes' slowdowns; everything else is ``base``'s."""

    base: Any
    undone: tuple[str, ...]
    scale: float = SCALE

    def __post_init__(self):
        unknown = [f for f in self.undone if f not in REPRESENTED]
        if unknown:
            raise ValueError(f"no representation of the state before {unknown}; represented: {list(REPRESENTED)}")
        # a grouped GEMM without a fused-MoE fit takes the dense fit at its dense-equivalent shape, which the
        # launcher's slowdown could not tell from a decode GEMM: that state before needs the fused-MoE fit
        if "decode_gemm_launcher" in self.undone and any(
                self.base.family_for(w, "_grouped") is None for w in LAUNCHER_DTYPES):
            raise M3LabError(f"calibration {self.base.name} has no fused-MoE fit for {'/'.join(LAUNCHER_DTYPES)}: "
                             "the decode launcher's state before cannot be told from the MoE's", field="calibration",
                             hint="use a calibration with a fused-MoE table (the shipped aiter-mi355x has one)")

    def __getattr__(self, name: str):   # fits, floors_us, residuals, family_for, hardware, source: the base's
        if name.startswith("__") or name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def label(self) -> str:
        before = "; ".join(f"{f} undone ({REPRESENTED[f]}, scale {self.scale:g})" for f in self.undone)
        return f"{self.base.label}; m3lab's representation of the state before: {before}"

    def gemm_efficiency(self, m, n, k, w_dtype: str) -> np.ndarray:
        eff = np.asarray(self.base.gemm_efficiency(m, n, k, w_dtype), float)
        if "decode_gemm_launcher" in self.undone and str(w_dtype) in LAUNCHER_DTYPES:
            eff = eff / launcher_slowdown(m, n, k, self.scale)
        return eff

    def grouped_efficiency(self, m_eq, side, w_dtype: str) -> np.ndarray | None:
        """The base's fused-MoE fit divided by the program-order slowdown when that fix is undone; None (the cost
        model's dense fallback, untouched) where the base has no fused-MoE fit for the dtype."""
        eff = self.base.grouped_efficiency(m_eq, side, w_dtype)
        if eff is None or "moe_program_order" not in self.undone:
            return eff
        return np.asarray(eff, float) / program_order_slowdown(m_eq, self.scale)

    def floor_us(self, kind: str) -> float:
        return self.base.floor_us(kind)
