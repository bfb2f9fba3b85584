"""The cost sources: how a row's efficiency, launch floor and "inside" flag are computed from measured data and
named assumptions. Which source costs which kernel is the table in :mod:`m3lab.cost.paths`.

A source gives each row an efficiency (the achievable fraction of its roofline bound), a launch floor (µs), or
marks it ``inside`` a kernel whose measured time already covers it (0 µs). The row's time is then
``max(bound / efficiency, floor)`` (:mod:`m3lab.cost.model`). Every source names the assumptions
(:mod:`m3lab.cost.assumptions`) its efficiency and floor depend on, for the sensitivity table:

| source | efficiency (time) from |
|---|---|
| ``aiter_bf16`` | AITER's tuned BF16 GEMM table on MI355X (tuned shape), or its fit x ``bf16_untuned_vs_aiter`` where AITER falls back to hipBLASLt (untuned shape) |
| ``bf16_untuned`` | the same fit x ``bf16_untuned_vs_aiter`` (hipBLASLt's heuristics, vLLM's skinny kernels) |
| ``bf16x3`` | three BF16 GEMMs of the shape (the fp32 router split into bf16 terms) |
| ``dot_scaled_decode`` / ``_prefill`` | AITER's tuned FP8 GEMM of the same shape x ``dot_scaled_*_vs_aiter_fp8`` |
| ``aiter_moe`` | AITER's fused-MoE fit (MiniMax-M2.5 table, same regime) x ``aiter_moe_untuned`` |
| ``triton_moe`` | vLLM's Triton fused_moe measured on H200 (rows per active expert) x ``amd_vs_h200_fraction`` (AMD) (x ``mxfp8_moe_vs_bf16_fused_moe`` for MXFP8) |
| ``sparse_attention`` / ``aiter_pa`` | vLLM's Triton sparse attention on H200 (decode: requests, context, rows per request; prefill) x carry (x ``aiter_pa_vs_triton``) |
| ``dense_attention`` | torch SDPA decode on H200 (dense layers) / the sparse prefill kernel, x carry |
| ``indexer`` / ``msa_indexer`` | vLLM's AMD Triton indexer on H200 (decode) / the common one (prefill) x carry (x ``msa_vs_triton_indexer``) |
| ``elementwise`` / ``fused`` | ``elementwise_eff``; own launch (``kernel_floor_us``) / inside a neighbour's launch (no floor) |
| ``small_kernel`` | ``small_kernel_eff`` and ``kernel_floor_us`` (top-k, fp32 router, MoE bookkeeping) |
| ``rccl`` / ``custom_ar`` | wire bytes over ``link_eff`` x link bandwidth, at least ``rccl_allreduce_us`` / ``custom_allreduce_us`` (measured collectives where the device has them) |
| ``inside`` | 0 µs: the row's work is inside a measured kernel time (the fused MoE call, the indexer's top-k) |
| ``monokernel`` | ``monokernel_eff`` for every row the persistent FFN kernel replaces (one launch, no floors) |
| ``generic_gemm`` / ``generic_moe`` / ``generic_attention`` / ``collective`` | no decision: a measured table of the row's own dtype where the calibration has one, else ``generic_*_eff`` |

Rows on H200 take H200 peers as measured (no carry); on other NVIDIA GPUs the peers are carried with factor 1.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Mapping

import numpy as np

from m3lab.arith import finite
from m3lab.cost import peers
from m3lab.cost.assumptions import value
from m3lab.cost.collective_time import allreduce_us, load_table
from m3lab.cost.paths import NO_ROWS, source_of
from m3lab.cost.roofline import bound_times_us
from m3lab.errors import M3LabError
from m3lab.spec.gemm_cost import dense_equivalent, gemm_cost


class Rows:
    """Column access for the rows ``idx`` of an OpTable (dict of arrays or DataFrame), with the context a source
    needs: hardware, calibration and assumption overrides."""

    def __init__(self, cols, idx: np.ndarray, hw, cal, overrides):
        self.cols, self.idx, self.hw, self.cal, self.ov = cols, idx, hw, cal, overrides or {}

    def __call__(self, name: str, fill=np.nan) -> np.ndarray:
        v = self.cols.get(name) if hasattr(self.cols, "get") else None
        if v is None:
            return np.full(len(self.idx), fill)
        return np.asarray(v)[self.idx]

    def f(self, name: str) -> np.ndarray:
        return finite(self(name))

    def a(self, name: str) -> float:
        return value(name, self.ov)

    @property
    def amd(self) -> bool:
        return str(getattr(self.hw, "vendor", "")).lower() == "amd"

    def carry(self) -> tuple[float, tuple[str, ...]]:
        """Factor on an H200-measured efficiency for this hardware, and the assumption it names."""
        if self.amd:
            return self.a("amd_vs_h200_fraction"), ("amd_vs_h200_fraction",)
        return 1.0, ()


# A source returns (efficiency [n], floor [n], inside [n] bool, efficiency assumptions, floor assumption
# [, per-row source labels where the source says more than its name])
Result = tuple
SOURCES: dict[str, Callable[[Rows], Result]] = {}


def _source(name: str):
    def deco(fn):
        SOURCES[name] = fn
        return fn
    return deco


def _n(r: Rows) -> int:
    return len(r.idx)


def _const(r: Rows, eff: float, floor: float, eff_terms=(), floor_term="") -> Result:
    return np.full(_n(r), eff), np.full(_n(r), floor), np.zeros(_n(r), bool), tuple(eff_terms), floor_term


_FIT_MEMO: dict = {}   # (id of a fit, m, n, k) -> efficiency: every step repeats the same few shapes
_PINNED: dict = {}


def _table_fit(r: Rows, family: str, m, n, k) -> np.ndarray | None:
    """A measured table's efficiency at (m, n, k), or None when the calibration has no table of ``family``."""
    fit = r.cal.fits.get(family) if r.cal is not None else None
    if fit is None:
        return None
    return _fit_efficiency(fit, np.asarray(m, float), np.asarray(n, float), np.asarray(k, float))


def _fit_efficiency(fit, m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``fit.efficiency`` at each (m, n, k) [rows], memoised per point (the fit is evaluated point by point)."""
    _PINNED.setdefault(id(fit), fit)   # keep the fit alive while its id keys the memo
    keys = [(id(fit), float(a), float(b), float(c)) for a, b, c in zip(m, n, k)]
    todo = [i for i, key in enumerate(keys) if key not in _FIT_MEMO]
    if todo:
        if len(_FIT_MEMO) > 100_000:
            _FIT_MEMO.clear()
        sel = np.asarray(todo)
        eff = fit.efficiency(np.maximum(m[sel], 1), np.maximum(n[sel], 1), np.maximum(k[sel], 1))
        _FIT_MEMO.update({keys[i]: float(e) for i, e in zip(todo, eff)})
    return np.array([_FIT_MEMO[key] for key in keys])


def _gemm_eff(r: Rows, family: str):
    """Efficiency of the GEMM rows from the ``family`` table (deduplicated shapes); None without that table."""
    m, n, k = r.f("m"), r.f("n"), r.f("k")
    shapes, inv = np.unique(np.column_stack([m, n, k]), axis=0, return_inverse=True)
    eff = _table_fit(r, family, shapes[:, 0], shapes[:, 1], shapes[:, 2])
    if eff is None:
        return None
    return eff[inv.ravel()]


def _generic_gemm(r: Rows) -> Result:
    return _const(r, r.a("generic_gemm_eff"), r.a("gemm_floor_us"), ("generic_gemm_eff",), "gemm_floor_us")


@_source("aiter_bf16")
def _aiter_bf16(r: Rows) -> Result:
    eff = _gemm_eff(r, "bf16")
    if eff is None:
        return _generic_gemm(r)
    tuned = _tuned(r, "bf16")
    factor = np.where(tuned, 1.0, r.a("bf16_untuned_vs_aiter"))
    terms = () if tuned.all() else ("bf16_untuned_vs_aiter",)
    notes = np.where(tuned, "aiter_bf16", "aiter_bf16 (untuned shape: AITER falls back to hipBLASLt)")
    return eff * factor, np.zeros(_n(r)), np.zeros(_n(r), bool), terms, "", notes


def _tuned(r: Rows, family: str) -> np.ndarray:
    """True where the calibration's ``family`` table holds the row's (N, K) (AITER tuned the shape)."""
    fit = r.cal.fits.get(family) if r.cal is not None else None
    if fit is None:
        return np.zeros(_n(r), bool)
    have = _tuned_shapes(fit)
    return np.array([(int(n), int(k)) in have for n, k in zip(r.f("n"), r.f("k"))], dtype=bool)


def _tuned_shapes(fit) -> frozenset:
    """The (N, K) pairs of a fit's measured points (read once per fit)."""
    key = ("tuned", id(fit))
    if key not in _FIT_MEMO:
        _PINNED.setdefault(id(fit), fit)   # keep the fit alive while its id keys the memo
        _FIT_MEMO[key] = frozenset(zip(fit.points["n"].astype(int), fit.points["k"].astype(int)))
    return _FIT_MEMO[key]


@_source("bf16_untuned")
def _bf16_untuned(r: Rows) -> Result:
    eff = _gemm_eff(r, "bf16")
    if eff is None:
        return _generic_gemm(r)
    return eff * r.a("bf16_untuned_vs_aiter"), np.zeros(_n(r)), np.zeros(_n(r), bool), ("bf16_untuned_vs_aiter",), ""


@_source("bf16x3")
def _bf16x3(r: Rows) -> Result:
    """The fp32 router weight as three bf16 GEMMs (+ a reduction): 3 x the bf16 GEMM time of the shape."""
    m, n, k = r.f("m"), r.f("n"), r.f("k")
    eff = _gemm_eff(r, "bf16")
    if eff is None:
        return _generic_gemm(r)
    c = gemm_cost(m, n, k, "bf16", "bf16")
    bf16_bound = bound_times_us(c.flops, c.bytes, 0.0, r.hw.peak_flops["bf16"], r.hw.hbm_bw, r.hw.link_bw)[3]
    own = gemm_cost(m, n, k, "fp32", "fp32", out_dtype="fp32")
    own_bound = bound_times_us(own.flops, own.bytes, 0.0, r.hw.peak_flops["fp32"], r.hw.hbm_bw, r.hw.link_bw)[3]
    t = 3.0 * bf16_bound / eff
    return own_bound / np.maximum(t, 1e-9), np.zeros(_n(r)), np.zeros(_n(r), bool), (), ""


def _dot_scaled(r: Rows, assumption: str) -> Result:
    eff = _gemm_eff(r, "fp8")
    if eff is None:
        return _generic_gemm(r)
    return eff * r.a(assumption), np.zeros(_n(r)), np.zeros(_n(r), bool), (assumption,), ""


SOURCES["dot_scaled_decode"] = lambda r: _dot_scaled(r, "dot_scaled_decode_vs_aiter_fp8")
SOURCES["dot_scaled_prefill"] = lambda r: _dot_scaled(r, "dot_scaled_prefill_vs_aiter_fp8")


@_source("generic_gemm")
def _generic_gemm_source(r: Rows) -> Result:
    """No decision: the calibration's table of the row's own weight dtype, else the generic assumption."""
    w = r("w_dtype", "bf16").astype(str)
    eff = np.full(_n(r), r.a("generic_gemm_eff"))
    measured = np.zeros(_n(r), bool)
    for wd in np.unique(w):
        sel = w == wd
        sub = Rows(r.cols, r.idx[sel], r.hw, r.cal, r.ov)
        e = _gemm_eff(sub, wd)
        if e is not None:
            eff[sel], measured[sel] = e, True
    floor = np.where(measured, _cal_floor(r, "gemm"), r.a("gemm_floor_us"))
    return eff, floor, np.zeros(_n(r), bool), () if measured.all() else ("generic_gemm_eff",), \
        "" if measured.all() else "gemm_floor_us"


def _cal_floor(r: Rows, kind: str) -> float:
    floors = getattr(r.cal, "floors_us", {}) if r.cal is not None else {}
    return float(floors.get(kind, value("gemm_floor_us", r.ov)))


def _moe_regime(r: Rows):
    routed, active = r.f("routed_tokens"), np.maximum(r.f("experts_active"), 1.0)
    m_eq, side = dense_equivalent(routed, active, 3.0 * r.f("inter"), r.f("hidden"))
    return m_eq, side, routed / active


@_source("aiter_moe")
def _aiter_moe(r: Rows) -> Result:
    m_eq, side, _ = _moe_regime(r)
    fit = r.cal.fits.get("fp8_grouped") if r.cal is not None else None
    if fit is None:
        return _generic_moe(r)
    eff = _fit_efficiency(fit, m_eq, side, side) * r.a("aiter_moe_untuned")
    note = "aiter_moe (untuned shape: AITER's default config, costed at its tuned MiniMax-M2.5 regime)"
    return eff, np.full(_n(r), _cal_floor(r, "grouped_gemm")), np.zeros(_n(r), bool), ("aiter_moe_untuned",), "", \
        np.full(_n(r), note, dtype=object)


@_source("generic_moe")
def _generic_moe(r: Rows) -> Result:
    """No decision: a fused-MoE table of the row's own dtype family where the calibration has one."""
    m_eq, side, _ = _moe_regime(r)
    w = str(r("w_dtype", "bf16")[0]) if _n(r) else "bf16"
    fit = r.cal.fits.get(f"{w}_grouped") if r.cal is not None else None
    if fit is not None:
        return _fit_efficiency(fit, m_eq, side, side), np.full(_n(r), _cal_floor(r, "grouped_gemm")), \
            np.zeros(_n(r), bool), (), ""
    return _const(r, r.a("generic_gemm_eff"), r.a("gemm_floor_us"), ("generic_gemm_eff",), "gemm_floor_us")


@_source("triton_moe")
def _triton_moe(r: Rows) -> Result:
    _, _, rpe = _moe_regime(r)
    carry, terms = r.carry()
    eff = peers.efficiency("fused_moe", rpe=rpe) * carry
    mx = np.isin(r("w_dtype", "bf16").astype(str), ["mxfp8", "mxfp4"])
    if mx.any():
        eff = eff * np.where(mx, r.a("mxfp8_moe_vs_bf16_fused_moe"), 1.0)
        terms += ("mxfp8_moe_vs_bf16_fused_moe",)
    return eff, np.zeros(_n(r)), np.zeros(_n(r), bool), terms, ""


def _attention_peer(r: Rows, decode_family: str, prefill_family: str, extra: str = "") -> Result:
    reqs = np.maximum(r.f("requests"), 1.0)
    q, ctx = r.f("q_tokens"), r.f("ctx_tokens")
    prefill = _is_prefill(r)
    rows_per = q / reqs
    eff = np.empty(_n(r))
    if (~prefill).any():
        eff[~prefill] = peers.efficiency(decode_family, reqs[~prefill], ctx[~prefill] / reqs[~prefill],
                                         rows_per[~prefill])
    if prefill.any():
        eff[prefill] = peers.efficiency(prefill_family, reqs[prefill], ctx[prefill] / reqs[prefill], 1024.0)
    carry, terms = r.carry()
    eff = eff * carry
    if extra:
        eff, terms = eff * r.a(extra), terms + (extra,)
    return eff, np.zeros(_n(r)), np.zeros(_n(r), bool), terms, ""


def _is_prefill(r: Rows) -> np.ndarray:
    """The rows of the prefill phase (the OpTable's ``phase``: the attention-side rows of a Dispatch carry it)."""
    return np.array([p == "prefill" for p in r("phase", None)], dtype=bool)


SOURCES["sparse_attention"] = lambda r: _attention_peer(r, "sparse_decode", "sparse_prefill")
SOURCES["aiter_pa"] = lambda r: _attention_peer(r, "sparse_decode", "sparse_prefill", "aiter_pa_vs_triton")
SOURCES["dense_attention"] = lambda r: _attention_peer(r, "dense_decode", "sparse_prefill")
SOURCES["indexer"] = lambda r: _attention_peer(r, "indexer_decode", "indexer_prefill")
SOURCES["msa_indexer"] = lambda r: _attention_peer(r, "indexer_decode", "indexer_prefill", "msa_vs_triton_indexer")


@_source("monokernel")
def _monokernel(r: Rows) -> Result:
    """The FlyDSL persistent FFN kernel (``--monokernel``): the replaced rows' bytes and wire bytes in one launch."""
    return _const(r, r.a("monokernel_eff"), 0.0, ("monokernel_eff",))


@_source("generic_attention")
def _generic_attention(r: Rows) -> Result:
    return _const(r, r.a("generic_attention_eff"), r.a("gemm_floor_us"), ("generic_attention_eff",), "gemm_floor_us")


@_source("elementwise")
def _elementwise(r: Rows) -> Result:
    return _const(r, r.a("elementwise_eff"), r.a("kernel_floor_us"), ("elementwise_eff",), "kernel_floor_us")


@_source("fused")
def _fused(r: Rows) -> Result:
    return _const(r, r.a("elementwise_eff"), 0.0, ("elementwise_eff",))


@_source("small_kernel")
def _small(r: Rows) -> Result:
    return _const(r, r.a("small_kernel_eff"), r.a("kernel_floor_us"), ("small_kernel_eff",), "kernel_floor_us")


@_source("inside")
def _inside(r: Rows) -> Result:
    return np.ones(_n(r)), np.zeros(_n(r)), np.ones(_n(r), bool), (), ""


@lru_cache(maxsize=32)
def _measured_groups(hw_name: str) -> frozenset:
    """Group sizes with measured all-reduces on ``hw_name`` (``traces/bench/collectives.csv``)."""
    t = load_table()
    if t is None:
        return frozenset()
    sel = t[(t["op"] == "allreduce") & t["device"].str.upper().str.contains(hw_name.upper(), regex=False)]
    return frozenset(int(w) for w in sel["world"])


def _allreduce(r: Rows, floor_name: str) -> Result:
    """Wire time over the link at ``link_eff``, at least the named latency; a measured all-reduce of the device
    and group size replaces both (``m3lab.cost.collective_time``)."""
    eff = np.full(_n(r), r.a("link_eff"))
    floor = np.full(_n(r), r.a(floor_name))
    payload, group = r.f("comm_payload"), r.f("comm_group")
    measured = np.zeros(_n(r), bool)
    worlds = _measured_groups(str(getattr(r.hw, "name", r.hw)))
    for i, (p, g) in enumerate(zip(payload, group)):
        us = allreduce_us(p, int(g), r.hw) if int(g) in worlds else None
        if us is not None:   # measured on this device: the time itself (the bound is below it)
            eff[i], floor[i], measured[i] = 1.0, us, True
    if measured.all():
        return eff, floor, np.zeros(_n(r), bool), (), ""
    return eff, floor, np.zeros(_n(r), bool), ("link_eff",), floor_name


SOURCES["rccl"] = lambda r: _allreduce(r, "rccl_allreduce_us")
SOURCES["custom_ar"] = lambda r: _allreduce(r, "custom_allreduce_us")


@_source("collective")
def _collective(r: Rows) -> Result:
    return _const(r, r.a("link_eff"), r.a("collective_floor_us"), ("link_eff",), "collective_floor_us")


def cost_terms(cols, hw, cal, overrides: Mapping[str, float] | None = None) -> dict:
    """Per row of an OpTable (dict of arrays or DataFrame): ``source``, ``efficiency``, ``floor_us``, ``inside``,
    ``eff_terms`` (assumption names its efficiency depends on, "+"-joined) and ``floor_term``."""
    op = np.asarray(cols["op"], dtype=object)
    kind = np.asarray(cols["kind"], dtype=object)
    n = len(op)
    path = np.asarray(cols["path"], dtype=object) if "path" in cols else np.full(n, None, dtype=object)
    kernel = np.asarray(cols["kernel"], dtype=object) if "kernel" in cols else np.full(n, None, dtype=object)
    src = np.array([source_of(o, k, p, kn) for o, k, p, kn in zip(op, kind, path, kernel)], dtype=object)
    eff, floor = np.ones(n), np.zeros(n)
    inside = np.zeros(n, bool)
    eff_terms, floor_term = np.full(n, "", dtype=object), np.full(n, "", dtype=object)
    for name in np.unique(src):
        idx = np.flatnonzero(src == name)
        if name == NO_ROWS:
            raise M3LabError(f"OpTable row {op[idx[0]]!r} has path {path[idx[0]]!r}, a decision with no rows",
                             field="path", hint="the OpTable builder and m3lab.cost.sources disagree")
        e, f, ins, et, ft, *labels = SOURCES[name](Rows(cols, idx, hw, cal, overrides))
        eff[idx], floor[idx], inside[idx] = e, f, ins
        eff_terms[idx], floor_term[idx] = "+".join(et), ft
        if labels:
            src[idx] = labels[0]
    # an efficiency above 1 is a path faster than the row's own roofline (bf16x3: the fp32 router in bf16 terms)
    return {"source": src, "efficiency": np.maximum(eff, 1e-12), "floor_us": floor, "inside": inside,
            "eff_terms": eff_terms, "floor_term": floor_term}
