"""The long-format benchmark table shared by every kernel: one CSV per op under traces/bench/.

Columns (one row per op × provider × shape × dtype measurement):
``op, provider, shape, dtype, us_p20, us_p50, us_p80, tflops, tbps, frac_ceiling, ceiling,
device, commit, date, m, n, k, ceiling_value, harness, config, round, clock`` — ``shape`` is a readable label (``"M=..,N=..,K=.."``),
``m``/``n``/``k`` the GEMM dimensions as numbers (empty for ops without them), ``tflops``/``tbps`` are
achieved rates at the median, ``frac_ceiling`` the fraction of the ceiling named by ``ceiling``
(``copy_tbps`` or ``mm_tflops``: whichever bounds the op) whose value is ``ceiling_value``; ``commit`` is
passed in by the benchmark command; ``harness`` names the timing method (``graph24``: see
m3lab.bench.timing; empty on rows timed before the column existed); ``config``, ``round`` and ``clock`` are
filled by the peers run (m3lab.bench.peers: a provider's configuration, the repeat round, the SM clock and power
seen while it was timed). Rows written before the numeric columns existed (the label carried
the numbers: ``"copy_tbps=4.21"``) are read into the same columns by :func:`read_table`.
"""
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pandas as pd

from m3lab.provenance import REPO_ROOT, TRACES_BENCH, append_csv, today  # noqa: F401  (re-exported to bench)
from m3lab.provenance import commit as commit_id  # noqa: F401


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
    m: int | None = None
    n: int | None = None
    k: int | None = None
    ceiling_value: float | None = None
    harness: str | None = None       # timing method (m3lab.bench.timing.HARNESS); empty on older rows
    config: str | None = None        # the provider's launch configuration, where it has several (peers table)
    round: int | None = None         # repeat round of an interleaved peers run (m3lab.bench.peers)
    clock: str | None = None         # SM clock / power while timed, e.g. "sm 1755-1980 MHz, 700/700 W, power-cap"


COLUMNS = tuple(f.name for f in fields(BenchRow))
NUMERIC_SHAPE = ("m", "n", "k", "ceiling_value")
TEXT_OPTIONAL = ("harness", "config", "clock")
OPTIONAL = NUMERIC_SHAPE + TEXT_OPTIONAL + ("round",)
REQUIRED = tuple(c for c in COLUMNS if c not in OPTIONAL)   # rows of older tables have only these


def append_rows(path: Path | str, rows: list[BenchRow]) -> Path:
    """Append rows to a CSV table (header written when the file is new; a table with older columns is
    rewritten once with the current header, its rows read by :func:`read_table`)."""
    path = Path(path)
    if path.exists() and path.stat().st_size and path.open().readline().strip() != ",".join(COLUMNS):
        read_table(path)[list(COLUMNS)].to_csv(path, index=False, float_format="%.6g")
    return append_csv(path, [asdict(row) for row in rows], COLUMNS)


def _label_fields(df: pd.DataFrame) -> pd.DataFrame:
    """Ops without GEMM dimensions (MoE, attention) name theirs in the ``shape`` label (``"T=8,H=6144,..."``):
    each integer ``KEY=value`` becomes a column ``KEY`` (M, N and K come from m, n, k)."""
    parts = df["shape"].astype(str).str.extractall(r"(?P<key>[A-Za-z_]+)=(?P<val>\d+)(?:,|$)")
    if len(parts):
        wide = parts.reset_index().pivot_table(index="level_0", columns="key", values="val", aggfunc="first")
        for key in wide.columns:
            if key not in ("M", "N", "K") and key not in df.columns:
                df[key] = pd.to_numeric(wide[key].reindex(df.index))
    return df


def _legacy(df: pd.DataFrame) -> pd.DataFrame:
    """Fill m/n/k and ceiling_value of rows written before those columns existed, from the text labels."""
    for col in NUMERIC_SHAPE:
        if col not in df.columns:
            df[col] = float("nan")
    for col in TEXT_OPTIONAL:
        df[col] = df[col].astype(object).where(df[col].notna(), "").astype(str) if col in df.columns else ""
    if "round" not in df.columns:
        df["round"] = float("nan")
    old = df["m"].isna()
    if old.any():
        dims = df.loc[old, "shape"].astype(str).str.extract(r"M=(\d+),N=(\d+),K=(\d+)").astype(float)
        df.loc[old, ["m", "n", "k"]] = dims.to_numpy()
    text = df["ceiling"].astype(str).str.extract(r"^(\w+)=([\d.eE+-]+)$")
    old = text[0].notna()
    if old.any():
        df.loc[old, "ceiling_value"] = text.loc[old, 1].astype(float)
        df.loc[old, "ceiling"] = text.loc[old, 0]
    return df


def _with_dims(df: pd.DataFrame) -> pd.DataFrame:
    for col in ("m", "n", "k"):
        df[col] = df[col].astype("Int64")
        df[col.upper()] = df[col]
    return df


def rows_frame(rows: list[BenchRow]) -> pd.DataFrame:
    """Rows just measured -> the DataFrame :func:`read_table` would give after appending them."""
    return _with_dims(pd.DataFrame([asdict(r) for r in rows], columns=list(COLUMNS)))


def read_table(path: Path | str) -> pd.DataFrame:
    """A benchmark CSV -> DataFrame with the columns of :data:`COLUMNS` (older rows filled by their labels),
    plus ``M``, ``N``, ``K`` (nullable integers) for the analysers and the integer fields of non-GEMM labels."""
    df = pd.read_csv(path)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing} (expected {list(COLUMNS)})")
    return _with_dims(_label_fields(_legacy(df)))
