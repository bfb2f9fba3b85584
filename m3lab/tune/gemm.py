"""Tune the GEMM launcher: time candidate configs at the model's shapes, write the tables.

For each (N, K, weight format) and each tuned M, every candidate of the M's regime is checked once
against ``linear_ref`` (a wrong or non-compiling config is dropped) and timed graph-replayed with
rotated weights (m3lab.bench.timing); the fastest goes into
``kernels/gemm/configs/N=..,K=..,w=..,device=...json``. A time budget bounds the run: points not
reached keep the heuristic fallback.
"""
import math
import time
from pathlib import Path

import pandas as pd
import torch

from ..kernels.gemm import launcher
from ..kernels.gemm.tables import CONFIG_DIR, GemmConfig, device_name, heuristic_config, table_path, write_table
from ..kernels.gemm.reference import linear_ref

DECODE_MS = (1, 32, 64, 128)
PREFILL_MS = (256, 512, 1024, 2048, 4096, 8192)
# decode: swapped split-K tiles (BLOCK_N, BLOCK_K, num_stages, num_warps); SPLIT_K fill and 2x fill.
# H200 2026-11-29 (first tuning run): 64x128 with 5 stages won most decode points, 128x128 some
# M=64-128 MX points; 32x256, 64x512 and 128x256 never won and were dropped.
DECODE_TILES = ((32, 128, 6, 4), (64, 128, 5, 4), (64, 256, 3, 4), (128, 128, 4, 4))
# prefill: tiled (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), GROUP_M 8
PREFILL_TILES = ((128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4), (128, 128, 128, 8, 3))


def _block_m(m: int) -> int:
    return max(16, min(64, 1 << max(0, math.ceil(math.log2(m)))))


def candidates(m: int, n: int, k: int, sms: int = 132) -> list[GemmConfig]:
    """Candidate configs of M's regime (decode for M <= 128)."""
    if m > DECODE_MS[-1]:
        return [GemmConfig("tiled", bm, bn, bk, 8, 1, nw, ns) for bm, bn, bk, nw, ns in PREFILL_TILES]
    bm = _block_m(m)
    out = []
    for bn, bk, ns, nw in DECODE_TILES:
        tiles = math.ceil(n / bn) * math.ceil(m / bm)
        fill = max(1, min(math.ceil(2 * sms / tiles), k // bk))
        for split in sorted({1 << int(math.log2(fill)), min(k // bk, 2 << int(math.log2(fill)))}):
            out.append(GemmConfig("splitk", bm, bn, bk, 1, max(1, split), nw, ns))
    out.append(GemmConfig("tiled", bm, 64, 128, 1, 1, 4, 4))
    return list(dict.fromkeys(out))


def tune_point(m: int, n: int, k: int, w_format: str, cands: list[GemmConfig], checked: dict,
               rep_ms: float = 15.0, device: torch.device | None = None, timer=None) -> list[dict]:
    """Time every candidate at one point -> rows {config, us, error}.

    ``timer(calls) -> Timing`` defaults to graph replay on the GPU (tests pass a CPU timer).
    """
    from ..bench.gemm import make_operands
    from ..bench.timing import graph_time
    from ..gates.checks import TOLERANCES, rel_rms
    device = device or torch.device("cuda")
    timer = timer or (lambda calls: graph_time(calls, rep_ms=rep_ms, warmup_ms=5))
    tol = TOLERANCES["bfloat16" if device.type == "cuda" else "float16"]
    ops = make_operands(m, n, k, w_format, device)
    w, s = ops.ws[0]
    rows = []
    for cfg in cands:
        row = {"M": m, "N": n, "K": k, "w_format": w_format, "config": cfg, "us": math.nan, "error": ""}
        try:
            key = (n, k, w_format, cfg)
            if key not in checked:
                y = launcher.linear(ops.x, w, w_format=w_format, w_scale=s, config=cfg)
                checked[key] = rel_rms(y, linear_ref(ops.x.float(), w, w_format=w_format, w_scale=s))
            if not checked[key] <= tol:
                raise RuntimeError(f"rel_rms {checked[key]:.3g} over tolerance")
            calls = [lambda w=w_, s=s_, y=y_, c=cfg: launcher.linear(ops.x, w, w_format=w_format, w_scale=s,
                                                                      out=y, config=c)
                     for (w_, s_), y_ in zip(ops.ws, ops.ys)]
            row["us"] = timer(calls).us_p50
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {str(err)[:120]}"
        rows.append(row)
    return rows


def tune_gemm(shapes, w_formats=("bf16", "mxfp8", "mxfp4"), ms=DECODE_MS + PREFILL_MS,
              config_dir: Path = CONFIG_DIR, budget_s: float = 240.0, log=print) -> pd.DataFrame:
    """Tune every (shape, format, M) within the budget; write one table per (N, K, format). -> all timings.

    shapes: (N, K) pairs, normally :func:`default_shapes` (the OpTable's distinct GEMMs of M3 at TP4).
    """
    device = torch.device("cuda")
    dev_name = device_name(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    t0, checked, all_rows = time.time(), {}, []
    for w_format in w_formats:
        for n, k in shapes:
            table = {}
            for m in ms:
                if time.time() - t0 > budget_s:
                    log(f"tune: budget {budget_s:.0f}s spent; N={n} K={k} {w_format} M={m} keeps the heuristic")
                    break
                rows = tune_point(m, n, k, w_format, candidates(m, n, k, sms), checked)
                all_rows += rows
                ok = [r for r in rows if not math.isnan(r["us"])]
                if ok:
                    best = min(ok, key=lambda r: r["us"])
                    table[m] = best["config"]
                    log(f"tune N={n} K={k} {w_format} M={m}: {best['us']:.1f}us {best['config'].to_dict()}")
            if table:
                write_table(table_path(n, k, w_format, dev_name, config_dir), table)
    df = pd.DataFrame(all_rows)
    if len(df):
        df["config"] = df["config"].map(lambda c: c.to_dict())
    return df


def model_gemm_shapes(model: str = "minimax-m3", tp: int = 4, quant: str = "bf16") -> tuple[tuple[int, int], ...]:
    """The model's distinct dense GEMM shapes (N, K) per rank, from the OpTable (kind == "gemm")."""
    from ..optable import build_optable
    from ..spec.model import load_model
    from ..spec.plan import ParallelPlan
    from ..spec.quant import load_quant
    from ..workload.step import EngineStep
    spec = load_model(model)
    df = build_optable(spec, ParallelPlan(tp=tp).validate(spec), load_quant(quant), EngineStep.decode(1, 1))
    nk = df[df["kind"] == "gemm"][["n", "k"]].drop_duplicates().astype(int)
    return tuple(sorted((int(n), int(k)) for n, k in nk.itertuples(index=False)))


def default_shapes() -> tuple[tuple[int, int], ...]:
    """MiniMax M3 at TP4 from the OpTable; the hard-coded m3lab.bench.gemm.M3_TP4_SHAPES if it cannot be built."""
    try:
        return model_gemm_shapes()
    except Exception:   # the OpTable is optional for tuning: the five shapes are known
        from ..bench.gemm import M3_TP4_SHAPES
        return M3_TP4_SHAPES


__all__ = ["candidates", "default_shapes", "heuristic_config", "model_gemm_shapes", "tune_gemm", "tune_point"]
