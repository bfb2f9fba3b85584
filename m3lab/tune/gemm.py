"""Tune the GEMM launcher: time candidate configs at the model's shapes, write the tables.

For each (N, K, weight format) and each tuned M, every candidate of the M's regime is checked once
against ``linear_ref`` (a wrong or non-compiling config is dropped) and timed graph-replayed with
rotated weights (m3lab.bench.timing); the fastest goes into
``kernels/gemm/configs/N=..,K=..,w=..,device=...json``. A time budget bounds the run: points not
reached keep the heuristic fallback.
"""
import concurrent.futures as cf
import math
import multiprocessing as mp
import time
from pathlib import Path

import pandas as pd
import torch

from ..bench.gemm import make_operands
from ..bench.timing import graph_time
from ..gates.checks import TOLERANCES, rel_rms
from ..kernels.gemm import launcher, layout_launcher
from ..kernels.gemm.tables import (CONFIG_DIR, CROSSOVER_MAX_M, DECODE_MAX_M, GEMV_MAX_M, PREFILL_KERNELS, GemmConfig,
                                   device_name, heuristic_config, load_table, table_path, write_table)
from ..kernels.gemm.reference import W_FORMATS, linear_ref, quantize_weight
from ..kernels.mx.decode_layout import pack
from ..spec.dtypes import element_bytes
from ..spec.hardware import load_hardware

DECODE_MS = tuple(1 << i for i in range(CROSSOVER_MAX_M.bit_length()))     # 1, 2, 4, ..., CROSSOVER_MAX_M
PREFILL_MS = (2048, 4096, 8192)
# Decode candidates, from the H200 tuning runs (traces/bench/gemm_tune_NVIDIA_H200.csv): 64x128 or 32x128
# tiles, 5-6 stages, SPLIT_K 4-8 won most points but streamed <= 2.9 TB/s; BLOCK_M 128 at M = 128 lost to two
# 64-row tiles (27.7 vs 22.7 us, N 2560); unsplit 64-row tiles won N = 6144; the gemv kernel won M = 1 (MX)
# and lost 2-5x at M >= 8 (tables.GEMV_MAX_M).
# splitk (BLOCK_N, BLOCK_K, num_stages, num_warps) by BLOCK_M; M > 32 also tries half its BLOCK_M.
SPLITK_TILES = {16: ((64, 128, 6, 4), (64, 128, 5, 4), (32, 128, 6, 4), (64, 256, 4, 4), (32, 256, 6, 4),
                     (128, 128, 5, 8), (64, 512, 3, 4), (32, 512, 4, 4), (64, 256, 4, 8)),
                32: ((64, 128, 6, 4), (64, 256, 4, 4), (128, 128, 4, 8), (32, 256, 5, 4)),
                64: ((64, 128, 5, 4), (64, 256, 3, 4), (128, 128, 4, 8), (128, 64, 6, 8)),
                128: ((64, 128, 4, 4), (128, 128, 3, 8), (64, 64, 6, 4), (128, 64, 5, 8))}
# streamk (BLOCK_N, BLOCK_K, num_stages, num_warps), BLOCK_M covering all of M (W read once; M 128 also two
# 64-row tiles, neighbours in tile order), one program per SM, partials stored and summed by the last
# contributor or added by fp32 atomics (ATOMIC). H200 bf16 tuning at 1002f76: ATOMIC won every stream-K point
# (N 2304/2560, M 32-128; e.g. N 2560 M 32 13.6 vs 14.6 us stored, 15.5 split-K); two programs per SM, BLOCK_N
# 128-256 and the persistent TMA kernel at decode M (BLOCK_M = M, every tile stream-K) never won a decode point.
STREAMK_TILES = ((64, 128, 4, 4), (64, 64, 6, 4), (64, 256, 3, 4), (32, 128, 6, 4), (128, 64, 4, 8))
STREAMK_FIXUPS = (None, True)    # ATOMIC
# gemv (BLOCK_N, BLOCK_K, num_warps, num_stages), M <= GEMV_MAX_M, weight formats bf16/mxfp8/mxfp4
GEMV_TILES = ((16, 256, 4, 3), (8, 512, 4, 3), (32, 256, 8, 3), (16, 512, 8, 1), (32, 512, 8, 2))
FILLS = (1, 2, 4)                # programs per SM the split count aims at
SMEM_BYTES = 220 * 1024          # H200: 227 KiB per block; a candidate whose pipeline buffers exceed it is not tried
# prefill: tiled (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), GROUP_M 8. MX prefill dequantises W
# once and runs the bf16 kernel (launcher.DEQUANT_PREFILL), so MX tables take the bf16 winner.
PREFILL_TILES = ((128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4),
                 (64, 256, 64, 4, 4), (256, 128, 64, 8, 4), (128, 256, 64, 8, 4))
# prefill: persistent (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT_K, FLATTEN), GROUP_M 8, TMA where
# the GPU has it; SPLIT_K > 1 splits the last partial wave's tiles along K (launcher.persistent_plan). The per-point
# winners of 16 configs at M 2048/4096 x the 7 M3 TP4 shapes (H200, traces/bench/gemm_prefill_sweep_NVIDIA_H200.csv:
# 128 x 256 won 10 of 14 points; 256 x 128, warp specialisation and pointer loads never won; the tail split gained
# up to 25% at N 1536-2560).
PERSISTENT_TILES = ((128, 256, 64, 8, 3, 8, True), (128, 256, 64, 8, 3, 8, False), (128, 256, 64, 8, 3, 1, True),
                    (128, 128, 64, 8, 4, 8, False), (128, 128, 64, 4, 4, 8, True))
# decode layout (layout_launcher.linear_layout; tables w={format}_layout), M <= DECODE_MAX_M: (BLOCK_N, 32-groups per K step,
# num_warps, num_stages) per kernel and the kernels each format tries. H200 sweeps at f5560d7 and e2d9a2a
# (traces/bench/gemm_mx_layout_sweep_NVIDIA_H200.csv): mxdec_fold won 64 of 70 points, 16-32 x 64-128 x 128 tiles,
# 4 warps, 3 stages; the per-group kernels (mxdec, mxdec_fp8) lost everywhere but two mxfp8 M 64 points; the gemv
# kernel won four M 1 points by 3-12%. M > 32 tries the first LAYOUT_WIDE tiles only.
LAYOUT_SWEEP = {"mxdec_fold": ((128, 4, 4, 3), (128, 4, 4, 1), (64, 4, 4, 3), (128, 8, 4, 2), (128, 4, 8, 3),
                               (64, 8, 4, 3), (64, 4, 4, 1), (256, 4, 8, 3), (128, 2, 4, 4), (256, 2, 8, 1),
                               (64, 4, 2, 3)),
                "mxdec": ((128, 4, 4, 3), (64, 4, 4, 3)),
                "mxdec_fp8": ((128, 4, 4, 3), (64, 4, 4, 3))}
LAYOUT_TUNE_KERNELS = {"mxfp4": ("mxdec_fold", "mxdec"), "mxfp8": ("mxdec_fold", "mxdec_fp8")}
LAYOUT_WIDE = 5
LAYOUT_GEMV_TUNE_MAX_M = 8       # the layout gemv kernel is timed up to here (CUDA cores: it loses beyond)
LAYOUT_FORMATS = tuple(layout_launcher.layout_table_format(f) for f in launcher.MX_FORMATS)
TUNABLE_FORMATS = W_FORMATS + LAYOUT_FORMATS
DEQUANT_FORMATS = launcher.MX_FORMATS + ("fp8",)     # prefill M: dequantised once, the bf16 winner's config


def _pow2_ceil(v: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(v, 1))))


def _splits(tiles: int, k: int, bk: int, sms: int) -> list[int]:
    """Split counts (powers of two) giving about FILLS x SMs programs, each split at least one K step."""
    out = {max(1, min(k // bk, 1 << round(math.log2(max(1.0, f * sms / tiles))))) for f in FILLS}
    return sorted(out)


def profile_sms(hardware: str = "h200") -> int:
    """SMs (compute units) of a hardware profile: the grid the candidates aim at when no device is given."""
    return load_hardware(hardware).compute_units


def candidates(m: int, n: int, k: int, sms: int | None = None, w_format: str = "bf16") -> list[GemmConfig]:
    """Candidate configs of M's regime (tables.py): decode kernels (gemv, split-K, stream-K) for
    M <= DECODE_MAX_M, the prefill kernels (tiled, persistent) above CROSSOVER_MAX_M, both in between."""
    sms = sms or profile_sms()
    prefill = [GemmConfig("tiled", bm, bn, bk, 8, 1, nw, ns) for bm, bn, bk, nw, ns in PREFILL_TILES]
    prefill += [GemmConfig("persistent", bm, bn, bk, 8, sk, nw, ns, FLATTEN=fl or None)
                for bm, bn, bk, nw, ns, sk, fl in PERSISTENT_TILES]
    if m > CROSSOVER_MAX_M:
        return prefill
    out = []
    if m <= GEMV_MAX_M and w_format != "fp8":
        bm = _pow2_ceil(m)
        for bn, bk, nw, ns in GEMV_TILES:
            for split in _splits(math.ceil(n / bn), k, bk, sms)[-2:]:
                out.append(GemmConfig("gemv", bm, bn, bk, 1, split, nw, ns))
    top = max(16, min(128, _pow2_ceil(m)))
    for bm in ([top // 2, top] if top > 32 else [top]):
        for bn, bk, ns, nw in SPLITK_TILES[bm]:
            if ns * bk * (bn * element_bytes(w_format) + 2 * bm) > SMEM_BYTES:
                continue
            for split in _splits(math.ceil(n / bn) * math.ceil(m / bm), k, bk, sms):
                out.append(GemmConfig("splitk", bm, bn, bk, 1, split, nw, ns))
    for bm in ([top // 2, top] if top > 64 else [top]):
        for bn, bk, ns, nw in STREAMK_TILES:
            if ns * bk * (bn * element_bytes(w_format) + 2 * bm) <= SMEM_BYTES:
                out += [GemmConfig("streamk", bm, bn, bk, 1, 1, nw, ns, PER_SM=1, ATOMIC=a) for a in STREAMK_FIXUPS]
    if m > DECODE_MAX_M:
        out += prefill
    return list(dict.fromkeys(out))


def layout_candidates(m: int, n: int, k: int, sms: int | None = None, w_format: str = "mxfp8_layout") -> list[GemmConfig]:
    """Decode-layout candidates (M <= DECODE_MAX_M): the LAYOUT_SWEEP tiles of the format's kernels, SPLIT_K aiming
    at 2 x SMs programs (the first tile also at 1 and 4), and the gemv kernel up to LAYOUT_GEMV_TUNE_MAX_M."""
    sms = sms or profile_sms()
    fmt = base_format(w_format)
    bm = max(16, min(64, _pow2_ceil(m)))
    out = []
    for kern in LAYOUT_TUNE_KERNELS[fmt]:
        for i, (bn, groups, nw, ns) in enumerate(LAYOUT_SWEEP[kern][:LAYOUT_WIDE] if m > 32 else LAYOUT_SWEEP[kern]):
            tiles = math.ceil(n / bn) * math.ceil(m / bm)
            fills = (2, 1, 4) if i == 0 else (2,)
            splits = {max(1, min(k // (32 * groups), 1 << round(math.log2(max(1.0, f * sms / tiles))))) for f in fills}
            out += [GemmConfig(kern, bm, bn, 32 * groups, SPLIT_K=sp, num_warps=nw, num_stages=ns)
                    for sp in sorted(splits)]
    if m <= LAYOUT_GEMV_TUNE_MAX_M:
        out.append(layout_launcher.layout_gemv_config(m, n, k, sms))
    return list(dict.fromkeys(out))


def base_format(w_format: str) -> str:
    """"mxfp8_layout" -> "mxfp8"; formats as stored are their own base."""
    return w_format.removesuffix(layout_launcher.LAYOUT_SUFFIX)


def _weights(w: torch.Tensor, s, w_format: str):
    """What a launch of ``w_format`` takes: (w, scales), or the decode-layout package of them (packed once)."""
    if w_format in LAYOUT_FORMATS:
        return pack(w, s, base_format(w_format))
    return w, s


def _launch(x: torch.Tensor, weights, w_format: str, cfg: GemmConfig, out=None) -> torch.Tensor:
    if w_format in LAYOUT_FORMATS:
        return layout_launcher.linear_layout(x, weights, config=cfg, out=out)
    w, s = weights
    return launcher.linear(x, w, w_format=w_format, w_scale=s, config=cfg, out=out)


def _reference(x: torch.Tensor, w: torch.Tensor, s, w_format: str, cfg: GemmConfig) -> torch.Tensor:
    """linear_ref of the point; for the decode layout, the reference of the kernel ``cfg`` launches."""
    if w_format in LAYOUT_FORMATS:
        return layout_launcher.layout_linear_ref(x, w, s, base_format(w_format), cfg.kernel)
    return linear_ref(x.float(), w, w_format=w_format, w_scale=s)


def _compile_worker(jobs: list[tuple[str, dict, int]]) -> list[str]:
    """Run each (w_format, config, K) once on a small problem (N 512, the real K: the split count a config
    gets depends on K) with the real shapes' divisibility, which fills the Triton disk cache;
    -> one error string per job ('' = compiled)."""
    device = torch.device("cuda")
    errors = []
    for w_format, cfg, k in jobs:
        try:
            x = torch.randn(16, k, device=device, dtype=torch.bfloat16)
            w, s = quantize_weight(torch.randn(512, k, device=device, dtype=torch.bfloat16), base_format(w_format))
            _launch(x, _weights(w, s, w_format), w_format, GemmConfig.from_dict(cfg))
            torch.cuda.synchronize()
            errors.append("")
        except Exception as err:
            errors.append(f"{type(err).__name__}: {str(err)[:120]}")
    return errors


def precompile(jobs: list[tuple[str, GemmConfig, int]], workers: int = 12, log=print) -> dict:
    """Compile every (w_format, config, K) in parallel processes; -> {(w_format, config, K): error} for failures.

    M is not specialised and the M3 shapes share N, K divisibility, so one binary per config and split
    count serves every point.
    """
    jobs = list(dict.fromkeys(jobs))
    chunks = [jobs[i::workers] for i in range(workers)]
    t0, failed = time.time(), {}
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        futs = {pool.submit(_compile_worker, [(f, c.to_dict(), k) for f, c, k in ch]): ch for ch in chunks if ch}
        for fut in cf.as_completed(futs):
            for job, err in zip(futs[fut], fut.result()):
                if err:
                    failed[job] = err
    log(f"precompile: {len(jobs)} kernels in {time.time() - t0:.0f}s, {len(failed)} failed")
    return failed


def precompile_points(shapes, ms_by_format: dict, log=print, workers: int = 12) -> None:
    """Compile, in worker processes, the kernels the GEMM points will launch: each table config (the launcher's
    choice; MX and fp8 prefill run the bf16 one) and the decode-layout config at M <= 64. (matmul_ogs' variants
    compile in the timing process: in spawned workers its option constraints failed an assertion, H200.)"""
    device = torch.device("cuda")
    jobs = []
    for f, ms in ms_by_format.items():
        for n, k in shapes:
            for m in ms:
                cfg, kernel_format = launcher.launch_config(m, n, k, f, device)
                jobs.append((kernel_format, cfg, k))
                if f in launcher.MX_FORMATS and m <= 64:
                    lf = layout_launcher.layout_table_format(f)
                    jobs.append((lf, layout_launcher.layout_config(m, n, k, f, device), k))
    precompile(jobs, workers, log)


def tune_point(m: int, n: int, k: int, w_format: str, cands: list[GemmConfig], checked: dict,
               rep_ms: float = 8.0, device: torch.device | None = None, timer=None) -> list[dict]:
    """Time every candidate at one point -> rows {config, us, error}.

    ``timer(calls) -> Timing`` defaults to graph replay on the GPU (tests pass a CPU timer).
    """
    device = device or torch.device("cuda")
    timer = timer or (lambda calls: graph_time(calls, rep_ms=rep_ms, warmup_ms=2))
    tol = TOLERANCES["bfloat16" if device.type == "cuda" else "float16"]
    ops = make_operands(m, n, k, base_format(w_format), device)
    w, s = ops.ws[0]
    packed = [_weights(w_, s_, w_format) for w_, s_ in ops.ws]
    rows = []
    for cfg in cands:
        row = {"M": m, "N": n, "K": k, "w_format": w_format, "config": cfg, "us": math.nan, "error": ""}
        try:
            key = (n, k, w_format, cfg)
            if key not in checked:
                y = _launch(ops.x, packed[0], w_format, cfg)
                checked[key] = rel_rms(y, _reference(ops.x, w, s, w_format, cfg))
            if not checked[key] <= tol:
                raise RuntimeError(f"rel_rms {checked[key]:.3g} over tolerance")
            calls = [lambda p=p, y=y_, c=cfg: _launch(ops.x, p, w_format, c, out=y) for p, y_ in zip(packed, ops.ys)]
            row["us"] = timer(calls).us_p50
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {str(err)[:120]}"
        rows.append(row)
    return rows


def tune_gemm(shapes, w_formats=("bf16", "mxfp8", "mxfp4"), ms=DECODE_MS + PREFILL_MS,
              config_dir: Path = CONFIG_DIR, budget_s: float = 240.0, log=print, workers: int = 12) -> pd.DataFrame:
    """Tune every (shape, format, M) within the budget; write one table per (N, K, format). -> all timings.

    Formats: W_FORMATS (weights as stored, :func:`launcher.linear`) and LAYOUT_FORMATS (MX weights packed into the
    decode layout, :func:`layout_launcher.linear_layout`; decode M only).

    shapes: (N, K) pairs, normally :func:`m3lab.optable.kernel_shapes.model_gemm_shapes` (the OpTable's distinct GEMMs).
    Candidates are compiled in parallel first (``workers`` processes); MX and fp8 formats at prefill M take the
    bf16 winner (the launcher dequantises W, then runs the bf16 kernel), timed once for the record.
    """
    device = torch.device("cuda")
    dev_name = device_name(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    t0, checked, all_rows = time.time(), {}, []
    plan = {(f, n, k, m): (layout_candidates(m, n, k, sms, f) if f in LAYOUT_FORMATS else candidates(m, n, k, sms, f))
            for f in w_formats for n, k in shapes for m in ms if f not in LAYOUT_FORMATS or m <= DECODE_MAX_M}
    jobs = [(f, c, k) for (f, n, k, m), cs in plan.items() for c in cs
            if not (f in DEQUANT_FORMATS and c.kernel in PREFILL_KERNELS)]
    failed = {}
    if workers > 1:
        log(f"precompile: {len(jobs)} kernels on {workers} processes ...")
        try:
            failed = precompile(jobs, workers, log)
        except Exception as err:      # compiling serially while timing is slower, never wrong
            log(f"precompile failed ({type(err).__name__}: {str(err)[:200]}); compiling while timing")
    done, total = 0, len(plan)   # progress: points tuned of all (shape, format, M) points
    order = sorted(w_formats, key=lambda f: f != "bf16")        # bf16 first: MX prefill reuses its winners
    tables: dict[tuple, dict] = {}
    if "bf16" not in w_formats:                                 # MX prefill: the committed bf16 winners
        for n, k in shapes:
            tables[(n, k, "bf16")] = dict(load_table(table_path(n, k, "bf16", dev_name, config_dir)))
    for w_format in order:
        for n, k in shapes:
            path = table_path(n, k, w_format, dev_name, config_dir)
            table = tables.setdefault((n, k, w_format), dict(load_table(path)))     # entries not re-tuned are kept
            for m in (m for m in ms if (w_format, n, k, m) in plan):
                if time.time() - t0 > budget_s:
                    log(f"tune: budget {budget_s:.0f}s spent; N={n} K={k} {w_format} M={m} keeps the heuristic")
                    break
                cands = [c for c in plan[(w_format, n, k, m)] if (w_format, c, k) not in failed]
                if w_format in DEQUANT_FORMATS and m > CROSSOVER_MAX_M and m in tables.get((n, k, "bf16"), {}):
                    cands = [tables[(n, k, "bf16")][m]]
                rows = tune_point(m, n, k, w_format, cands, checked)
                all_rows += rows
                done += 1
                ok = [r for r in rows if not math.isnan(r["us"])]
                if ok:
                    best = min(ok, key=lambda r: r["us"])
                    table[m] = best["config"]
                    log(f"[{done}/{total}, {time.time() - t0:.0f} of {budget_s:.0f} s] tune N={n} K={k} {w_format} "
                        f"M={m}: {best['us']:.1f}us {best['config'].to_dict()}")
            if table:
                write_table(path, table)
    df = pd.DataFrame(all_rows)
    if len(df):
        df["config"] = df["config"].map(lambda c: c.to_dict())
    return df


__all__ = ["candidates", "heuristic_config", "layout_candidates", "tune_gemm", "tune_point"]
