"""One GPU session for the GEMM issue: gates, tuning, benchmarks, baseline (``python -m m3lab.bench.gpu_session``).

Writes into ``--out`` (the device tool's $OUT), each file as soon as its phase ends:
``env.json`` (versions, ceilings), ``gates_cuda.csv``, ``tune.csv``, ``gemm_configs.json`` (every tuned
table, {file name: content}), ``gemm.csv`` (benchmark rows), ``baseline_<device>.csv`` (perf-gate
baseline), ``log.txt``. Every phase is guarded, so one failure does not lose the others.
"""
import json
import time
from pathlib import Path

import torch

PHASES = ("gates", "tune", "bench", "baseline")
BASELINE_MS = (1, 32, 128, 2048)


def _logger(out: Path):
    t0 = time.time()
    f = (out / "log.txt").open("a")

    def log(msg: str) -> None:
        line = f"[{time.time() - t0:6.1f}s] {msg}"
        print(line, flush=True)
        f.write(line + "\n")
        f.flush()
    return log


def main(out: str = "out", phases: str = ",".join(PHASES), tune_budget_s: float = 200.0,
         deadline_s: float = 500.0, formats: str = "bf16,mxfp8,mxfp4") -> None:
    """Run the phases in order; later phases are skipped when the deadline is near."""
    import triton

    from ..gates.runner import run_gates
    from ..kernels.gemm.tables import CONFIG_DIR, device_name
    from . import gemm as bench
    from .ceilings import measure_ceilings
    from .table import append_rows

    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    log, t0 = _logger(outdir), time.time()
    device = torch.device("cuda")
    name = device_name(device)
    ceilings = measure_ceilings(device)
    env = {"device": name, "torch": torch.__version__, "triton": triton.__version__,
           "copy_tbps": ceilings.copy_tbps, "mm_tflops": ceilings.mm_tflops}
    (outdir / "env.json").write_text(json.dumps(env, indent=1))
    log(f"env {env}")
    todo = phases.split(",")
    fmts = tuple(formats.split(","))
    left = lambda: deadline_s - (time.time() - t0)  # noqa: E731

    if "gates" in todo:
        try:
            df = run_gates("cuda", perf=False)
            df.insert(0, "phase", "before_tune")
            df.to_csv(outdir / "gates_cuda.csv", index=False)
            log(f"gates: {int(df['passed'].sum())}/{len(df)} passed")
            for _, r in df[~df["passed"]].iterrows():
                log(f"  FAIL {r['gate']} {r['case']} {r['value']} {r['detail']}")
        except Exception as err:
            log(f"gates phase failed: {type(err).__name__}: {err}")

    if "tune" in todo and left() > 200:
        from ..tune.gemm import default_shapes, tune_gemm
        try:
            df = tune_gemm(default_shapes(), fmts, budget_s=min(tune_budget_s, left() - 180), log=log)
            df.to_csv(outdir / "tune.csv", index=False)
            tables = {p.name: json.loads(p.read_text()) for p in CONFIG_DIR.glob(f"*device={name}.json")}
            (outdir / "gemm_configs.json").write_text(json.dumps(tables, indent=1))
            log(f"tune: {len(tables)} tables")
        except Exception as err:
            log(f"tune phase failed: {type(err).__name__}: {err}")

    rows = []
    if "bench" in todo and left() > 60:
        ms = bench.DEFAULT_MS
        rows = bench.bench_gemm(ms=ms, w_formats=fmts, ceilings=ceilings, rep_ms=50, log=log,
                                deadline=t0 + deadline_s - 45)
        append_rows(outdir / "gemm.csv", rows)
        log(f"bench: {len(rows)} rows")

    if "baseline" in todo and rows:
        base = [r for r in rows if r.provider == "triton" and int(r.shape.split(",")[0][2:]) in BASELINE_MS]
        path = append_rows(outdir / f"baseline_{name}.csv", base)
        if left() > 40:
            df = run_gates("cuda", names=["perf.*"], perf=True, baseline=path)
            df.insert(0, "phase", "perf_recheck")
            df.to_csv(outdir / "gates_cuda.csv", mode="a", header=not (outdir / "gates_cuda.csv").exists(),
                      index=False)
            log(f"perf recheck: {int(df['passed'].sum())}/{len(df)} within threshold; "
                f"median regression {df['value'].median():+.3f}")
    if "gates" in todo and "tune" in todo and left() > 45:
        try:
            df = run_gates("cuda", names=["gemm.*"], perf=False)
            df.insert(0, "phase", "after_tune")
            df.to_csv(outdir / "gates_cuda.csv", mode="a", header=False, index=False)
            log(f"gates after tuning: {int(df['passed'].sum())}/{len(df)} passed")
        except Exception as err:
            log(f"gates after tuning failed: {type(err).__name__}: {err}")
    log(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    import typer
    typer.run(main)
