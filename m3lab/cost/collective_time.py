"""Communication time from the measured collectives table, or the labelled uncalibrated bound.

``traces/bench/collectives.csv`` (written by :mod:`m3lab.bench.collectives` on a GPU host) holds NCCL all-reduce
times of [T, hidden] bf16 per group size and device, and point-to-point KV block bandwidth. Where the table has
the hardware's device and the op's group size, :func:`allreduce_us` interpolates it (log-log in bytes; linear in
bytes beyond the largest size, the smallest time below the smallest); otherwise there is no measurement and the
cost model keeps its bound: payload x ring factor 2 (n - 1) / n over the profile's one-way link bandwidth,
labelled uncalibrated (MI355X and groups larger than the measured one stay there).

:func:`measured_comm_us` is the cost model's hook: in the calibrated mode, all-reduce rows with a measurement take
the measured time instead of bound / efficiency (the ceiling mode stays a roofline).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from m3lab.provenance import TRACES_BENCH

TABLE = TRACES_BENCH / "collectives.csv"


def _fields(shape: str) -> dict:
    return {k: int(v) for k, v in (part.split("=") for part in str(shape).split(","))}


@lru_cache(maxsize=4)
def _load(path: str, mtime: float):
    import pandas as pd

    df = pd.read_csv(path)
    rows = []
    for r in df.itertuples():
        f = _fields(r.shape)
        rows.append({"op": r.op, "provider": r.provider, "device": str(r.device), "world": f.get("world", 0),
                     "bytes": f["T"] * f["H"] * 2 if r.op == "allreduce" else f["blocks"] * f["block_bytes"],
                     "us": float(r.us_p50), "commit": r.commit, "date": r.date})
    return pd.DataFrame(rows)


def load_table(path: str | Path | None = None):
    """The collectives table as ``[op, provider, device, world, bytes, us, commit, date]``, or None if absent."""
    p = Path(path) if path is not None else TABLE
    if not p.is_file():
        return None
    return _load(str(p), p.stat().st_mtime)


def _rows(table, op: str, world: int, hw):
    if table is None or not len(table):
        return None
    name = str(getattr(hw, "name", hw)).upper()
    sel = table[(table["op"] == op) & (table["world"] == world)
                & table["device"].str.upper().str.contains(name, regex=False)]
    return sel.sort_values("bytes") if len(sel) else None


def allreduce_us(payload_bytes: float, world: int, hw, table=None) -> float | None:
    """Measured all-reduce µs of ``payload_bytes`` over ``world`` GPUs of ``hw`` (None without a measurement)."""
    sel = _rows(table if table is not None else load_table(), "allreduce", world, hw)
    if sel is None:
        return None
    b, t = sel["bytes"].to_numpy(float), sel["us"].to_numpy(float)
    x = float(payload_bytes)
    if x >= b[-1]:
        return float(t[-1] * x / b[-1])
    if x <= b[0]:
        return float(t[0])
    return float(np.exp(np.interp(np.log(x), np.log(b), np.log(t))))


def p2p_bandwidth(hw, world: int = 2, table=None) -> float | None:
    """Measured point-to-point bandwidth (B/s) of the largest KV transfer on ``hw``, or None."""
    sel = _rows(table if table is not None else load_table(), "p2p_kv", world, hw)
    if sel is None:
        return None
    last = sel.iloc[-1]
    return float(last["bytes"] / (last["us"] * 1e-6))


def comm_label(hw, world: int = 2, table=None) -> str:
    """How communication is timed on ``hw``: the measured table (device, commit, date) or the bound."""
    sel = _rows(table if table is not None else load_table(), "allreduce", world, hw)
    if sel is None:
        return (f"uncalibrated bound: payload x 2(n-1)/n / link_bw of profile {getattr(hw, 'name', hw)} "
                "(no measured collectives table for this device and group)")
    r = sel.iloc[0]
    return f"measured NCCL all-reduce, world {world}, on {r['device']} (commit {r['commit']}, {r['date']})"


def measured_comm_us(cols, hw, t_us: np.ndarray, table=None) -> np.ndarray:
    """``t_us`` with every all-reduce row that has a measurement for its group size replaced by it."""
    kind = np.asarray(cols["kind"], dtype=object)
    rows = np.flatnonzero(kind == "allreduce")
    if not len(rows):
        return t_us
    table = table if table is not None else load_table()
    if table is None:
        return t_us
    out = np.array(t_us, dtype=float, copy=True)
    payload = np.asarray(cols["comm_payload"], dtype=float)
    group = np.asarray(cols["comm_group"], dtype=float) if "comm_group" in cols else None
    for i in rows:
        if group is None or not np.isfinite(group[i]):
            continue
        us = allreduce_us(payload[i], int(group[i]), hw, table)
        if us is not None:
            out[i] = us
    return out
