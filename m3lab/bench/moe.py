"""Grouped-MoE benchmark on the GPU: our kernel vs vLLM's own MoE kernels, torch._grouped_mm and a per-expert loop.
(Over 400 lines: runner, tuner and recorded-table analysis together until bench/ is split per op.)

``python -m m3lab.bench.moe --out DIR [--phases gates,tune,bench] [--deadline-s 520]`` writes into DIR:
``moe.csv`` (long-format rows, m3lab.bench.table), ``moe_tune.csv`` (every tuning timing), the tuned tables
in vLLM's format (``E=129,N=768,device_name=...json`` + ``.m3lab.json``), ``gates_cuda.csv``, ``log.txt``.

Problem: MiniMax M3 at TP4 — hidden 6144, 768 intermediate columns per rank, 128 routed experts + the
shared one fused as expert 128 (top-5, vLLM's "scaled weights" convention), T tokens. Routing per call:
``balanced`` (each expert the same load, a fresh permutation per call) or ``zipf`` (expert popularity
∝ 1/rank, a fresh ranking per call). Each timed graph holds ``CALLS`` calls, each on its own x and
routing and on one of ``WEIGHT_COPIES`` weight copies (3 × 3.65 GB bf16), so no call finds its weights in
the L2 left by the previous one (the shared expert included).

Providers (same operands, same graph replay):
- ``m3lab`` (tuned table or heuristic), ``m3lab-order=token`` / ``m3lab-order=expert`` (program orders),
  ``m3lab-separate-shared`` (routed top-4 on 128 experts, then the shared expert as its own launch, added);
  weights bf16, mxfp8, mxfp4 (activations bf16);
- ``vllm-triton``: vLLM's ``fused_moe_kernel`` bf16 path (m3lab/gates/moe.vllm_fused_moe: vLLM's config lookup,
  its SwiGLU-OAI kernel; our alignment, since vLLM's is a compiled op);
- ``vllm-mxfp8``: vLLM's ``fused_moe_mxfp8_native`` (``_mxfp8_grouped_gemm_kernel`` + its fused SwiGLU-MXFP8
  quant), with our alignment and our MXFP8 input quantiser in place of its two compiled ops. On Hopper
  Triton emulates ``dot_scaled`` (no MX units): reported, not a target;
- ``torch-grouped-mm``: ``torch._grouped_mm`` over expert-sorted rows (sort, two grouped GEMMs, SwiGLU in
  torch, weighted index_add);
- ``torch-loop``: one matmul pair per touched expert (routing known on the host, T ≤ LOOP_MAX_T).

Figures: µs per call (p20/p50/p80), TB/s over the expert-weight bytes the call touches (distinct experts ×
bytes per expert incl. scales), TFLOP/s (2·T·k·3·H·I), fraction of the measured ceiling that bounds it.
"""
import json
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from .table import BenchRow, append_rows, commit_id, today

H, I, ROUTED, TOPK = 6144, 768, 128, 4
EXPERTS = ROUTED + 1                      # the shared expert fused as expert 128
TS = (1, 8, 32, 128, 512, 2048, 8192)
ROUTINGS = ("balanced", "zipf")
CALLS = 24
WEIGHT_COPIES = 3
LOOP_MAX_T = 32
FORMATS = ("bf16", "mxfp8", "mxfp4")


@lru_cache(maxsize=1)
def act() -> dict:
    """SwiGLU-OAI constants of MiniMax M3 (alpha, limit, beta), from its ModelSpec (the one place they live)."""
    from m3lab.spec.model import load_model
    return load_model("minimax-m3").swiglu


def expert_bytes(fmt: str) -> float:
    """Bytes of one expert's w13 + w2 (incl. E8M0 scales)."""
    from m3lab.spec.dtypes import weight_bytes
    return weight_bytes(3 * H * I, fmt)


def moe_flops(t: int, k: int = TOPK + 1) -> float:
    return 2.0 * t * k * 3 * H * I


# --- operands -------------------------------------------------------------------------------------------
def route_call(t: int, routing: str, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One call's routing with the shared slot: (weights fp32 [t, 5] in the scaled-weights convention, ids int32)."""
    if routing == "balanced":
        perm = torch.randperm(ROUTED, device=device)
        slot = torch.arange(t * TOPK, device=device).reshape(t, TOPK)
        ids = perm[(slot + (slot // ROUTED)) % ROUTED]          # t·4 consecutive picks: distinct per token
    else:
        rank = torch.randperm(ROUTED, device=device)
        p = 1.0 / (1.0 + torch.arange(ROUTED, device=device, dtype=torch.float32))
        ids = rank[torch.multinomial(p.expand(t, ROUTED), TOPK, replacement=False)]
    w = torch.rand(t, TOPK, device=device) + 0.1
    w = 2.0 * w / w.sum(1, keepdim=True)
    ids = torch.cat([ids, torch.full((t, 1), ROUTED, device=device)], 1).to(torch.int32)
    return torch.cat([w, torch.ones(t, 1, device=device)], 1).contiguous(), ids.contiguous()


@dataclass
class Operands:
    weights: dict                 # fmt -> list of WEIGHT_COPIES dicts (w13, w2, scales)
    xs: list                      # CALLS x [t, H] bf16
    routes: list                  # CALLS (weights, ids)
    touched: list                 # CALLS distinct experts touched

    def w(self, fmt: str, call: int) -> dict:
        return self.weights[fmt][call % len(self.weights[fmt])]


_WEIGHTS: dict = {}


def weights(fmt: str, device) -> list:
    """WEIGHT_COPIES copies of the 129-expert weights in fmt (cached across points)."""
    if fmt not in _WEIGHTS:
        from ..gates.moe import make_weights
        base = make_weights(EXPERTS, H, I, fmt, torch.bfloat16, device)
        _WEIGHTS[fmt] = [base] + [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in base.items()}
                                  for _ in range(WEIGHT_COPIES - 1)]
    return _WEIGHTS[fmt]


def operands(t: int, routing: str, fmts, device) -> Operands:
    routes = [route_call(t, routing, device) for _ in range(CALLS)]
    return Operands({f: weights(f, device) for f in fmts},
                    [torch.randn(t, H, device=device, dtype=torch.bfloat16) for _ in range(CALLS)],
                    routes, [int(torch.unique(ids).numel()) for _, ids in routes])


# --- providers ------------------------------------------------------------------------------------------
def _ours(fmt: str, **kw):
    from ..kernels.moe.launcher import fused_moe

    def call(x, w, weights_, ids):
        return fused_moe(x, w["w13"], w["w2"], weights_, ids, **act(), w13_scale=w.get("w13_scale"),
                         w2_scale=w.get("w2_scale"), fmt=fmt, **kw)
    return call


def _separate_shared(x, w, weights_, ids):
    from ..kernels.moe.launcher import fused_moe
    routed = fused_moe(x, w["w13"][:ROUTED], w["w2"][:ROUTED], weights_[:, :TOPK], ids[:, :TOPK], **act())
    shared = fused_moe(x, w["w13"][ROUTED:], w["w2"][ROUTED:], weights_[:, TOPK:], torch.zeros_like(ids[:, TOPK:]),
                       **act())
    return routed + shared


def _vllm_triton(x, w, weights_, ids):
    from ..gates.moe import vllm_fused_moe
    return vllm_fused_moe(x, w["w13"], w["w2"], weights_, ids, **act())


_VLLM_MX = {}


def _vllm_mxfp8(x, w, weights_, ids):
    """vLLM's fused_moe_mxfp8_native with its two compiled ops replaced (module attributes, patched once)."""
    if not _VLLM_MX:
        from ..kernels.moe.align import align
        from ..kernels.mx import triton_mx
        from ..vllm_src.imports import m3_module, vllm_module
        m3_module("amd.ops.swiglu_oai")
        mod = vllm_module("vllm.model_executor.layers.fused_moe.experts.mxfp8_native_moe")
        mod.moe_align_block_size = lambda ids_, block_m, e, emap=None, ignore_invalid_experts=False: \
            align(ids_, block_m, e, emap)
        mod.mxfp8_e4m3_quantize = lambda a: triton_mx.quantize(a, "mxfp8")
        _VLLM_MX["mod"] = mod
    return _VLLM_MX["mod"].fused_moe_mxfp8_native(
        x, w["w13"], w["w13_scale"], w["w2"], w["w2_scale"], weights_, ids, alpha=act()["alpha"], beta=act()["beta"],
        limit=act()["limit"], global_num_experts=ROUTED, expert_map=None)


def _grouped_mm(x, w, weights_, ids):
    from ..kernels.moe.reference import swiglu_oai
    t, k = ids.shape
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(EXPERTS, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    rows = order // k
    h = torch._grouped_mm(x[rows], w["w13"].transpose(-2, -1), offs=offs)
    a = swiglu_oai(h, **act())
    y = torch._grouped_mm(a, w["w2"].transpose(-2, -1), offs=offs)
    out = torch.zeros(t, H, device=x.device, dtype=torch.float32)
    out.index_add_(0, rows, y.float() * weights_.reshape(-1)[order, None])
    return out.to(x.dtype)


def _loop_calls(ops: Operands):
    """Per-expert loop: the routing of each call is read on the host before capture."""
    from ..kernels.moe.reference import swiglu_oai
    calls = []
    for c, (x, (wts, ids)) in enumerate(zip(ops.xs, ops.routes)):
        w = ops.w("bf16", c)
        plan = []
        for e in torch.unique(ids).tolist():
            rows, slots = torch.nonzero(ids == e, as_tuple=True)
            plan.append((e, rows, wts[rows, slots][:, None]))

        def call(x=x, w=w, plan=plan):
            out = torch.zeros(x.shape[0], H, device=x.device, dtype=torch.float32)
            for e, rows, wt in plan:
                a = swiglu_oai(x[rows] @ w["w13"][e].T, **act())
                out.index_add_(0, rows, (a @ w["w2"][e].T).float() * wt)
            return out.to(x.dtype)
        calls.append(call)
    return calls


PROVIDERS = {   # name -> (weight format, call factory)
    "m3lab": ("bf16", lambda: _ours("bf16")),
    "m3lab-order=token": ("bf16", lambda: _ours("bf16", order="token")),
    "m3lab-order=expert": ("bf16", lambda: _ours("bf16", order="expert")),
    "m3lab-separate-shared": ("bf16", lambda: _separate_shared),
    "m3lab-mxfp8": ("mxfp8", lambda: _ours("mxfp8")),
    "m3lab-mxfp4": ("mxfp4", lambda: _ours("mxfp4")),
    "vllm-triton": ("bf16", lambda: _vllm_triton),
    "vllm-mxfp8": ("mxfp8", lambda: _vllm_mxfp8),
    "torch-grouped-mm": ("bf16", lambda: _grouped_mm),
    "torch-loop": ("bf16", None),
}


def provider_calls(name: str, ops: Operands) -> list:
    fmt, factory = PROVIDERS[name]
    if name == "torch-loop":
        return _loop_calls(ops)
    fn = factory()
    return [lambda c=c: fn(ops.xs[c], ops.w(fmt, c), *ops.routes[c]) for c in range(CALLS)]


def row(name: str, t: int, routing: str, timing, ops: Operands, ceilings, device_name: str) -> BenchRow:
    fmt = PROVIDERS[name][0]
    nbytes = expert_bytes(fmt) * sum(ops.touched) / len(ops.touched)
    flops = moe_flops(t)
    ceiling, value, floor_us = ceilings.limit(flops, nbytes)
    us = timing.us_p50
    return BenchRow("moe", name, f"T={t},H={H},I={I},E={EXPERTS},k={TOPK + 1},routing={routing}", fmt,
                    timing.us_p20, us, timing.us_p80, flops / us / 1e6, nbytes / us / 1e6, floor_us / us, ceiling,
                    device_name, commit_id(), today(), ceiling_value=value)


def bench(providers, ts=TS, routings=ROUTINGS, ceilings=None, log=print, deadline: float | None = None,
          rep_ms: float = 40.0) -> list[BenchRow]:
    from ..kernels.moe.tables import vllm_device_name
    from .ceilings import Ceilings
    from .timing import graph_time
    device = torch.device("cuda")
    name = vllm_device_name(device)
    ceilings = ceilings or Ceilings()
    rows = []
    for routing in routings:
        for t in ts:
            if deadline is not None and time.time() > deadline:
                log(f"bench: deadline reached before T={t} {routing}")
                return rows
            provs = [p for p in providers if not (p == "torch-loop" and t > LOOP_MAX_T)
                     and not (p == "m3lab-separate-shared" and t not in (1, 128))]
            ops = operands(t, routing, sorted({PROVIDERS[p][0] for p in provs}), device)
            line = []
            for p in provs:
                try:
                    timing = graph_time(provider_calls(p, ops), rep_ms=rep_ms, warmup_ms=10)
                except Exception as err:  # keep going; the log says what failed
                    log(f"bench {p} T={t} {routing} failed: {type(err).__name__}: {str(err)[:300]}")
                    continue
                rows.append(row(p, t, routing, timing, ops, ceilings, name))
                line.append(f"{p}:{timing.us_p50:.1f}")
            log(f"T={t} {routing}: " + " ".join(line))
            del ops
    return rows


# --- tuning ---------------------------------------------------------------------------------------------
# Candidates per regime: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages, ORDER, DOWN_BLOCK_N, DOWN_BLOCK_K,
# DOWN warps, DOWN stages), each with both combines. Large T adds the tiles vLLM's shipped H200 table runs at
# M >= 1024 (E=128,N=768: 128 x 256 x 64, GROUP 1, 8 warps, 4 stages; our BLOCK_N counts gate and up rows each,
# so 128 here is vLLM's 256 of the fused gate_up rows) next to the earlier winners (64 x 64 / 128 x 128 tiles).
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
    from ..kernels.moe.tables import COMBINES, MoeConfig
    tiles = SMALL_TILES if t <= 32 else MID_TILES if t <= 512 else LARGE_TILES
    return [MoeConfig(*tile, COMBINE=c) for tile in tiles for c in COMBINES]


def _compile_worker(jobs: list[tuple[dict, int]]) -> list[str]:
    """Run each (config, T) once on the M3 shapes (uninitialised weights: only the binaries matter), which
    fills the Triton disk cache; -> one error string per job ('' = compiled)."""
    from ..kernels.moe.tables import MoeConfig
    device = torch.device("cuda")
    w13 = torch.empty(EXPERTS, 2 * I, H, device=device, dtype=torch.bfloat16)
    w2 = torch.empty(EXPERTS, H, I, device=device, dtype=torch.bfloat16)
    errors = []
    for cfg, t in jobs:
        try:
            wts, ids = route_call(t, "balanced", device)
            _ours("bf16", config=MoeConfig(**dict(cfg)))(torch.randn(t, H, device=device, dtype=torch.bfloat16),
                                                  {"w13": w13, "w2": w2}, wts, ids)
            torch.cuda.synchronize()
            errors.append("")
        except Exception as err:
            errors.append(f"T={t} {dict(cfg)}: {type(err).__name__}: {str(err)[:120]}")
    return errors


def precompile(ts, workers: int = 12, log=print) -> int:
    """Compile every candidate of every T in ``workers`` processes (T 1 and T > 1 specialise differently:
    vLLM's naive assignment at T·k·4 <= E). -> the number of failures."""
    from .parallel import run_in_workers
    jobs = [(tuple(sorted(c.to_dict().items())), min(t, 8)) for t in ts for c in candidates(t)]
    return run_in_workers(_compile_worker, jobs, workers, log, "moe precompile")


def tune(ts=TS, log=print, deadline: float | None = None, rep_ms: float = 25.0, fmt: str = "bf16"):
    """Time every candidate on balanced routing at each T -> ({T: best MoeConfig}, rows of every timing)."""
    from .timing import graph_time
    device = torch.device("cuda")
    best, trials = {}, []
    for t in ts:
        ops = operands(t, "balanced", [fmt], device)
        for cfg in candidates(t):
            if deadline is not None and time.time() > deadline:
                log(f"tune: deadline reached at T={t}")
                return best, trials
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


def provider_calls_for(fmt: str, ops: Operands, cfg) -> list:
    fn = _ours(fmt, config=cfg)
    return [lambda c=c: fn(ops.xs[c], ops.w(fmt, c), *ops.routes[c]) for c in range(CALLS)]


# --- one GPU session --------------------------------------------------------------------------------------
def main(out: str = "out", phases: str = "gates,tune,bench", deadline_s: float = 520.0, tune_until_s: float = 300.0,
         providers: str = ",".join(PROVIDERS), ts: str = ",".join(map(str, TS)), tune_ts: str = "1,8,32,128,512,2048,8192",
         rep_ms: float = 40.0) -> None:
    """Gates (moe.*, vllm.*) on the GPU, tuning of the bf16 table, then every provider side by side."""
    import pandas as pd
    import triton

    from ..kernels.moe import tables
    from .ceilings import measure_ceilings
    from .session_log import session_log
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log = session_log(outdir / "log.txt", t0)
    device = torch.device("cuda")
    ceilings = measure_ceilings(device)
    log(f"device {torch.cuda.get_device_name(device)} torch {torch.__version__} triton {triton.__version__} "
        f"copy {ceilings.copy_tbps:.2f} TB/s mm {ceilings.mm_tflops:.0f} TFLOP/s")
    todo = phases.split(",")
    deadline = t0 + deadline_s
    if "gates" in todo:
        try:
            from ..gates.runner import run_gates
            df = run_gates("cuda", names=["moe.*", "vllm.*"], perf=False)
            df.to_csv(outdir / "gates_cuda.csv", index=False)
            log(f"gates: {int(df['passed'].sum())}/{len(df)} passed")
            for _, r in df[~df["passed"].astype(bool) | (df["detail"].astype(str) != "")].iterrows():
                log(f"  {'ok  ' if r['passed'] else 'FAIL'} {r['gate']} {r['case']} {r['value']} {str(r['detail'])[:300]}")
        except Exception as err:
            log(f"gates failed: {type(err).__name__}: {err}")
    if "tune" in todo:
        best, trials = tune(tuple(int(v) for v in tune_ts.split(",")), log, t0 + tune_until_s)
        pd.DataFrame(trials).to_csv(outdir / "moe_tune.csv", index=False)
        if best:
            name = tables.file_name(EXPERTS, I, tables.vllm_device_name(device))
            best = {**tables.load_table(tables.CONFIG_DIR / name), **best}    # entries of T not re-tuned are kept
            path = tables.write_table(outdir / name, best, triton_version=triton.__version__)
            tables.write_table(tables.CONFIG_DIR / name, best, triton_version=triton.__version__)
            # the device tool returns no file names holding '=' or ',': the same tables, keyed by file name
            bundle = {p.name: json.loads(p.read_text()) for p in (path, tables.meta_path(path))}
            (outdir / "moe_configs.json").write_text(json.dumps(bundle, indent=1))
            log(f"tune: wrote {path.name}")
    if "bench" in todo:
        rows = bench(providers.split(","), tuple(int(v) for v in ts.split(",")), ceilings=ceilings, log=log,
                     deadline=deadline - 20, rep_ms=rep_ms)
        append_rows(outdir / "moe.csv", rows)
        log(f"bench: {len(rows)} rows")
    (outdir / "env.json").write_text(json.dumps({"copy_tbps": ceilings.copy_tbps, "mm_tflops": ceilings.mm_tflops}))
    log(f"done in {time.time() - t0:.0f}s")


def moe_table(path=None, latest: bool = True):
    """The recorded benchmark table (traces/bench/moe.csv) with T and routing parsed; ``latest``: for each
    (provider, shape, dtype) only the most recent row (a later run may cover only some token counts)."""
    from .table import TRACES_BENCH, read_table
    df = read_table(path or TRACES_BENCH / "moe.csv")
    df["routing"] = df["shape"].str.extract(r"routing=(\w+)")[0]
    if latest and len(df):
        df = df.drop_duplicates(["op", "provider", "shape", "dtype"], keep="last")
    return df.reset_index(drop=True)


if __name__ == "__main__":
    import typer
    typer.run(main)


# --- analysis of a recorded table ----------------------------------------------------------------------------
TARGET_SMALL_T = 128   # the targets: every T <= 128
BW_MIN_T = 32


def _p50(df, provider: str, fmt: str | None = None):
    sel = df[df["provider"] == provider]
    if fmt:
        sel = sel[sel["dtype"] == fmt]
    return sel.set_index(["routing", "T"])["us_p50"]


def copy_ceiling(df) -> float:
    """The measured copy bandwidth (TB/s) the table's rows are quoted against (median over rows)."""
    return float(df.loc[df["ceiling"] == "copy_tbps", "ceiling_value"].median())


def moe_targets(df):
    """The issue's H200 targets against a recorded table (moe_table()): one row per target and routing,
    measured figure over the T its title names (``TS``), the named T the table lacks (``missing``), threshold,
    ``status``/``passed`` (m3lab.analysis.targets: a missing T is ``incomplete``, never passed)."""
    import numpy as np
    import pandas as pd

    from ..analysis.targets import add_verdicts, missing
    ours = _p50(df, "m3lab")
    peer = pd.concat([_p50(df, "vllm-triton"), _p50(df, "torch-grouped-mm")], axis=1).min(axis=1)
    gmm = _p50(df, "torch-grouped-mm")
    mine = df[df["provider"] == "m3lab"].set_index(["routing", "T"])
    tb = mine["tbps"]
    intensity = mine["tflops"] / mine["tbps"]            # FLOP per byte of the problem (same bytes as tbps)
    copy = copy_ceiling(df)
    from m3lab.spec.hardware import load_hardware
    h200 = load_hardware("h200").measured
    ridge = h200["bf16_gemm_flops"] / h200["hbm_copy_bw"]   # ~162 FLOP/B: above it a problem is compute-bound
    rows = []
    for routing in sorted(df["routing"].dropna().unique()):
        def worst(series, ts):   # -> (worst value over the named T, the named T the series lacks)
            vals = [series.get((routing, t), np.nan) for t in ts]
            gap = missing([t for t, v in zip(ts, vals) if not np.isnan(v)], ts, "T")
            return (float(np.nanmin(vals)) if not all(np.isnan(vals)) else np.nan), gap
        speed = (peer / ours)
        memory_bound = [t for t in TS if t >= BW_MIN_T and intensity.get((routing, t), 0) < ridge]
        rows += [
            (routing, "T <= 128: m3lab vs the faster of vllm-triton and torch._grouped_mm (worst T)",
             *worst(speed, [t for t in TS if t <= TARGET_SMALL_T]), 1.2),
            (routing, "T >= 32 and memory-bound (FLOP/byte under the measured H200 ridge): fraction of copy "
                      "bandwidth on touched weight bytes (worst T)",
             *worst(tb / copy, memory_bound or [BW_MIN_T]), 0.75),
            (routing, "T = 8192: m3lab vs torch._grouped_mm", *worst(gmm / ours, [8192]), 1.2),
            (routing, "MXFP8 weights, T <= 32: speed-up over our bf16 (worst T)",
             *worst(ours / _p50(df, "m3lab-mxfp8"), [t for t in TS if t <= 32]), 1.5),
            (routing, "MXFP4 weights, T <= 32: speed-up over our bf16 (worst T)",
             *worst(ours / _p50(df, "m3lab-mxfp4"), [t for t in TS if t <= 32]), 2.2),
            (routing, "T = 1: fused shared expert vs separate (speed-up; write-up +30.2% at concurrency 1)",
             *worst(_p50(df, "m3lab-separate-shared") / ours, [1]), 1.0),
        ]
    return add_verdicts(pd.DataFrame(rows, columns=["routing", "target", "measured", "missing", "threshold"]))


def decode_share(df, batch: int = 32, context: int = 8192, hardware: str = "h200", routing: str = "balanced",
                 quant: str = "bf16"):
    """The MoE's share of one TP4 decode step: the OpTable costed for ``hardware`` (projected), and the same
    step with every layer's grouped GEMMs replaced by our measured fused-MoE time at T = batch (nearest T).

    -> DataFrame: kind, projected_us, with_measured_moe_us (whole model, one step).
    """
    import pandas as pd

    from ..serving.step_cost import cost_step
    from ..spec.serving import make_deployment
    from ..workload.step import EngineStep
    dep = make_deployment(None, model="minimax-m3", hardware=hardware, tp=4, quant=quant)
    costed = cost_step(dep, EngineStep.decode(batch, context), calibration=None)
    by_kind = costed.groupby("kind")["t_us"].sum()
    moe_layers = costed.loc[costed["kind"] == "grouped_gemm", "layer"].nunique()
    ours = _p50(df, "m3lab")
    ts = sorted(t for r, t in ours.index if r == routing)
    t_near = min(ts, key=lambda t: abs(t - batch))
    measured = by_kind.copy()
    measured["grouped_gemm"] = float(ours[(routing, t_near)]) * moe_layers
    out = pd.DataFrame({"projected_us": by_kind, "with_measured_moe_us": measured}).fillna(0.0)
    out.attrs.update({"batch": batch, "measured_T": t_near, "moe_layers": moe_layers, "hardware": hardware})
    return out.reset_index().rename(columns={"index": "kind"})
