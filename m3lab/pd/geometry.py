"""KV hand-off geometry: the byte ranges a prefill instance sends to a decode instance, per layer.

A :class:`CacheSide` is one instance's KV cache: its TP degree (a :class:`~m3lab.spec.plan.ParallelPlan`), its
main-cache layout (a name in ``m3lab.model.kv_cache.LAYOUTS``; the two sides may differ), the KV dtype (bf16, or
fp8 with scalar or per-(head, token) scales), the index-key cache dtype and its block count.

For one request of ``n`` tokens with block tables ``src_table`` / ``dst_table`` (logical block -> physical block;
the same on every rank of an instance, as in vLLM), every element of every layer's KV that a decode rank needs
is mapped to its byte offset on the prefill rank it reads from (:mod:`m3lab.pd.ranks`) and on the decode rank.
Sorting by source offset and cutting where either side stops being contiguous gives the transfer descriptors
``(layer, region, src_rank, src_block, src_offset, length, dst_rank, dst_block, dst_offset)`` (offsets in bytes
from the start of that rank's per-layer tensor). :func:`coalesce` joins descriptors that continue one another
across blocks (possible only where both block tables are consecutive).

Layers of the same kind have the same pattern, so :func:`request_plan` counts descriptors per block pattern and
never materialises the millions of small descriptors a mixed-layout pair needs; :func:`request_descriptors`
materialises them (for real transfers).

Scalar fp8 scales are per-layer constants present on both sides (``_k_scale``/``_v_scale``) and are not sent;
per-(head, token) scales are sent with their tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from m3lab.errors import M3LabError
from m3lab.pd.ranks import check_tp, heads_of_rank, rank_pairs
from m3lab.pd.regions import CACHE_BYTES, Region, check_layout, index_region, main_region, scale_regions
from m3lab.spec.model import ModelSpec, load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.quant import normalize_cache_dtype

SCALE_MODES = ("none", "scalar", "per_token_head")
DESC_COLUMNS = ("layer", "region", "src_rank", "src_block", "src_offset", "length", "dst_rank", "dst_block",
                "dst_offset")


@dataclass(frozen=True)
class CacheSide:
    """One instance's KV cache (see the module docstring). ``num_blocks`` only matters for per-token scales."""

    plan: ParallelPlan
    layout: str = "triton"
    kv_dtype: str = "bf16"
    index_dtype: str = "bf16"
    scales: str = "none"
    num_blocks: int = 1024

    def __post_init__(self):
        object.__setattr__(self, "kv_dtype", normalize_cache_dtype(self.kv_dtype, "kv_dtype"))
        object.__setattr__(self, "index_dtype", normalize_cache_dtype(self.index_dtype, "index_dtype"))
        check_layout(self.layout)
        if self.scales not in SCALE_MODES:
            raise M3LabError(f"scales {self.scales!r} is not one of {', '.join(SCALE_MODES)}", field="scales")
        if self.scales != "none" and self.kv_dtype != "fp8":
            raise M3LabError(f"KV scales need an fp8 KV cache, not {self.kv_dtype}", field="scales",
                             hint="pass --kv-dtype fp8 or drop the scales")
        if self.scales == "none" and self.kv_dtype == "fp8":
            object.__setattr__(self, "scales", "scalar")

    @property
    def tp(self) -> int:
        return self.plan.tp

    def regions(self, model: ModelSpec, rank: int) -> dict[str, Region]:
        """The per-layer tensors of ``rank`` (main, index, and per-token scales when used)."""
        sp = model.sparse
        heads = heads_of_rank(rank, self.tp, model.heads_kv)
        out = {"main": main_region(self.layout, heads, sp.block_size, model.head_dim, CACHE_BYTES[self.kv_dtype]),
               "index": index_region(sp.block_size, sp.index_dim, CACHE_BYTES[self.index_dtype])}
        if self.scales == "per_token_head":
            out["k_scale"], out["v_scale"] = scale_regions(heads, sp.block_size, self.num_blocks)
        return out


def _model(model) -> ModelSpec:
    m = load_model(model) if not isinstance(model, ModelSpec) else model
    if m.sparse is None or m.mla is not None or m.linear is not None:
        raise M3LabError(f"the hand-off geometry covers MiniMax M3-style caches; {m.name} has none", field="model",
                         hint="use minimax-m3 or minimax-m3-mini")
    return m


def layer_regions(model: ModelSpec, side: CacheSide) -> dict[int, tuple[str, ...]]:
    """Per layer, the regions a decode rank needs: main K/V on every layer, index keys on the layers that write
    them (every sparse layer; only the top-k computing ones under index sharing), per-token scales when used."""
    idx = set(model.topk_layers)
    scales = ("k_scale", "v_scale") if side.scales == "per_token_head" else ()
    return {i: ("main",) + (("index",) if i in idx else ()) + scales for i in model.kv_layers}


def check_pair(model: ModelSpec, prefill: CacheSide, decode: CacheSide) -> None:
    check_tp(prefill.tp, model.heads_kv, "prefill_tp")
    check_tp(decode.tp, model.heads_kv, "decode_tp")
    for what in ("kv_dtype", "index_dtype", "scales"):
        if getattr(prefill, what) != getattr(decode, what):
            raise M3LabError(f"prefill {what} {getattr(prefill, what)!r} differs from decode "
                             f"{getattr(decode, what)!r}: a hand-off copies bytes", field=what,
                             hint="use the same cache dtype on both sides")


@lru_cache(maxsize=256)
def _pattern(src: Region, dst: Region, heads: tuple[int, ...], tokens: int) -> tuple[np.ndarray, ...]:
    """Runs of one block pair: (src_start, dst_start, length) in elements relative to the block bases."""
    s = np.concatenate([src.inner[:, src.slot(h), :tokens, :].ravel() for h in heads])
    d = np.concatenate([dst.inner[:, dst.slot(h), :tokens, :].ravel() for h in heads])
    order = np.argsort(s, kind="stable")
    s, d = s[order], d[order]
    cut = np.flatnonzero((np.diff(s) != 1) | (np.diff(d) != 1)) + 1
    starts = np.concatenate([[0], cut])
    lengths = np.diff(np.concatenate([starts, [s.size]]))
    return s[starts], d[starts], lengths


def _pairs(model: ModelSpec, prefill: CacheSide, decode: CacheSide, region: str):
    """(src_rank, dst_rank, heads) for a region: the replicated index is read once per decode rank."""
    pairs = rank_pairs(prefill.tp, decode.tp, model.heads_kv)
    if region != "index":
        return pairs
    first: dict[int, int] = {}
    for s, d, _ in pairs:
        first.setdefault(d, s)
    return [(s, d, (0,)) for d, s in sorted(first.items())]


def _block_tokens(n: int, block: int) -> list[int]:
    full, tail = divmod(n, block)
    return [block] * full + ([tail] if tail else [])


def _region_rows(m: ModelSpec, prefill: CacheSide, decode: CacheSide, region: str, toks: list[int],
                 src_table, dst_table) -> np.ndarray:
    """Descriptors of one region for one layer (every layer holding it has the same ones): int64
    [n, 8] = src_rank, src_block, src_offset, length, dst_rank, dst_block, dst_offset (bytes)."""
    rows = []
    for s_rank, d_rank, heads in _pairs(m, prefill, decode, region):
        src, dst = prefill.regions(m, s_rank)[region], decode.regions(m, d_rank)[region]
        for L, nt in enumerate(toks):
            ss, dd, ln = _pattern(src, dst, heads, nt)
            sb, db, k = int(src_table[L]), int(dst_table[L]), len(ln)
            rows.append(np.column_stack([np.full(k, s_rank), np.full(k, sb), (sb * src.block_stride + ss) * src.esize,
                                         ln * src.esize, np.full(k, d_rank), np.full(k, db),
                                         (db * dst.block_stride + dd) * dst.esize]))
    return np.concatenate(rows) if rows else np.zeros((0, 7), np.int64)


def request_descriptors(model, prefill: CacheSide, decode: CacheSide, n_tokens: int, src_table, dst_table,
                        layers=None) -> pd.DataFrame:
    """All descriptors (:data:`DESC_COLUMNS`, bytes) of one request of ``n_tokens``; ``layers``: a subset."""
    m = _model(model)
    check_pair(m, prefill, decode)
    toks = _block_tokens(n_tokens, m.sparse.block_size)
    if len(src_table) < len(toks) or len(dst_table) < len(toks):
        raise M3LabError(f"{n_tokens} tokens need {len(toks)} blocks; the block tables have {len(src_table)} "
                         f"(prefill) and {len(dst_table)} (decode)", field="block_table")
    need = layer_regions(m, decode)
    frames = []
    for region in sorted({r for rs in need.values() for r in rs}):
        rows = _region_rows(m, prefill, decode, region, toks, src_table, dst_table)
        for i in need:
            if region in need[i] and (layers is None or i in layers) and len(rows):
                frames.append(pd.DataFrame({"layer": i, "region": region, "src_rank": rows[:, 0],
                                            "src_block": rows[:, 1], "src_offset": rows[:, 2],
                                            "length": rows[:, 3], "dst_rank": rows[:, 4],
                                            "dst_block": rows[:, 5], "dst_offset": rows[:, 6]}))
    if not frames:
        return pd.DataFrame(columns=list(DESC_COLUMNS))
    df = pd.concat(frames, ignore_index=True)[list(DESC_COLUMNS)]
    return df.sort_values(["layer", "region", "dst_rank", "src_offset"]).reset_index(drop=True)


def coalesce(desc: pd.DataFrame) -> pd.DataFrame:
    """Join descriptors that continue one another on both sides (same layer, region and rank pair)."""
    if desc.empty:
        return desc.copy()
    d = desc.sort_values(["layer", "region", "src_rank", "dst_rank", "src_offset"]).reset_index(drop=True)
    same = ((d["layer"].values[1:] == d["layer"].values[:-1]) & (d["region"].values[1:] == d["region"].values[:-1])
            & (d["src_rank"].values[1:] == d["src_rank"].values[:-1])
            & (d["dst_rank"].values[1:] == d["dst_rank"].values[:-1]))
    cont = (same & (d["src_offset"].values[:-1] + d["length"].values[:-1] == d["src_offset"].values[1:])
            & (d["dst_offset"].values[:-1] + d["length"].values[:-1] == d["dst_offset"].values[1:]))
    group = np.concatenate([[0], np.cumsum(~cont)])
    agg = d.groupby(group, sort=False).agg(**{c: (c, "first") for c in DESC_COLUMNS if c != "length"},
                                           length=("length", "sum"))
    return agg[list(DESC_COLUMNS)].reset_index(drop=True)


TABLES = ("scattered", "contiguous")


def _count(src: Region, dst: Region, heads: tuple[int, ...], toks: list[int], tables: str) -> tuple[int, int]:
    """(descriptors, bytes) of one region of one layer for one rank pair, without materialising them."""
    n_desc = n_bytes = 0
    merge = 0
    prev_end = False
    for nt in toks:
        ss, dd, ln = _pattern(src, dst, heads, nt)
        n_desc += len(ln)
        n_bytes += int(ln.sum()) * src.esize
        starts_at_zero = len(ln) and ss[0] == 0 and dd[0] == 0
        if tables == "contiguous" and prev_end and starts_at_zero:
            merge += 1
        prev_end = bool(len(ln)) and ss[-1] + ln[-1] == src.block_stride and dd[-1] + ln[-1] == dst.block_stride
    return n_desc - merge, n_bytes


def request_plan(model, prefill: CacheSide, decode: CacheSide, isl: int, tables: str = "scattered") -> pd.DataFrame:
    """One row per (layer, region, src_rank, dst_rank): ``descriptors`` and ``bytes`` of one request of ``isl``
    tokens. ``tables``: "scattered" (no two logical blocks in adjacent physical blocks: one descriptor run per
    block at best, as a serving engine's free-block queue leaves it) or "contiguous" (both block tables
    consecutive, so runs that end a block continue into the next)."""
    m = _model(model)
    check_pair(m, prefill, decode)
    if not isinstance(isl, int) or isl < 1:
        raise M3LabError(f"isl={isl!r} must be a positive token count", field="isl")
    if tables not in TABLES:
        raise M3LabError(f"tables {tables!r} is not one of {', '.join(TABLES)}", field="tables")
    toks = _block_tokens(isl, m.sparse.block_size)
    need = layer_regions(m, decode)
    per_region = {}
    for region in sorted({r for rs in need.values() for r in rs}):
        per_region[region] = [
            (s, d, *_count(prefill.regions(m, s)[region], decode.regions(m, d)[region], heads, toks, tables))
            for s, d, heads in _pairs(m, prefill, decode, region)]
    rows = []
    for i, regions in need.items():
        kind = m.attn_types[i]
        for region in regions:
            for s, d, n_desc, n_bytes in per_region[region]:
                rows.append({"layer": i, "attn": kind, "region": region, "src_rank": s, "dst_rank": d,
                             "descriptors": n_desc, "bytes": n_bytes})
    return pd.DataFrame(rows)


def per_layer(plan: pd.DataFrame) -> pd.DataFrame:
    """:func:`request_plan` summed over rank pairs: ``[layer, attn, region, descriptors, bytes]``."""
    return plan.groupby(["layer", "attn", "region"], as_index=False, sort=True)[["descriptors", "bytes"]].sum()


def handoff_summary(plan: pd.DataFrame, isl: int, bandwidth: float | None = None) -> dict:
    """Totals of a :func:`request_plan`: ``bytes_per_request``, ``descriptors_per_request``, the busiest prefill
    rank's send and decode rank's receive bytes, mean descriptor size and, at ``bandwidth`` (B/s per GPU, each
    rank on its own link), ``transfer_s`` = busiest rank's bytes / bandwidth (descriptor overheads excluded)."""
    sent = plan.groupby("src_rank")["bytes"].sum()
    recv = plan.groupby("dst_rank")["bytes"].sum()
    total, n = int(plan["bytes"].sum()), int(plan["descriptors"].sum())
    out = {"isl": isl, "bytes_per_request": total, "bytes_per_token": total / isl,
           "descriptors_per_request": n, "mean_descriptor_bytes": total / max(n, 1),
           "max_bytes_sent_per_prefill_rank": int(sent.max()), "max_bytes_received_per_decode_rank": int(recv.max()),
           "prefill_ranks_sending": int((sent > 0).sum()), "decode_ranks_receiving": int((recv > 0).sum())}
    if bandwidth:
        if bandwidth <= 0:
            raise M3LabError(f"bandwidth {bandwidth} must be positive (B/s per GPU)", field="bandwidth")
        out["bandwidth_bytes_per_s"] = bandwidth
        out["transfer_s"] = max(out["max_bytes_sent_per_prefill_rank"], out["max_bytes_received_per_decode_rank"]) \
            / bandwidth
    return out


DESCRIPTOR_RATE = 10e6   # descriptors a link can issue per second: assumed (an RDMA NIC's message rate, order of)


def descriptor_warning(summary: dict) -> str | None:
    """A warning when issuing a request's descriptors would take longer than moving its bytes: ``transfer_s``
    (bytes / bandwidth) then understates the hand-off, e.g. 534,802,944 descriptors of 4 B between the Triton
    and AITER layouts. None when the descriptors are few and large enough."""
    n, seconds = summary["descriptors_per_request"], summary.get("transfer_s")
    issue_s = n / DESCRIPTOR_RATE
    if seconds is None or issue_s <= seconds:
        return None
    return (f"{n:,} descriptors per request (mean {summary['mean_descriptor_bytes']:,.0f} B): at an assumed "
            f"{DESCRIPTOR_RATE:,.0f} descriptors/s issuing them takes {issue_s:,.3g} s, more than the "
            f"{seconds * 1e3:,.3g} ms the bytes take; the hand-off is descriptor-bound (same KV layout on both "
            f"sides, or a layout conversion before the transfer, keeps descriptors large)")


def pd_plan(model, prefill_tp: int, decode_tp: int, isl: int, *, kv_dtype: str = "bf16", index_dtype: str = "bf16",
            prefill_layout: str = "triton", decode_layout: str = "triton", scales: str = "none",
            tables: str = "scattered", bandwidth: float | None = None) -> tuple[dict, pd.DataFrame]:
    """What ``m3lab pd-plan`` prints: (summary, per-layer table) for one request of ``isl`` tokens."""
    m = _model(model)
    pre = CacheSide(ParallelPlan(tp=prefill_tp, role="prefill"), prefill_layout, kv_dtype, index_dtype, scales)
    dec = CacheSide(ParallelPlan(tp=decode_tp, role="decode"), decode_layout, kv_dtype, index_dtype, scales)
    plan = request_plan(m, pre, dec, isl, tables)
    summary = {"model": m.name, "prefill_tp": prefill_tp, "decode_tp": decode_tp, "prefill_layout": prefill_layout,
               "decode_layout": decode_layout, "kv_dtype": pre.kv_dtype, "index_dtype": pre.index_dtype,
               "scales": pre.scales, "tables": tables, **handoff_summary(plan, isl, bandwidth),
               "label": "projected (exact byte geometry; time = bytes / link bandwidth)"}
    summary["warning"] = descriptor_warning(summary)
    return summary, per_layer(plan)


def layout_pairs(model, prefill_tp: int, decode_tp: int, isl: int, pairs=(("triton", "triton"), ("aiter", "aiter"),
                                                                          ("triton", "aiter")),
                 kv_dtype: str = "bf16", tables: str = "scattered") -> pd.DataFrame:
    """Per-layer descriptors and bytes for several (prefill layout, decode layout) pairs: :func:`per_layer` rows
    plus ``pair`` and ``mean_descriptor_bytes``."""
    frames = []
    for pl, dl in pairs:
        _, t = pd_plan(model, prefill_tp, decode_tp, isl, kv_dtype=kv_dtype, prefill_layout=pl, decode_layout=dl,
                       tables=tables)
        frames.append(t.assign(pair=f"{pl} -> {dl}", mean_descriptor_bytes=t["bytes"] / t["descriptors"]))
    return pd.concat(frames, ignore_index=True)


def bytes_vs_isl(model, isls, tp_pairs=((4, 4), (2, 4), (4, 8)), kv_dtypes=("bf16", "fp8"),
                 bandwidth: float = 50e9) -> pd.DataFrame:
    """Bytes per request and transfer time against input length: one row per (isl, TP pair, KV dtype)."""
    rows = []
    for isl in isls:
        for p, d in tp_pairs:
            for kv in kv_dtypes:
                s, _ = pd_plan(model, p, d, int(isl), kv_dtype=kv, bandwidth=bandwidth)
                rows.append({"isl": int(isl), "tp": f"TP{p} -> TP{d}", "kv_dtype": kv,
                             "bytes_per_request": s["bytes_per_request"], "transfer_ms": s["transfer_s"] * 1e3,
                             "descriptors_per_request": s["descriptors_per_request"]})
    return pd.DataFrame(rows)
