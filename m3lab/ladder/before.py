"""m3lab's representation of the state before a fix that vLLM 0.33.0 has as code: there is no switch to turn it off.

Each state before is a per-op override of the calibrated cost (:class:`m3lab.cost.overrides.OpOverride`, carried by
the estimate's :class:`~m3lab.serving.step_cost.StepCoster`) on exactly the rows of the (vLLM op, path) that runs the
fix's code, fed by m3lab's own kernel measurements or by paths the cost model already costs. It is **m3lab's
representation, not vLLM's** and every figure it gives is **projected**:

| fix | rows | state before |
|---|---|---|
| ``decode_gemm_launcher`` | the MXFP8 dense GEMMs (``mxfp8_dot_scaled_*``) with M <= ``DECODE_MAX_M`` | time x the prefill-tile / decode-tile ratio of m3lab's GEMM kernel on an H200 at the nearest (M, N, K) (``traces/bench/gemm.csv``, bf16) |
| ``moe_program_order`` | vLLM's Triton MXFP8 grouped GEMMs (``experts`` on ``triton_mxfp8*``) | time x the slower / faster of the two program orders of m3lab's grouped-MoE kernel on an H200 at the nearest tokens per step (``traces/bench/moe.csv``, ``m3lab-order=token`` vs ``m3lab-order=expert``, bf16, balanced routing) |
| ``request_level_index_batching`` | the decode indexer (``indexer`` on ``triton_amd*``) of verify steps (1 + k rows per request) | every query row re-reads its request's index keys: the row's bound with ``bytes_kv`` x rows per request over its bound, at the indexer's measured efficiency |
| ``multi_token_verification`` | the verify steps' sparse attention on AITER's paged path (``attention`` on ``aiter_sparse_pa``) | costed as vLLM's Triton sparse attention (``triton_sparse``: what ``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0`` runs) |

Each has one named assumption (:data:`ASSUMPTIONS`: value, range, source) that the ladder's sensitivity table moves:
a ratio measured on an H200 carries to the target GPU (its part above 1 scaled), the re-reads reach HBM, and for
multi-token verification the cost model's own ``aiter_pa_vs_triton``. A ceiling (no calibration) has no efficiency
to lose: no state before moves it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from m3lab.bench.table import TRACES_BENCH, read_table
from m3lab.bench_analysis.gemm import newest_harness, tile_gain
from m3lab.cost.assumptions import ASSUMPTIONS as COST_ASSUMPTIONS
from m3lab.cost.assumptions import Assumption
from m3lab.cost.overrides import OpOverride
from m3lab.cost.roofline import bound_times_us, compute_dtype, peak_flops
from m3lab.kernels.gemm.tables import DECODE_MAX_M

_MXFP8_DENSE = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "shared_gate_up", "shared_down")
GEMM_TABLE, MOE_TABLE = "traces/bench/gemm.csv", "traces/bench/moe.csv"
MOE_ORDERS = ("m3lab-order=token", "m3lab-order=expert")


def _scale(name: str, what: str) -> Assumption:
    return Assumption(name, 1.0, 0.5, 1.5, "x (ratio excess over 1)", "scale",
                      f"assumed: {what} carries to the target GPU unchanged (1 = as measured on the H200); the "
                      "range halves its part above 1 and raises it by half")


#: The assumption of each state before (value, range, source); ``kind`` "scale" moves the override's scale, and
#: multi-token verification's is the cost model's own (moved through the cost sensitivity).
ASSUMPTIONS: Mapping[str, Assumption] = {
    "decode_gemm_launcher": _scale("launcher_h200_ratio", "m3lab's H200 prefill-tile / decode-tile GEMM ratio "
                                   f"({GEMM_TABLE})"),
    "moe_program_order": _scale("moe_order_h200_ratio", "m3lab's H200 slower / faster grouped-MoE program order "
                                f"ratio ({MOE_TABLE})"),
    "request_level_index_batching": Assumption(
        "index_reread_hbm_fraction", 1.0, 0.5, 1.0, "x (re-read bytes that reach HBM)", "scale",
        "assumed: scored row by row, each verify row's re-read of its request's index keys comes from HBM (1); low: "
        "half of them hit in cache"),
    "multi_token_verification": COST_ASSUMPTIONS["aiter_pa_vs_triton"],
}


@functools.lru_cache(maxsize=1)
def launcher_ratios() -> pd.DataFrame:
    """``[M, N, K, ratio]``: prefill-tile / decode-tile time of m3lab's bf16 GEMM on the H200, M <= DECODE_MAX_M."""
    g = tile_gain(newest_harness(read_table(TRACES_BENCH / "gemm.csv")))
    g = g[(g["dtype"] == "bf16") & (g["M"] <= DECODE_MAX_M)]
    return g[["M", "N", "K", "ratio"]].astype(float).reset_index(drop=True)


@functools.lru_cache(maxsize=1)
def moe_order_ratios() -> pd.DataFrame:
    """``[T, ratio]``: slower / faster p50 time of m3lab's grouped-MoE kernel under its two program orders on the
    H200 (bf16, 129 experts, top-5, balanced routing), per tokens per step ``T``."""
    df = newest_harness(read_table(TRACES_BENCH / "moe.csv"))
    df = df[df["provider"].isin(MOE_ORDERS) & df["shape"].astype(str).str.contains("routing=balanced")]
    p = df.pivot_table(index="T", columns="provider", values="us_p50", aggfunc="median").dropna()
    out = pd.DataFrame({"T": p.index.astype(float), "ratio": (p.max(axis=1) / p.min(axis=1)).to_numpy(float)})
    return out.reset_index(drop=True)


def _nearest(table: pd.DataFrame, keys: list[str], query: np.ndarray) -> np.ndarray:
    """``ratio`` of the row nearest each query in log2 of ``keys`` (the mean over rows equally near)."""
    pts = np.log2(table[keys].to_numpy(float))
    q = np.log2(np.maximum(np.atleast_2d(query), 1.0))
    d = np.sqrt(((q[:, None, :] - pts[None, :, :]) ** 2).sum(axis=2))
    near = np.isclose(d, d.min(axis=1, keepdims=True))
    ratio = table["ratio"].to_numpy(float)
    return (near * ratio).sum(axis=1) / near.sum(axis=1)


def launcher_ratio(rows) -> np.ndarray:
    """Time factor (>= 1) of GEMM rows before the decode launcher: the nearest measured ratio at M <= DECODE_MAX_M,
    1 above (``rows``: :class:`m3lab.cost.sources.Rows`)."""
    m, n, k = rows.f("m"), rows.f("n"), rows.f("k")
    ratio = _nearest(launcher_ratios(), ["M", "N", "K"], np.column_stack([m, n, k]))
    return np.where(m <= DECODE_MAX_M, ratio, 1.0)


def moe_order_ratio(rows) -> np.ndarray:
    """Time factor (>= 1) of grouped-GEMM rows at the slower program order, at the nearest measured tokens per step
    (the row's routed tokens over its top-k)."""
    tokens = rows.f("routed_tokens") / np.maximum(rows.f("topk"), 1.0)
    return _nearest(moe_order_ratios(), ["T"], tokens[:, None])


def _rows_per_request(rows) -> np.ndarray:
    return rows.f("q_tokens") / np.maximum(rows.f("requests"), 1.0)


def index_reread_ratio(rows) -> np.ndarray:
    """Time factor (>= 1) of indexer rows whose every query row re-reads its request's index keys (``bytes_kv``):
    the roofline bound with those bytes times the rows per request over the row's own bound."""
    hw = rows.hw
    extra = (np.maximum(_rows_per_request(rows), 1.0) - 1.0) * rows.f("bytes_kv")
    mem = rows.f("bytes_compute") + rows.f("bytes_weight") + rows.f("bytes_kv")
    peak = np.array([peak_flops(hw, compute_dtype(w if isinstance(w, str) else None, a, hw))
                     for w, a in zip(rows("w_dtype", None), rows("act_dtype", "bf16"))], dtype=float)
    flops, comm = rows.f("flops"), rows.f("bytes_comm")
    own = bound_times_us(flops, mem, comm, peak, hw.hbm_bw, hw.link_bw)[3]
    more = bound_times_us(flops, mem + extra, comm, peak, hw.hbm_bw, hw.link_bw)[3]
    return more / np.maximum(own, 1e-12)


def _verify_rows(rows) -> np.ndarray:
    """Decode rows that verify more than one token per request (speculative decoding)."""
    phase = np.asarray(rows("phase", None), dtype=object)
    return (phase != "prefill") & (_rows_per_request(rows) > 1.0)


@dataclass(frozen=True)
class Before:
    """How m3lab represents the state before one code fix (see the module docstring)."""

    fix: str
    ops: tuple[str, ...]
    path: str
    label: str                       # what it is and its source ("m3lab's representation: ...")
    ratio: Callable | None = None
    path_as: str = ""
    where: Callable | None = None
    kinds: tuple[str, ...] = ()
    data: str = ""

    @property
    def assumption(self) -> Assumption:
        return ASSUMPTIONS[self.fix]

    def override(self, scale: float | None = None) -> OpOverride:
        """The per-op override of this state before (``scale``: of its ratio's part above 1; None: the value)."""
        s = self.assumption.value if scale is None or self.assumption.kind != "scale" else scale
        return OpOverride(self.fix, self.ops, self.path, self.ratio, self.path_as, self.where, self.kinds, float(s),
                          f"{self.fix} in its state before ({self.label}; scale {s:g})", self.data)


BEFORE: Mapping[str, Before] = {b.fix: b for b in (
    Before("decode_gemm_launcher", _MXFP8_DENSE, "mxfp8_dot_scaled",
           "m3lab's representation: the decode-M MXFP8 GEMMs at the large-M tile, time x m3lab's H200 prefill-tile / "
           f"decode-tile ratio ({GEMM_TABLE}, bf16, nearest M, N, K)", launcher_ratio, kinds=("gemm",),
           data=GEMM_TABLE),
    Before("moe_program_order", ("experts",), "triton_mxfp8",
           "m3lab's representation: vLLM's Triton MXFP8 grouped GEMMs at the slower of m3lab's two program orders, "
           f"time x the H200 slower / faster ratio ({MOE_TABLE}, m3lab-order=token vs m3lab-order=expert, bf16, "
           "balanced routing, nearest tokens per step)", moe_order_ratio, kinds=("grouped_gemm",), data=MOE_TABLE),
    Before("request_level_index_batching", ("indexer",), "triton_amd",
           "m3lab's representation: the verify step's indexer reads each request's index keys once per query row "
           "(bytes_kv x rows per request, from the OpTable) at the indexer's measured efficiency",
           index_reread_ratio, where=_verify_rows, kinds=("indexer",)),
    Before("multi_token_verification", ("attention",), "aiter_sparse_pa",
           "m3lab's representation: the verify rows' sparse attention costed as vLLM's Triton path (triton_sparse, "
           "what VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0 runs), beside AITER's paged path; both from the cost model",
           path_as="triton_sparse", where=_verify_rows, kinds=("attention",)),
)}


def overrides_for(undone, scales: Mapping[str, float] | None = None) -> tuple[OpOverride, ...]:
    """The per-op overrides of the code fixes ``undone`` (names of :data:`BEFORE`), at ``scales`` (fix -> scale of
    its assumption; missing: the assumption's value). Raises ValueError for a fix with no representation."""
    unknown = [f for f in undone if f not in BEFORE]
    if unknown:
        raise ValueError(f"no representation of the state before {unknown}; represented: {list(BEFORE)}")
    scales = scales or {}
    return tuple(BEFORE[f].override(scales.get(f)) for f in undone)
