"""One GPU call for the kernels: tune, time every peer at its best in rounds, re-record the perf baseline, gate.

``python -m m3lab.sessions.peers --out DIR [--phases tune_moe,tune_gemm,peers,baseline,gates]``
writes into DIR (the device tool's $OUT; at most 8 files, none holding '=' or ','), each as soon as its
phase ends: ``env.json`` (versions, ceilings, nvidia-smi clocks and power before and after the run, the
harness self-check), ``log.txt``,
``tune.csv`` (every tuning timing, MoE and GEMM; column ``kind``), ``moe_configs.json`` /
``gemm_configs.json`` (the tuned tables, {file name: content}), ``peers.csv`` (m3lab.bench.peers rows),
``baseline.csv`` (the perf-gate baseline, also written to traces/gates/ where the gates read it) and
``gates_cuda.csv`` (what ``m3lab gate --device cuda`` runs, in three groups so a cut run keeps the finished ones).
Each phase is guarded and bounded by its deadline (seconds from the start); a failure is logged and the
next phase runs.
"""
from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch
import triton
import typer

from ..bench import moe as bm
from ..bench import peers
from ..bench import sparse_attn as sa
from ..bench.ceilings import measure_ceilings
from ..bench.perf_gate import baseline_path, run_gates
from ..bench.peers_gemm import gemm_point
from ..bench.session_log import session_log
from ..bench.table import append_rows, rows_frame
from ..bench.timing import profile_check
from ..bench_analysis.peers import peer_targets
from ..gates.moe import vllm_fused_moe
from ..kernels.gemm.tables import CONFIG_DIR, device_name
from ..optable.kernel_shapes import model_gemm_shapes, rank_dims
from ..tune import moe as tm
from ..tune.gemm import precompile_points, tune_gemm

PHASES = ("tune_moe", "tune_gemm", "selfcheck", "peers", "baseline", "gates")
_DIMS = rank_dims("minimax-m3", tp=4)
SHARED_EXPERT_SHAPES = ((2 * _DIMS.shared_inter, _DIMS.hidden), (_DIMS.hidden, _DIMS.shared_inter))   # (N, K) at TP4
GATE_GROUPS = (("gemm.*", "mx.*"), ("moe.*", "sparse.*", "vllm.*"), ("perf.*",))
BASELINE_MS = (1, 32, 128, 2048)


def _smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,"
                               "power.limit,temperature.gpu,clocks_throttle_reasons.active", "--format=csv"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as err:
        return f"nvidia-smi failed: {type(err).__name__}"


def _tables_bundle(paths) -> str:
    return json.dumps({p.name: json.loads(p.read_text()) for p in paths}, indent=1)


def tune_moe(outdir: Path, ts, until: float, log) -> pd.DataFrame:
    """The MoE's bf16 table (m3lab.tune.moe), written to kernels/moe/configs and bundled into moe_configs.json."""
    return pd.DataFrame(tm.tune_table(ts, budget_s=until - time.time(), outdir=outdir, log=log)).assign(kind="moe")


def tune_gemm_tables(outdir: Path, budget_s: float, log) -> pd.DataFrame:
    """The shared expert's OCP MX tables (MXFP8, MXFP4 at decode M; prefill M takes the bf16 winner)."""
    df = tune_gemm(SHARED_EXPERT_SHAPES, ("mxfp8", "mxfp4"), ms=(1, 8, 32, 128, 2048), budget_s=budget_s, log=log,
                   workers=16)
    name = device_name(torch.device("cuda"))
    (outdir / "gemm_configs.json").write_text(_tables_bundle(sorted(CONFIG_DIR.glob(f"*device={name}.json"))))
    return df.assign(kind="gemm")


def run_peers(outdir: Path, rounds: int, gemm_rounds: int, until: float, ceilings, log) -> list:
    """Rounds of sparse, MoE and (the first ``gemm_rounds``) GEMM points (m3lab.bench.peers), appended to
    peers.csv as they finish."""
    name = torch.cuda.get_device_name(0).replace(" ", "_")
    try:
        precompile_points(model_gemm_shapes(), peers.GEMM_MS, log)
    except Exception as err:      # compiling while timing is slower, never wrong
        log(f"peers precompile failed: {type(err).__name__}: {str(err)[:300]}")
    all_rows, keep_moe, keep_gemm = [], {}, {}
    for rnd in range(1, rounds + 1):
        jobs = [("sparse", p) for p in peers.SPARSE_POINTS] + [("moe", t) for t in peers.MOE_TS]
        if rnd <= gemm_rounds:
            jobs += [("gemm", (m, n, k, f)) for f, ms in peers.GEMM_MS.items() for n, k in model_gemm_shapes()
                     for m in ms]
        for kind, point in jobs:
            if time.time() > until:
                log(f"peers: deadline reached in round {rnd} before {kind} {point}")
                return all_rows
            try:
                if kind == "sparse":
                    rows = peers.sparse_point(*point, rnd, ceilings, name, log)
                elif kind == "moe":
                    rows, res = peers.moe_point(point, rnd, keep_moe.get(point) if rnd > 1 else None, ceilings,
                                                name, log)
                    keep_moe.setdefault(point, peers.keep_best(res, {"m3lab"}))
                else:
                    rows, res = gemm_point(*point, rnd, keep_gemm.get(point) if rnd > 1 else None, ceilings, name,
                                           log)
                    keep_gemm.setdefault(point, peers.keep_best(res, {"triton", "triton-mx-layout"}))
            except Exception as err:
                log(f"peers {kind} {point} round {rnd} failed: {type(err).__name__}: {str(err)[:300]}")
                continue
            append_rows(outdir / "peers.csv", rows)
            all_rows += rows
    return all_rows


def self_check(log) -> list[dict]:
    """The harness's self-check (timing.profile_check: per-call time vs the profiler's kernels, or their span when
    a call launches several) on the launch-bound points: sparse attention B 1 (ours: one kernel; vLLM: two with
    PDL) and the MoE at T 1 (ours and vLLM's default)."""
    device = torch.device("cuda")
    p = sa.make_point(1, 8192, 1, device)
    ops = bm.operands(1, "balanced", ["bf16"], device)
    vllm_moe = [lambda c=c: vllm_fused_moe(ops.xs[c], ops.w("bf16", c)["w13"], ops.w("bf16", c)["w2"], *ops.routes[c],
                                           **bm.act()) for c in range(bm.CALLS)]
    cases = {"sparse_attn B=1 ctx=8192 ours": sa.attention_calls(p, "ours"),
             "sparse_attn B=1 ctx=8192 vllm": sa.attention_calls(p, "vllm", sa.vllm_modules()),
             "moe T=1 m3lab": bm.provider_calls("m3lab", ops), "moe T=1 vllm-triton default": vllm_moe}
    out = []
    for name, calls in cases.items():
        try:
            res = profile_check(calls)
        except Exception as err:
            log(f"self-check {name} failed: {type(err).__name__}: {str(err)[:200]}")
            continue
        out.append({"point": name, **res})
        log(f"self-check {name}: harness {res['harness_us']:.2f} us, kernels {res['kernel_us']:.2f} us "
            f"({res['kernels_per_call']:.1f}/call), span {res['span_us']:.2f} us: "
            f"{'pass' if res['passed'] else 'FAIL'}")
    return out


def baseline_rows(rows: list) -> list:
    """The perf-gate baseline: our GEMM rows (provider triton, the table's config) at BASELINE_MS, the median
    round of each point, as graph24 rows without round or config."""
    picked = {}
    for r in rows:
        if r.op == "gemm" and r.provider == "triton" and r.m in BASELINE_MS and r.config in ("table", "per-channel"):
            picked.setdefault((r.m, r.n, r.k, r.dtype), []).append(r)
    out = []
    for key in sorted(picked):
        rs = sorted(picked[key], key=lambda r: r.us_p50)
        out.append(replace(rs[len(rs) // 2], config=None, round=None, clock=None))
    return out


def run_gate_groups(outdir: Path, until: float, log) -> None:
    """What ``m3lab gate --device cuda`` runs (every correctness gate, then the perf gates against the baseline),
    in GATE_GROUPS through :func:`m3lab.gates.runner.run_gates`, each group appended to gates_cuda.csv."""
    out = outdir / "gates_cuda.csv"
    for group in GATE_GROUPS:
        if until - time.time() < 20:
            log(f"gates: no time left for {group}")
            return
        t0 = time.time()
        try:
            df = run_gates("cuda", names=list(group), perf=group == ("perf.*",))
        except Exception as err:
            log(f"gates {group} failed to run: {type(err).__name__}: {str(err)[:300]}")
            continue
        df.to_csv(out, mode="a", header=not out.exists(), index=False)
        bad = df[~df["passed"].astype(bool)]
        log(f"gates {group}: {len(df) - len(bad)}/{len(df)} passed in {time.time() - t0:.0f}s")
        for _, r in bad.iterrows():
            log(f"  FAIL {r['gate']} {r['case']} {r['value']} {str(r['detail'])[:200]}")


def main(out: str = "out", phases: str = ",".join(PHASES), rounds: int = 3, gemm_rounds: int = 2,
         deadline_s: float = 560.0,
         tune_moe_until: float = 120.0, tune_gemm_s: float = 60.0, peers_until: float = 420.0,
         moe_ts: str = "1,32,128,512,2048,8192") -> None:
    """Run the phases in order (each bounded by its deadline in seconds from the start, the whole by
    ``deadline_s``); the log's last lines are the peer targets of this run."""
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log = session_log(outdir / "log.txt", t0)
    todo = phases.split(",")
    device = torch.device("cuda")
    ceilings = measure_ceilings(device)
    env = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "triton": triton.__version__,
           "copy_tbps": ceilings.copy_tbps, "mm_tflops": ceilings.mm_tflops, "smi_before": _smi()}
    (outdir / "env.json").write_text(json.dumps(env, indent=1))
    log(f"env {env}")
    tunes = []
    if "tune_moe" in todo:
        try:
            tunes.append(tune_moe(outdir, tuple(int(v) for v in moe_ts.split(",")), t0 + tune_moe_until, log))
        except Exception as err:
            log(f"tune_moe failed: {type(err).__name__}: {str(err)[:300]}")
    if "tune_gemm" in todo:
        try:
            tunes.append(tune_gemm_tables(outdir, tune_gemm_s, log))
        except Exception as err:
            log(f"tune_gemm failed: {type(err).__name__}: {str(err)[:300]}")
    if tunes:
        pd.concat(tunes, ignore_index=True).astype(str).to_csv(outdir / "tune.csv", index=False)
    if "selfcheck" in todo:
        try:
            env["selfcheck"] = self_check(log)
        except Exception as err:
            log(f"self-check failed: {type(err).__name__}: {str(err)[:300]}")
        (outdir / "env.json").write_text(json.dumps(env, indent=1))
    rows = run_peers(outdir, rounds, gemm_rounds, t0 + peers_until, ceilings, log) if "peers" in todo else []
    if "baseline" in todo and rows:
        base = baseline_rows(rows)
        path = baseline_path(device_name(device))
        path.unlink(missing_ok=True)
        append_rows(path, base)
        append_rows(outdir / "baseline.csv", base)
        log(f"baseline: {len(base)} rows -> {path.name}")
    if "gates" in todo:
        run_gate_groups(outdir, t0 + deadline_s, log)
    env["smi_after"] = _smi()
    (outdir / "env.json").write_text(json.dumps(env, indent=1))
    if rows:
        with pd.option_context("display.width", 220, "display.max_colwidth", 90):
            log("peer targets (this run):\n" + peer_targets(rows_frame(rows)).to_string(index=False))
    log(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    typer.run(main)
