"""Bring a real vLLM deployment's measurements into a run folder, where notebooks read them as artifacts.

    m3lab vllm collect runs/<run> --bench vllm-bench --profile /tmp/vllm-profile --preset mxfp8-tp4-optimised

What lands in ``<run>/``:

- ``vllm/bench/`` and ``vllm/profile/``: copies of the files given (the run folder stays self-contained);
- artifact ``vllm/vllm_bench`` (parquet): one row per ``vllm bench serve --save-result`` file, with per-GPU
  throughputs and latency statistics (:func:`m3lab.serving.vllm_bench.bench_table`); the GPU count is taken
  from ``--gpus``, else from the file's ``gpus`` metadata (``m3lab vllm plan`` writes it), else from the
  deployment;
- artifact ``vllm/vllm_measured`` (JSON): the headline numbers of the first result (so a sweep's comparison
  table and later notebooks see them as scalars), labelled measured; :func:`beside_estimate` puts them beside
  an estimate of the same deployment;
- artifact ``vllm/vllm_kernels`` (parquet): time per kernel in each profiler trace (Kineto JSON from vLLM's
  torch profiler, rocprofv3 CSV/JSON), read by :func:`m3lab.traces.load_trace`;
- artifact ``vllm/vllm_fastpaths`` (parquet) and ``vllm/vllm_fastpaths_verdict`` (JSON): when a deployment is
  named, the fast paths the resolver expects for it (:func:`m3lab.vllm.fastpath_expectations.expectations_for`)
  verified against the traces (:func:`m3lab.traces.verify.verify`).

:func:`measured` reads them back in a notebook.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from m3lab import artifacts
from m3lab.errors import M3LabError
from m3lab.serving.vllm_bench import read_bench_result

STEP = "vllm"
TRACE_SUFFIXES = (".json", ".json.gz", ".csv", ".log", ".txt", ".jsonl", ".jsonl.gz")


def _trace_files(paths: Sequence[str | Path]) -> list[Path]:
    """Every trace file under the given files or folders (vLLM writes one ``*.pt.trace.json.gz`` per rank)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise M3LabError(f"--profile {str(p)!r} holds no trace file", field="--profile",
                                 hint="give the torch_profiler_dir of --profiler-config, or the trace files")
            out.extend(found)
        else:
            raise M3LabError(f"--profile {str(p)!r} does not exist", field="--profile", hint="check the path")
    return out


def _bench_files(paths: Sequence[str | Path]) -> list[Path]:
    """The given result files, a folder standing for every ``*.json`` in it (``vllm bench --result-dir``)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.json"))
            if not found:
                raise M3LabError(f"--bench {str(p)!r} holds no .json result", field="--bench",
                                 hint="give the --result-dir of vllm bench serve, or result files")
            out.extend(found)
        else:
            out.append(p)  # read_bench_result names a missing file
    return out


def _bench_gpus(path: Path, gpus: int | None, deployment_gpus: int | None) -> int:
    if gpus is not None:
        return gpus
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = {}
    meta = raw.get("gpus") if isinstance(raw, dict) else None
    if meta is not None:
        try:
            return int(meta)
        except (TypeError, ValueError):
            raise M3LabError(f"{path}: metadata gpus={meta!r} is not an integer", field="gpus") from None
    if deployment_gpus is not None:
        return deployment_gpus
    raise M3LabError(f"{path}: no GPU count (the file has no 'gpus' metadata)", field="--gpus",
                     hint="pass --gpus N or --preset NAME")


def _copy(files: Sequence[Path], dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for i, f in enumerate(files):
        target = dest / f.name
        if target.exists() and target.resolve() != f.resolve():
            target = dest / f"{i}-{f.name}"
        if target.resolve() != f.resolve():
            shutil.copy2(f, target)
        out.append(target)
    return out


def kernel_table(traces: Sequence[Path]):
    """Time per kernel in each trace: ``file, kernel`` (short name), ``calls, total_us, share`` (of that trace's
    kernel time), ``name`` (full name)."""
    import pandas as pd

    from m3lab.traces import load_trace, short_kernel_name  # local: pulls in pandas
    from m3lab.traces.table import trace_format  # local: pulls in pandas

    frames = []
    for path in traces:
        ev = load_trace(path)
        if trace_format(ev) in ("m3lab.dispatch", "aiter-log") or "dur_us" not in ev.columns:
            continue
        kernels = ev[ev["kind"] == "kernel"] if "kind" in ev.columns else ev
        if kernels.empty:
            continue
        g = kernels.groupby("name")["dur_us"].agg(calls="count", total_us="sum").reset_index()
        g["share"] = g["total_us"] / g["total_us"].sum()
        g.insert(0, "file", path.name)
        g.insert(1, "kernel", [short_kernel_name(n) for n in g["name"]])
        frames.append(g.sort_values("total_us", ascending=False))
    cols = ["file", "kernel", "calls", "total_us", "share", "name"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def collect(run_dir: str | Path, bench: Sequence[str | Path] = (), profile: Sequence[str | Path] = (), *,
            deployment: Any = None, gpus: int | None = None) -> dict[str, Any]:
    """Copy ``bench`` results and ``profile`` traces into ``run_dir`` and save the artifacts described above.

    ``deployment`` (a :class:`~m3lab.spec.serving.Deployment`) enables the fast-path verification and supplies
    the GPU count. Every input is read before anything is written. Returns a JSON-ready summary.
    """
    run = Path(run_dir)
    if run.exists() and not run.is_dir():
        raise M3LabError(f"run folder {str(run)!r} is a file", field="RUN_DIR")
    if not bench and not profile:
        raise M3LabError("nothing to collect", field="--bench", hint="give --bench FILE and/or --profile DIR")
    if gpus is not None and gpus < 1:
        raise M3LabError(f"--gpus must be positive, got {gpus}", field="--gpus")
    bench_files = _bench_files(bench)
    dep_gpus = deployment.plan.tp * deployment.plan.dp if deployment is not None else None
    results = [(read_bench_result(b), _bench_gpus(b, gpus, dep_gpus)) for b in bench_files]  # validates each
    if deployment is not None:
        _check_identity(deployment, bench_files, [res for res, _ in results])
    traces = _trace_files(profile)
    expectations = None
    if deployment is not None and traces:
        from m3lab.traces.expectations import Expectations  # local: pulls in pandas
        from m3lab.vllm.fastpath_expectations import expectations_for  # local: pulls in pandas
        expectations = Expectations.from_dict(expectations_for(deployment), f"deployment {deployment.name}")
    kernels = kernel_table(traces)  # reads every trace (bad files fail here, before anything is written)

    run.mkdir(parents=True, exist_ok=True)
    copied_bench = _copy(bench_files, run / "vllm" / "bench")
    copied_traces = _copy(traces, run / "vllm" / "profile")
    summary: dict[str, Any] = {"run_dir": str(run), "deployment": getattr(deployment, "name", None),
                               "bench": [str(p) for p in copied_bench], "profile": [str(p) for p in copied_traces],
                               "artifacts": []}

    def save(name: str, obj: Any) -> None:
        summary["artifacts"].append(os.fspath(_save(run, name, obj)))

    if results:
        import pandas as pd
        rows = _bench_rows(results, copied_bench, run, summary["deployment"])
        save("vllm_bench", pd.DataFrame(rows))
        first = rows[0]
        save("vllm_measured", _headline(first))
        summary["headline"] = {"model_id": first["model_id"], "gpus": first["gpus"],
                               "device": deployment.hardware.name if deployment is not None else None,
                               "output_tokens_per_s_per_gpu": first["output_tokens_per_s_per_gpu"],
                               "ttft_s": first["median_ttft_s"], "tpot_ms": first["mean_tpot_ms"],
                               "label": "measured (vllm bench serve)"}
    if traces:
        save("vllm_kernels", kernels)
        summary["kernels"] = int(len(kernels))
    if expectations is not None:
        table, verdict = _verified(expectations, copied_traces)
        save("vllm_fastpaths", table)
        save("vllm_fastpaths_verdict", verdict)
        summary["fastpaths"] = verdict
    return summary


def _bench_rows(results, copied: Sequence[Path], run: Path, deployment: str | None) -> list[dict]:
    """One row per bench result: its per-GPU figures, the copy it came from (relative to ``run``), labelled
    measured."""
    rows = []
    for (res, n), copy in zip(results, copied):
        row = res.per_gpu(n)
        row.update(source=str(copy.relative_to(run)), deployment=deployment, label="measured")
        rows.append(row)
    return rows


def _headline(first: dict) -> dict:
    """The first result's numbers as scalars (NaN dropped), with the keys
    :func:`m3lab.serving.estimate.compare_with_measured` reads: median TTFT, mean TPOT."""
    headline = {k: v for k, v in first.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
    headline.update(ttft_s=first["median_ttft_s"], tpot_ms=first["mean_tpot_ms"], label="measured (vllm bench serve)")
    return {k: v for k, v in headline.items() if not (isinstance(v, float) and math.isnan(v))}


def _verified(expectations, traces: Sequence[Path]) -> tuple[Any, dict]:
    """(per-expectation results, verdict with counts per status) of ``expectations`` over ``traces``."""
    from m3lab.traces.verify import verify  # local: pulls in pandas
    v = verify(expectations, *traces)
    table = v.results.copy()
    counts = table["status"].value_counts().to_dict()
    verdict = {"ok": v.ok, "expectations": v.expectations, "traces": [Path(t).name for t in v.traces],
               **{f"n_{k}": int(c) for k, c in counts.items()}}
    return table, verdict


def _save(run: Path, name: str, obj: Any) -> os.PathLike:
    """``artifacts.save`` into ``run`` (not the current run of the environment) under step ``vllm``."""
    before = os.environ.get(artifacts.RUN_DIR_ENV)
    os.environ[artifacts.RUN_DIR_ENV] = str(run)
    try:
        return artifacts.save(name, obj, step=STEP)
    finally:
        if before is None:
            os.environ.pop(artifacts.RUN_DIR_ENV, None)
        else:
            os.environ[artifacts.RUN_DIR_ENV] = before


def measured(run: str | Path | None = None) -> dict[str, Any]:
    """In a notebook: what ``m3lab vllm collect`` brought into ``run`` (default: the current run):
    ``{"bench": DataFrame | None, "measured": dict | None, "kernels": DataFrame | None,
    "fastpaths": DataFrame | None, "verdict": dict | None}``."""
    out: dict[str, Any] = {}
    for key, name in (("bench", "vllm_bench"), ("measured", "vllm_measured"), ("kernels", "vllm_kernels"),
                      ("fastpaths", "vllm_fastpaths"), ("verdict", "vllm_fastpaths_verdict")):
        try:
            out[key] = artifacts.load(name, step=STEP, run=run)
        except M3LabError:
            out[key] = None
    return out


def beside_estimate(est: Any, run: str | Path | None = None):
    """The estimate ``est`` (:func:`m3lab.serving.estimate.estimate` of the same deployment and workload) with the
    collected measurement beside it (:func:`m3lab.serving.estimate.compare_with_measured`)."""
    from m3lab.serving.estimate import compare_with_measured  # local: pulls in pandas

    got = measured(run)["measured"]
    if got is None:
        raise M3LabError("no vLLM measurement in this run", field="run",
                         hint="m3lab vllm collect RUN_DIR --bench FILE first")
    off = deployment_mismatches(est.config, got)
    if off:
        raise M3LabError(f"the collected measurement is not of the estimated deployment: {'; '.join(off)}",
                         field="run", hint="estimate the deployment that was measured (model, GPUs, concurrency, "
                                           "input and output lengths)")
    return compare_with_measured(est, got)


LENGTH_TOLERANCE = 0.1   # random-dataset lengths: mean within 10% of the requested ISL/OSL


def _check_identity(deployment: Any, files: Sequence[Path], results: Sequence[Any]) -> None:
    """One-line M3LabError when a bench result is not of ``deployment`` (:func:`bench_mismatches`)."""
    for path, res in zip(files, results):
        off = bench_mismatches(deployment, res)
        if off:
            raise M3LabError(f"--bench {path}: not a benchmark of {deployment.name or 'the deployment'}: "
                             f"{'; '.join(off)}", field="--bench",
                             hint="pass the --preset that was measured (and its --set), or no --preset")


def bench_mismatches(deployment: Any, result: Any) -> list[str]:
    """What differs between the deployment named at collection and a bench result
    (:class:`~m3lab.serving.vllm_bench.BenchResult`): the model, and, when the deployment record carries a
    workload, the max concurrency and mean input / output lengths; [] when they agree."""
    wl = deployment.workload
    config = {"model": deployment.model.name, "concurrency": wl.concurrency, "isl": wl.isl, "osl": wl.osl}
    got = {"model_id": result.model_id, "max_concurrency": result.max_concurrency,
           "mean_input_len": result.mean_input_len, "mean_output_len": result.mean_output_len}
    return deployment_mismatches(config, got)


def deployment_mismatches(config: dict, got: dict) -> list[str]:
    """What differs between an estimate's ``config`` and a collected measurement (fields the bench result file
    records: model id, GPUs, max concurrency, mean input and output lengths); [] when they agree."""
    out = []
    model_id = str(got.get("model_id") or "")
    base = str(config.get("model", "")).lower()
    for suffix in ("-mxfp8", "-mxfp4", "-fp8", "-nvfp4"):
        base = base.removesuffix(suffix)
    if model_id and not model_id.rstrip("/").split("/")[-1].lower().startswith(base):
        out.append(f"model {model_id} vs {config.get('model')}")
    for key, mine in (("gpus", "gpus"), ("max_concurrency", "concurrency")):
        if got.get(key) is not None and config.get(mine) is not None and int(got[key]) != int(config[mine]):
            out.append(f"{mine} {got[key]} vs {config[mine]}")
    for key, mine in (("mean_input_len", "isl"), ("mean_output_len", "osl")):
        if got.get(key) and config.get(mine) and abs(got[key] / config[mine] - 1) > LENGTH_TOLERANCE:
            out.append(f"{mine} {got[key]:.0f} measured vs {config[mine]}")
    return out
