"""Tune the grouped-MoE launcher: time candidate configs at one TP4 rank of MiniMax M3 (the problem of
:mod:`m3lab.bench.moe`), write the table in vLLM's format (``kernels/moe/configs/E=..,N=..,device_name=...json``).

``m3lab tune moe`` (:func:`tune_table`): every candidate of a T's regime (:func:`candidates`) is compiled in
parallel processes first (:func:`precompile`), then timed graph-replayed on balanced routing; the fastest per T
goes into the table, whose entries of T not re-tuned are kept.
"""
import json
import time
from pathlib import Path

import torch
import triton

from ..bench import moe as bm
from ..bench.parallel import run_in_workers
from ..bench.timing import graph_time
from ..kernels.moe import tables
from ..kernels.moe.tables import COMBINES, MoeConfig

TUNE_TS = (1, 8, 32, 128, 512, 2048, 8192)

# Candidates per regime: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages, ORDER, DOWN_BLOCK_N, DOWN_BLOCK_K,
# DOWN warps, DOWN stages), each with both combines. Large T adds the tiles vLLM's shipped H200 table runs at
# M >= 1024 (E=128,N=768: 128 x 256 x 64, GROUP 1, 8 warps, 4 stages; our BLOCK_N counts gate and up rows each,
# so 128 here is vLLM's 256 of the fused gate_up rows) next to 64 x 64 / 128 x 128 tiles.
SMALL_TILES = [(16, bn, bk, 1, 4, st, "token", dbn, dbk, 4, dst)
               for bn, bk, st in ((16, 256, 4), (32, 128, 4), (64, 128, 3), (32, 128, 5))
               for dbn, dbk, dst in ((32, 256, 3), (64, 128, 4))]
MID_TILES = ([(bm, bn, 128 if bm == 32 else 64, 4, 4, 3, order, 128, 128 if bm == 32 else 64, 4, 3)
              for bm in (32, 64) for bn in (32, 64) for order in ("token", "expert")]
             + [(16, 64, 128, 1, 4, 3, "token", 64, 128, 4, 4), (16, 32, 128, 1, 4, 4, "token", 64, 128, 4, 4)])
LARGE_TILES = [(64, 64, 64, 8, 4, 3, "token", 128, 64, 4, 3), (128, 128, 64, 8, 8, 3, "token", 128, 64, 8, 3),
               (128, 128, 64, 1, 8, 4, "token", 256, 64, 8, 4), (128, 128, 64, 8, 8, 4, "token", 256, 64, 8, 4),
               (128, 64, 64, 8, 4, 4, "token", 128, 64, 4, 4), (64, 128, 64, 8, 8, 3, "token", 256, 64, 8, 3),
               (128, 128, 64, 4, 8, 3, "token", 128, 128, 8, 3)]


def candidates(t: int):
    """Configs tried at T (every distinct one is compiled once; M is not specialised)."""
    tiles = SMALL_TILES if t <= 32 else MID_TILES if t <= 512 else LARGE_TILES
    return [MoeConfig(*tile, COMBINE=c) for tile in tiles for c in COMBINES]


def _compile_worker(jobs: list[tuple[dict, int]]) -> list[str]:
    """Run each (config, T) once on the M3 shapes (uninitialised weights: only the binaries matter), which
    fills the Triton disk cache; -> one error string per job ('' = compiled)."""
    device = torch.device("cuda")
    w13 = torch.empty(bm.EXPERTS, 2 * bm.I, bm.H, device=device, dtype=torch.bfloat16)
    w2 = torch.empty(bm.EXPERTS, bm.H, bm.I, device=device, dtype=torch.bfloat16)
    errors = []
    for cfg, t in jobs:
        try:
            wts, ids = bm.route_call(t, "balanced", device)
            bm.ours("bf16", config=MoeConfig(**dict(cfg)))(torch.randn(t, bm.H, device=device, dtype=torch.bfloat16),
                                                  {"w13": w13, "w2": w2}, wts, ids)
            torch.cuda.synchronize()
            errors.append("")
        except Exception as err:
            errors.append(f"T={t} {dict(cfg)}: {type(err).__name__}: {str(err)[:120]}")
    return errors


def precompile(ts, workers: int = 12, log=print) -> int:
    """Compile every candidate of every T in ``workers`` processes (T 1 and T > 1 specialise differently:
    vLLM's naive assignment at T·k·4 <= E). -> the number of failures."""
    jobs = [(tuple(sorted(c.to_dict().items())), min(t, 8)) for t in ts for c in candidates(t)]
    return run_in_workers(_compile_worker, jobs, workers, log, "moe precompile")


def tune(ts=TUNE_TS, log=print, deadline: float | None = None, rep_ms: float = 25.0, fmt: str = "bf16"):
    """Time every candidate on balanced routing at each T -> ({T: best MoeConfig}, rows of every timing)."""
    device = torch.device("cuda")
    best, trials = {}, []
    for t in ts:
        ops = bm.operands(t, "balanced", [fmt], device)
        for cfg in candidates(t):
            if deadline is not None and time.time() > deadline:
                log(f"tune: deadline reached at T={t}")
                return {t_: c for t_, (_, c) in best.items()}, trials
            try:
                us = graph_time(provider_calls_for(fmt, ops, cfg), rep_ms=rep_ms, warmup_ms=5).us_p50
            except Exception as err:
                log(f"tune T={t} {cfg.to_dict()} failed: {type(err).__name__}: {str(err)[:200]}")
                continue
            trials.append({"T": t, "fmt": fmt, "us_p50": us, **cfg.to_dict()})
            if t not in best or us < best[t][0]:
                best[t] = (us, cfg)
        log(f"tune T={t}: best {best.get(t, (float('nan'),))[0]:.1f} us {best[t][1].to_dict() if t in best else ''}")
        del ops
    return {t: c for t, (_, c) in best.items()}, trials


def provider_calls_for(fmt: str, ops: bm.Operands, cfg) -> list:
    fn = bm.ours(fmt, config=cfg)
    return [lambda c=c: fn(ops.xs[c], ops.w(fmt, c), *ops.routes[c]) for c in range(bm.CALLS)]


def write_tuned(best: dict, outdir: Path | None = None, log=print) -> Path:
    """Merge ``best`` ({T: MoeConfig}) into the device's committed table (entries of T not re-tuned are kept) and
    write it to kernels/moe/configs; with ``outdir``, also ``OUT/moe_configs.json`` (the table and its metadata
    keyed by file name: the device tool returns no file names holding '=' or ',') -> the table's path."""
    name = tables.file_name(bm.EXPERTS, bm.I, tables.vllm_device_name(torch.device("cuda")))
    merged = {**tables.load_table(tables.CONFIG_DIR / name), **best}
    path = tables.write_table(tables.CONFIG_DIR / name, merged, triton_version=triton.__version__)
    if outdir is not None:
        bundle = {p.name: json.loads(p.read_text()) for p in (path, tables.meta_path(path))}
        (Path(outdir) / "moe_configs.json").write_text(json.dumps(bundle, indent=1))
    log(f"tune moe: wrote {name} ({sorted(best)})")
    return path


def tune_table(ts=TUNE_TS, budget_s: float = 300.0, outdir: Path | None = None, log=print, precompile_first=True):
    """Precompile, tune within ``budget_s`` and write the table (:func:`write_tuned`) -> every timing as rows."""
    t0 = time.time()
    if precompile_first:
        precompile(ts, log=log)
    best, trials = tune(tuple(ts), log, t0 + budget_s)
    if best:
        write_tuned(best, outdir, log)
    return trials
