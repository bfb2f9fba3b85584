"""One GPU session for the GEMM kernels: gates, tuning, benchmarks, baseline (``python -m m3lab.sessions.gemm``).

Writes into ``--out`` (the device tool's $OUT), each file as soon as its phase ends:
``env.json`` (versions, ceilings), ``selfcheck.csv`` (the harness self-check, :func:`m3lab.bench.gemm.self_check`),
``tune.csv``, ``gemm_configs.json`` (every tuned table, {file name: content}), ``gemm.csv`` (benchmark rows),
``baseline_<device>.csv`` (perf-gate baseline), ``resources.csv`` (the compiler's resource report of every GEMM
kernel binary the session built: registers, spills, shared memory), ``gates_cuda.csv``, ``log.txt``. Every phase is guarded, so one failure does
not lose the others.
"""
import json
import time
from pathlib import Path

import pandas as pd
import torch
import triton
import typer

from ..bench import gemm as bench
from ..bench.ceilings import measure_ceilings
from ..bench.session_log import session_log
from ..bench.table import append_rows, rows_frame
from ..bench_analysis.gemm import gemm_targets
from ..gates.inputs import blocky
from ..kernels.gemm.gemm_mx_layout import gemm_mx_fold_kernel, gemm_mx_layout_kernel
from ..kernels.gemm.gemm_persistent import gemm_persistent_kernel
from ..kernels.gemm.gemm_splitk import gemm_splitk_kernel
from ..kernels.gemm.gemm_streamk import gemm_streamk_kernel
from ..kernels.gemm.gemm_tiled import gemm_tiled_kernel
from ..kernels.gemm.gemv_mx_layout import gemv_mx_layout_kernel
from ..kernels.gemm.gemv_splitk import gemv_splitk_kernel
from ..kernels.gemm.tables import CONFIG_DIR, device_name
from ..kernels.mx import reference, triton_mx
from ..optable.kernel_shapes import model_gemm_shapes, rank_dims
from ..tune.gemm import tune_gemm
from .gate_phase import gate_phase

PHASES = ("selfcheck", "tune", "bench", "baseline", "gates")
GATE_NAMES = ("mx.*", "gemm.*", "vllm.mxfp8*")
BASELINE_MS = (1, 32, 128, 2048)
BENCH_MS = (1, 8, 32, 64, 128, 2048, 4096)   # the points of analysis.gemm_targets


def _mxfp8_mismatches(device, rows: int = 2048) -> str:
    """Up to 8 elements where Triton's MXFP8 codes differ from the reference, on ``rows`` activation rows of the
    model's hidden width: input, scale, both codes."""
    k = rank_dims().hidden
    x = blocky(rows, k, device)
    q_ref, s_ref = reference.quantize_mxfp8(x)
    q, s = triton_mx.quantize(x, "mxfp8")
    a, b = q_ref.view(torch.uint8), q.view(torch.uint8)
    idx = (a != b).nonzero()[:8].tolist()
    return "mxfp8 code mismatches (x, scale byte, ref code, triton code): " + "; ".join(
        f"{x[i, j].item():.6g} s={int(s_ref[i, j // 32])} ref=0x{int(a[i, j]):02x} tri=0x{int(b[i, j]):02x}"
        for i, j in idx) if idx else "mxfp8 codes: no mismatch in a fresh sample"


def resource_report() -> "list[dict]":
    """Registers, spills, shared memory, warps and stages of every GEMM kernel binary compiled in this process."""
    rows = []
    for kern in (gemm_splitk_kernel, gemm_streamk_kernel, gemm_tiled_kernel, gemv_splitk_kernel, gemm_persistent_kernel,
                 gemm_mx_fold_kernel, gemm_mx_layout_kernel, gemv_mx_layout_kernel):
        for caches in getattr(kern, "device_caches", {}).values():
            for key, ck in caches[0].items():
                try:
                    ck._init_handles()
                    md = ck.metadata
                    rows.append({"kernel": kern.__name__, "n_regs": ck.n_regs, "n_spills": ck.n_spills,
                                 "shared_bytes": getattr(md, "shared", None), "num_warps": md.num_warps,
                                 "num_stages": md.num_stages, "key": str(key)[:400]})
                except Exception as err:
                    rows.append({"kernel": kern.__name__, "key": f"{type(err).__name__}: {err}"[:400]})
    return rows


def _selfcheck(outdir: Path, log) -> None:
    try:
        checks = pd.DataFrame(bench.self_check(log=log))
        checks.to_csv(outdir / "selfcheck.csv", index=False)
        log(f"self-check: {int(checks['passed'].sum())}/{len(checks)} within the limit")
    except Exception as err:
        log(f"self-check failed: {type(err).__name__}: {err}")


def _tune(outdir: Path, formats: tuple, ms: str, budget_s: float, workers: int, name: str, log) -> None:
    try:
        kw = {"ms": tuple(int(v) for v in ms.split(","))} if ms else {}
        df = tune_gemm(model_gemm_shapes(), formats, budget_s=budget_s, log=log, workers=workers, **kw)
        df.to_csv(outdir / "tune.csv", index=False)
        tables = {p.name: json.loads(p.read_text()) for p in CONFIG_DIR.glob(f"*device={name}.json")}
        (outdir / "gemm_configs.json").write_text(json.dumps(tables, indent=1))
        log(f"tune: {len(tables)} tables")
    except Exception as err:
        log(f"tune phase failed: {type(err).__name__}: {err}")


def _gates(outdir: Path, device, log) -> None:
    df = gate_phase(outdir, list(GATE_NAMES), log, phase="session")
    if df is not None and not df[df["gate"] == "mx.quant_mxfp8"]["passed"].all():
        log(_mxfp8_mismatches(device))


def main(out: str = "out", phases: str = ",".join(PHASES), tune_budget_s: float = 200.0,
         deadline_s: float = 500.0, formats: str = "bf16,mxfp8,mxfp4,fp8", bench_ms: str = ",".join(map(str, BENCH_MS)),
         rep_ms: float = 20.0, workers: int = 12, gates_s: float = 120.0, tune_ms: str = "",
         tune_formats: str = "") -> None:
    """Tune (candidates compiled in parallel), gate the tuned kernels, benchmark vs cuBLAS, write the baseline.

    Later phases are cut short when ``deadline_s`` (from start) is near (the benchmark leaves ``gates_s``
    for the gates); the targets summary prints last. ``tune_ms``: the M values to tune (default: the tuner's);
    ``tune_formats``: the weight formats to tune (default: ``formats``; the others keep their committed tables).
    """
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log = session_log(outdir / "log.txt", t0)
    device = torch.device("cuda")
    name = device_name(device)
    ceilings = measure_ceilings(device)
    env = {"device": name, "torch": torch.__version__, "triton": triton.__version__,
           "copy_tbps": ceilings.copy_tbps, "mm_tflops": ceilings.mm_tflops}
    (outdir / "env.json").write_text(json.dumps(env, indent=1))
    log(f"env {env}")
    todo, fmts = phases.split(","), tuple(formats.split(","))
    left = lambda: deadline_s - (time.time() - t0)  # noqa: E731
    if "selfcheck" in todo:
        _selfcheck(outdir, log)
    if "tune" in todo:
        _tune(outdir, tuple(tune_formats.split(",")) if tune_formats else fmts, tune_ms,
              min(tune_budget_s, left() - 150), workers, name, log)
    rows = []
    if "bench" in todo and left() > 40:
        rows = bench.bench_gemm(ms=tuple(int(v) for v in bench_ms.split(",")), w_formats=fmts, ceilings=ceilings,
                                rep_ms=rep_ms, log=log, deadline=t0 + deadline_s - gates_s)
        append_rows(outdir / "gemm.csv", rows)
        log(f"bench: {len(rows)} rows")
    if "baseline" in todo and rows:
        append_rows(outdir / f"baseline_{name}.csv", [r for r in rows if r.provider == "triton" and r.m in BASELINE_MS])
    try:
        pd.DataFrame(resource_report()).to_csv(outdir / "resources.csv", index=False)
    except Exception as err:
        log(f"resource report failed: {type(err).__name__}: {err}")
    if "gates" in todo and left() > 30:
        _gates(outdir, device, log)
    if rows:
        with pd.option_context("display.width", 200, "display.max_columns", 10):
            log("targets (this run):\n" + gemm_targets(rows_frame(rows)).to_string(index=False))
    log(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    typer.run(main)
