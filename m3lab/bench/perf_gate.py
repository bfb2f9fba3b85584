"""Performance gates: re-measure the points of a baseline table and fail on a regression.

A perf gate consumes benchmarks, so it stands beside the runners, above the correctness gates (m3lab.gates):
:func:`run_gates` runs the correctness gates (:func:`m3lab.gates.runner.run_gates`), then the perf gates.
The baseline is a benchmark table (the long format of m3lab.bench.table) under traces/gates/,
named ``baseline_<device>.csv``; :data:`PERF_TIMERS` maps each op to its runner's timer, which re-measures one
of its rows.
A row fails when the new median exceeds the baseline's by more than ``threshold`` (default 10%) in two
measurements one after the other (a point over the threshold is timed again, and the faster time counts:
at the H200's 700 W power cap the clocks of compute-bound points move by up to 25% with the card's recent load).
"""
import fnmatch
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from ..errors import M3LabError
from ..gates import runner
from ..kernels.gemm.tables import device_name
from .table import read_table
from .timing import Timing

BASELINE_DIR = runner.TRACES_GATES
DEFAULT_THRESHOLD = 0.10


def _gemm_timer(row: pd.Series) -> Timing:
    """The GEMM runner's re-measurement of one baseline row (:func:`m3lab.bench.gemm.time_row`)."""
    from .gemm import time_row   # the kernels load only when a GPU timer runs: CPU gates switch the interpreter on first
    return time_row(row)


# op -> (row of the baseline table -> fresh Timing), one timer per runner that has a baseline
PERF_TIMERS: dict[str, Callable[[pd.Series], Timing]] = {"gemm": _gemm_timer}


def baseline_path(device_name: str, directory: Path = BASELINE_DIR) -> Path:
    return Path(directory) / f"baseline_{device_name}.csv"


def perf_results(baseline: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD,
                 timers: dict | None = None) -> list[dict]:
    """One result per baseline row: value = new p50 / baseline p50 - 1 (the regression)."""
    timers = PERF_TIMERS if timers is None else timers
    out = []
    for _, row in baseline.iterrows():
        name = f"{row['provider']}:{row['shape']}:{row['dtype']}"
        timer = timers.get(row["op"])
        res = {"gate": f"perf.{row['op']}", "case": name, "kind": "perf", "dtype": row["dtype"],
               "metric": "regression", "limit": threshold}
        if timer is None:
            out.append({**res, "value": float("nan"), "passed": False, "detail": f"no timer for op {row['op']!r}"})
            continue
        try:
            times = [timer(row).us_p50]
            if times[0] / float(row["us_p50"]) - 1.0 > threshold:     # a regression must show twice
                times.append(timer(row).us_p50)
        except Exception as err:
            out.append({**res, "value": float("nan"), "passed": False, "detail": f"{type(err).__name__}: {err}"})
            continue
        new = min(times)
        reg = new / float(row["us_p50"]) - 1.0
        again = f" (re-measured: {', '.join(f'{t:.2f}' for t in times)} us)" if len(times) > 1 else ""
        out.append({**res, "value": reg, "passed": reg <= threshold,
                    "detail": f"{new:.2f} us vs baseline {float(row['us_p50']):.2f} us{again}"})
    return out


def load_baseline(path: Path) -> pd.DataFrame:
    return read_table(path)


def run_gates(device: str = "cpu", names: list[str] | None = None, perf: bool = True,
              baseline: Path | str | None = None, threshold: float | None = None, progress=None) -> pd.DataFrame:
    """Every correctness gate on ``device`` (:func:`m3lab.gates.runner.run_gates`), then, on a GPU with a baseline,
    the perf gates -> one results DataFrame. ``names``: fnmatch patterns (``perf.<op>`` selects perf rows);
    ``progress(done, total, gate_name)``: called before each correctness gate."""
    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    if threshold < 0:
        raise M3LabError(f"threshold: {threshold} must be >= 0 (a fraction, 0.10 = 10%)", field="threshold")
    path = Path(baseline) if baseline else None
    if perf and path is not None and not path.exists():
        raise M3LabError(f"baseline: {path} does not exist", field="baseline")
    df = runner.run_gates(device, names=names, progress=progress)
    if not perf or device != "cuda":
        return df
    path = path or baseline_path(device_name(runner.prepare(device)))
    if not path.exists():
        return df
    table = load_baseline(path)
    if names:
        table = table[[any(fnmatch.fnmatch(f"perf.{op}", p) for p in names) for op in table["op"]]]
    rows = pd.DataFrame(perf_results(table, threshold), columns=[c for c in runner.RESULT_COLUMNS if c != "device"])
    rows.insert(3, "device", df["device"].iloc[0] if len(df) else device_name(runner.prepare(device)))
    return pd.concat([df, rows], ignore_index=True)
