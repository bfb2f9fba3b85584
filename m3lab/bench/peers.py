"""Every peer at its best, in one run, in repeated rounds (``traces/bench/peers.csv``; GPU only).

Rows are the long table of :mod:`m3lab.bench.table` with ``config`` (the provider's launch configuration),
``round`` (1..R) and ``clock`` (SM clock range, peak power / limit and ``power-cap`` when the driver lowered
the clocks: :mod:`m3lab.bench.clocks`). Every point is timed by :func:`m3lab.bench.timing.graph_time` (>= 24
calls per graph for every provider, operands rotated past the L2). Round 1 times every configuration of
every peer; later rounds repeat ours and the peer's two fastest configurations of round 1, interleaved
point by point, so the spread across rounds shows how steady each ratio is. The targets
(:func:`m3lab.bench_analysis.peers.peer_targets`) read these rows only.

Peers:

- **MoE** (``op moe``, balanced routing, bf16): ``m3lab`` (our tuned table) against vLLM's Triton
  ``fused_moe_kernel`` (``vllm-triton``, :func:`m3lab.gates.moe.vllm_fused_moe`) under each configuration
  vLLM could run: its default (``get_default_config``), every H200 table vLLM ships for the nearest expert
  count (``E=128``, all N; nearest M as vLLM looks it up) and our table's entries (which vLLM's own lookup
  returns when pointed at ``kernels/moe/configs``). Identical configurations are timed once, labelled
  with every source.
- **Sparse attention / indexer** (``sparse_attn``, ``sparse_indexer``): ours against vLLM's decode kernels
  launched as vLLM launches them; both with programmatic dependent launch where vLLM's
  ``current_platform.is_arch_support_pdl()`` (ours: ``kernels/pdl.py``) says so: the ``config`` column.
- **GEMM** (``gemm``): ours (``triton``, the launcher's tables) against cuBLAS (``cublas``,
  ``F.linear`` bf16) and ``torch._scaled_mm`` (``scaled-mm``: e4m3 x with per-token scales, e4m3 W with
  per-channel scales, bf16 out; x quantised outside the timed call) as they are; MX decode also through the
  decode layout (``triton-mx-layout``) against triton_kernels' ``matmul_ogs`` (``ogs``, every variant of
  :mod:`m3lab.bench.ogs_peer`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.moe import tables
from ..kernels.pdl import pdl_enabled
from ..vllm_src.imports import vllm_module
from .ceilings import Ceilings
from .clocks import ClockWatch
from .table import BenchRow, commit_id, today
from .timing import HARNESS, Timing, graph_time

ROUNDS = 3
REPEAT_BEST = 2                   # peer configurations repeated after round 1
REP_MS = 20.0
MOE_TS = (1, 32, 128, 512, 2048, 8192)
SPARSE_POINTS = tuple((b, ctx) for ctx in (8192, 65536) for b in (1, 32, 128))
GEMM_MS = {"bf16": (1, 8, 32, 64, 128, 2048, 4096), "fp8": (1, 32, 128, 2048, 4096),    # the targets' points and
           "mxfp8": (1, 8, 32, 128, 2048), "mxfp4": (1, 8, 32, 128, 2048)}              # the perf baseline's
OGS_MS = (1, 8, 32)


@dataclass
class Timed:
    """One provider configuration's timing at a point: what the row needs besides the shape."""
    provider: str
    config: str
    timing: Timing
    clock: str


def timed(provider: str, config: str, calls: list, rep_ms: float = REP_MS) -> Timed:
    with ClockWatch() as watch:
        t = graph_time(calls, rep_ms=rep_ms, warmup_ms=5)
    return Timed(provider, config, t, watch.note())


def make_row(op: str, shape: str, dtype: str, t: Timed, rnd: int, flops: float, nbytes: float,
             ceilings: Ceilings, device: str, mnk=(None, None, None)) -> BenchRow:
    ceiling, value, floor_us = ceilings.limit(flops, nbytes)
    us = t.timing.us_p50
    m, n, k = mnk
    return BenchRow(op, t.provider, shape, dtype, t.timing.us_p20, us, t.timing.us_p80, flops / us / 1e6,
                    nbytes / us / 1e6, floor_us / us, ceiling, device, commit_id(), today(), m=m, n=n, k=k,
                    ceiling_value=value, harness=HARNESS, config=t.config, round=rnd, clock=t.clock)


def keep_best(results: list[Timed], ours: set[str], n: int = REPEAT_BEST) -> list[tuple[str, str]]:
    """(provider, config) pairs repeated after round 1: every one of ours, each peer's ``n`` fastest configs."""
    keep = [(r.provider, r.config) for r in results if r.provider in ours]
    for prov in dict.fromkeys(r.provider for r in results if r.provider not in ours):
        best = sorted((r for r in results if r.provider == prov), key=lambda r: r.timing.us_p50)[:n]
        keep += [(r.provider, r.config) for r in best]
    return keep


# --- MoE ------------------------------------------------------------------------------------------------------
def vllm_moe_configs(t: int, experts: int, n: int, hidden: int, topk: int, ours_path=None, shipped_dir=None,
                     shipped_experts: int | None = None) -> dict[str, dict]:
    """{label: vLLM config} for vLLM's kernel at T tokens: ``default``, ``table=<shipped H200 file stem>`` for
    every shipped H200 table of ``shipped_experts`` experts (default ``experts - 1``: vLLM ships none for a fused
    shared expert's extra row, so the routed count's tables are the nearest), ``table=m3lab`` (our table's vLLM
    keys); identical configs merged, labels joined by ``|``."""
    from pathlib import Path

    fm = vllm_module("vllm.model_executor.layers.fused_moe.fused_moe", "vLLM's fused_moe configs")
    found = {"default": dict(fm.get_default_config(t, experts, n, hidden, topk, None, None))}
    shipped = Path(shipped_dir or Path(fm.__file__).parent / "configs")
    for path in sorted(shipped.glob(f"E={shipped_experts or experts - 1},N=*,device_name=NVIDIA_H200.json")):
        found[f"table={path.stem.split(',device_name')[0]}"] = dict(tables.nearest(tables.read_vllm_table(path), t))
    ours = tables.nearest(tables.load_table(Path(ours_path or tables.CONFIG_DIR / tables.file_name(
        experts, n, "NVIDIA_H200"))), t)
    if ours is not None:
        found["table=m3lab"] = {k: getattr(ours, k) for k in tables.VLLM_KEYS}
    merged: dict[tuple, list[str]] = {}
    for label, cfg in found.items():
        merged.setdefault(tuple(sorted(cfg.items())), []).append(label)
    return {"|".join(labels): dict(key) for key, labels in merged.items()}


def moe_point(t: int, rnd: int, keep, ceilings: Ceilings, device: str, log) -> tuple[list[BenchRow], list[Timed]]:
    from ..gates.moe import vllm_fused_moe  # local: pulls in triton
    from . import moe as bm  # local: pulls in triton
    ops = bm.operands(t, "balanced", ["bf16"], torch.device("cuda"))
    cases = [("m3lab", "table=m3lab", bm.provider_calls("m3lab", ops))]
    for label, cfg in vllm_moe_configs(t, bm.EXPERTS, bm.I, bm.H, bm.TOPK + 1, shipped_experts=bm.ROUTED).items():
        fn = (lambda cfg: lambda x, w, wts, ids: vllm_fused_moe(x, w["w13"], w["w2"], wts, ids, **bm.act(),
                                                                   config=cfg))(cfg)
        cases.append(("vllm-triton", label, [lambda c=c, fn=fn: fn(ops.xs[c], ops.w("bf16", c), *ops.routes[c])
                                             for c in range(bm.CALLS)]))
    out = []
    for prov, label, calls in cases:
        if keep is not None and (prov, label) not in keep:
            continue
        try:
            out.append(timed(prov, label, calls, rep_ms=max(REP_MS, 4e-3 * t)))
        except Exception as err:   # one configuration failing must not lose the point
            log(f"moe T={t} {prov} {label} failed: {type(err).__name__}: {str(err)[:200]}")
    nbytes = bm.expert_bytes("bf16") * sum(ops.touched) / len(ops.touched)
    shape = f"T={t},H={bm.H},I={bm.I},E={bm.EXPERTS},k={bm.TOPK + 1},routing=balanced"
    rows = [make_row("moe", shape, "bf16", r, rnd, bm.moe_flops(t), nbytes, ceilings, device) for r in out]
    log(f"moe T={t} round {rnd}: " + " ".join(f"{r.provider}[{r.config}]:{r.timing.us_p50:.1f}" for r in out))
    return rows, out


# --- sparse attention and indexer ------------------------------------------------------------------------------
def sparse_point(b: int, ctx: int, rnd: int, ceilings: Ceilings, device: str, log) -> list[BenchRow]:
    from . import sparse_attn as sa  # local: pulls in triton
    mods = sa.vllm_modules()
    try:
        vcfg = "pdl" if vllm_module("vllm.platforms").current_platform.is_arch_support_pdl() else "no-pdl"
    except Exception as err:      # the label only; vLLM's launcher decides the same way itself
        vcfg = f"pdl unknown ({type(err).__name__})"
    p = sa.make_point(b, ctx, 1, torch.device("cuda"))
    ours = "pdl" if pdl_enabled(torch.device("cuda")) else "no-pdl"
    plan = [("sparse_attn", "ours", ours, sa.attention_calls(p, "ours")),
            ("sparse_attn", "vllm", vcfg, sa.attention_calls(p, "vllm", mods)),
            ("sparse_indexer", "ours", ours, sa.indexer_calls(p, "ours")),
            ("sparse_indexer", "vllm", vcfg, sa.indexer_calls(p, "vllm", mods))]
    shape = f"B={b},ctx={ctx},q=1"
    rows = []
    for op, prov, cfg, calls in plan:
        try:
            r = timed(prov, cfg, calls)
        except Exception as err:
            log(f"{shape} {op} {prov} {cfg} failed: {type(err).__name__}: {str(err)[:200]}")
            continue
        nbytes = sa.selected_kv_bytes(b, ctx, 1) if op == "sparse_attn" else sa.index_key_bytes(b, ctx)
        rows.append(make_row(op, shape, "bf16", r, rnd, 0.0, nbytes, ceilings, device))
    log(f"{shape} round {rnd}: " + " ".join(f"{r.op.removeprefix('sparse_')}/{r.provider}[{r.config}]:{r.us_p50:.1f}"
                                             for r in rows))
    del p
    torch.cuda.empty_cache()
    return rows
