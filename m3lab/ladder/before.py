"""m3lab's representation of the state before a fix that vLLM 0.33.0 has as code: there is no switch to turn it off.

The cost follows vLLM's dispatch (:mod:`m3lab.cost.sources`): vLLM's MXFP8 linear (``_mxfp8_linear_kernel``,
paths ``mxfp8_dot_scaled_*``) is costed from the calibration's FP8 GEMM fit at the row's (M, N, K). The state
before the **decode GEMM launcher** is represented there (:class:`BeforeCalibration`): the decode-M (at most
``DECODE_MAX_M`` rows) MXFP8 GEMMs run the large-M tile, their efficiency divided by the prefill-tile / decode-tile
time ratio m3lab measured with its own GEMM kernel on an H200 at the nearest (M, N, K)
(``traces/bench/gemm.csv``, bf16, ``m3lab.bench_analysis.gemm.tile_gain``). **Projected**: the ratio is carried to the
deployment's GPU, an assumption whose :data:`SCALE` the sensitivity table moves. A ceiling (no calibration) has no
efficiency to lose and does not move.

The other code fixes act on kernels costed from their H200 measurements (:mod:`m3lab.cost.peers`: vLLM's Triton
MoE, indexer and sparse attention), which no calibration reaches: :data:`REPRESENTED` leaves them out, and the
ladder reports their step as not estimated, with the representation it would use (``Fix.before``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from m3lab.bench.table import TRACES_BENCH, read_table
from m3lab.bench_analysis.gemm import newest_harness, tile_gain
from m3lab.kernels.gemm.tables import DECODE_MAX_M

SCALE = 1.0      # assumed: the H200 before/after ratio carries to the target hardware unchanged (1 = as measured)
LAUNCHER_FIT = "fp8"   # the calibration fit vLLM's MXFP8 linear is costed from (m3lab.cost.sources, dot_scaled_*)
REPRESENTED = {"decode_gemm_launcher": "H200 tile ratio (traces/bench/gemm.csv), projected"}


@functools.lru_cache(maxsize=1)
def launcher_ratios() -> pd.DataFrame:
    """``[M, N, K, ratio]``: prefill-tile / decode-tile time of m3lab's bf16 GEMM on the H200, M <= DECODE_MAX_M."""
    g = tile_gain(newest_harness(read_table(TRACES_BENCH / "gemm.csv")))
    g = g[(g["dtype"] == "bf16") & (g["M"] <= DECODE_MAX_M)]
    return g[["M", "N", "K", "ratio"]].astype(float).reset_index(drop=True)


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


@dataclass(frozen=True)
class SlowedFit:
    """A GEMM fit (``m3lab.cost.calibration.GemmFit``) whose efficiency is divided by the launcher's slowdown."""

    base: Any
    scale: float

    @property
    def points(self) -> pd.DataFrame:
        return self.base.points

    @property
    def family(self) -> str:
        return self.base.family

    def efficiency(self, m, n, k) -> np.ndarray:
        return np.asarray(self.base.efficiency(m, n, k), float) / launcher_slowdown(m, n, k, self.scale)


_SLOWED: dict = {}   # (id of a calibration, scale) -> (the calibration, its fits with the launcher's slowed)


def _slowed_fits(base, scale: float) -> dict:
    """``base.fits`` with the launcher's fit slowed: one object per calibration and scale, as the cost model
    memoises fits by identity (the calibration is kept alive while its id keys the cache)."""
    key = (id(base), float(scale))
    if key not in _SLOWED:
        fits = dict(base.fits)
        if LAUNCHER_FIT in fits:
            fits[LAUNCHER_FIT] = SlowedFit(fits[LAUNCHER_FIT], scale)
        _SLOWED[key] = (base, fits)
    return _SLOWED[key][1]


@dataclass(frozen=True)
class BeforeCalibration:
    """A calibration (``m3lab.cost.calibration.Calibration``) with the code fixes ``undone`` in their state before
    (see the module docstring); everything else is ``base``'s."""

    base: Any
    undone: tuple[str, ...]
    scale: float = SCALE

    def __post_init__(self):
        unknown = [f for f in self.undone if f not in REPRESENTED]
        if unknown:
            raise ValueError(f"no representation of the state before {unknown}; represented: {list(REPRESENTED)}")

    def __getattr__(self, name: str):   # floors_us, residuals, family_for, hardware, source: the base's
        if name.startswith("__") or name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def fits(self) -> dict:
        return _slowed_fits(self.base, self.scale) if "decode_gemm_launcher" in self.undone else self.base.fits

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def label(self) -> str:
        before = "; ".join(f"{f} undone ({REPRESENTED[f]}, scale {self.scale:g})" for f in self.undone)
        return f"{self.base.label}; m3lab's representation of the state before: {before}"
