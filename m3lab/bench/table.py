"""The long-format benchmark table shared by every kernel: one CSV per op under traces/bench/.

Columns (one row per op × provider × shape × dtype measurement):
``op, provider, shape, dtype, us_p20, us_p50, us_p80, tflops, tbps, frac_ceiling, ceiling,
device, commit, date`` — ``shape`` is ``"M=..,N=..,K=.."``-style text, ``tflops``/``tbps`` are
achieved rates at the median, ``frac_ceiling`` the fraction of ``ceiling`` (``"copy_tbps=4.25"``
or ``"mm_tflops=760"``: whichever bounds the op), ``commit`` is passed in by the benchmark command.
"""
import csv
import datetime as _dt
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACES_BENCH = REPO_ROOT / "traces" / "bench"


@dataclass
class BenchRow:
    op: str
    provider: str
    shape: str
    dtype: str
    us_p20: float
    us_p50: float
    us_p80: float
    tflops: float
    tbps: float
    frac_ceiling: float
    ceiling: str
    device: str
    commit: str
    date: str


COLUMNS = tuple(f.name for f in fields(BenchRow))


def commit_id() -> str:
    """The commit the benchmark command was given ($GIT_COMMIT), else 'unknown' (the GPU box has no .git)."""
    return os.environ.get("GIT_COMMIT", "unknown") or "unknown"


def today() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")


def append_rows(path: Path | str, rows: list[BenchRow]) -> Path:
    """Append rows to a CSV table (header written when the file is new)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in asdict(row).items()})
    return path


def read_table(path: Path | str) -> pd.DataFrame:
    """A benchmark CSV -> DataFrame with the standard columns (shape parsed into M, N, K when present)."""
    df = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing} (expected {list(COLUMNS)})")
    parts = df["shape"].astype(str).str.extractall(r"(?P<key>[A-Za-z]+)=(?P<val>\d+)")
    if len(parts):
        wide = parts.reset_index().pivot_table(index="level_0", columns="key", values="val", aggfunc="first")
        for key in wide.columns:
            df[key] = pd.to_numeric(wide[key].reindex(df.index))
    return df

