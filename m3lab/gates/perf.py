"""Performance gates: re-measure the points of a baseline table and fail on a regression.

The baseline is a benchmark table (the long format of m3lab.bench.table) under traces/gates/,
named ``baseline_<device>.csv``; each op registers a timer that re-measures one of its rows.
A row fails when the new median exceeds the baseline's by more than ``threshold`` (default 10%) in two
measurements one after the other (a point over the threshold is timed again, and the faster time counts:
at the H200's 700 W power cap the clocks of compute-bound points move by up to 25% with the card's recent load).
"""
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from ..bench.table import REPO_ROOT, read_table
from ..bench.timing import Timing

BASELINE_DIR = REPO_ROOT / "traces" / "gates"
DEFAULT_THRESHOLD = 0.10

# op -> (row of the baseline table -> fresh Timing); registered by the op's gate module
PERF_TIMERS: dict[str, Callable[[pd.Series], Timing]] = {}


def register_timer(op: str, timer: Callable[[pd.Series], Timing]) -> None:
    PERF_TIMERS[op] = timer


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
