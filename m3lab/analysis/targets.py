"""Verdicts of benchmark targets that never pass on points that were not measured.

A target names its points in its title ("bf16 decode M in {1,8,32,64,128}"). :func:`missing` says which of
them a table lacks; :func:`add_verdicts` turns ``measured``, ``threshold``, ``op`` and ``missing`` into
``status`` — ``pass``, ``fail``, ``incomplete`` (a named point is missing, or nothing was measured) or
``info`` (a reported figure without a threshold) — and ``passed`` (True, False, or None when incomplete/info).
"""
from __future__ import annotations

import math
from typing import Iterable

import pandas as pd


def _point(v) -> str:
    return str(int(v)) if isinstance(v, (int, float)) and float(v).is_integer() else str(v)


def missing(present: Iterable, named: Iterable, name: str = "M") -> str:
    """``"M = 8, 64 not measured"`` for the ``named`` points absent from ``present``; ``""`` when none is."""
    gone = sorted(set(named) - {v for v in present if v == v}, key=lambda v: (str(type(v)), v))
    return f"{name} = {', '.join(_point(v) for v in gone)} not measured" if gone else ""


def status_of(ok: bool, gap: str = "") -> str:
    """``incomplete`` when a named point is missing, else ``pass``/``fail`` by ``ok``."""
    return "incomplete" if gap else ("pass" if ok else "fail")


def verdict(measured: float, threshold: float, op: str = ">=", gap: str = "") -> str:
    """One target's status (see the module docstring); ``op`` is ``>=``, ``>`` or ``info``."""
    if op == "info":
        return "info"
    if measured is None or (isinstance(measured, float) and math.isnan(measured)):
        return "incomplete"
    return status_of(measured >= threshold if op == ">=" else measured > threshold, gap)


def add_verdicts(targets: pd.DataFrame) -> pd.DataFrame:
    """``targets`` with ``status`` and ``passed`` from its ``measured``, ``threshold``, ``op`` (default ``>=``)
    and ``missing`` (default none) columns."""
    out = targets.copy()
    ops = out["op"] if "op" in out else pd.Series(">=", index=out.index)
    gaps = out["missing"].fillna("") if "missing" in out else pd.Series("", index=out.index)
    out["status"] = [verdict(m, t, o, g) for m, t, o, g in zip(out["measured"], out["threshold"], ops, gaps)]
    out["passed"] = pd.Series([{"pass": True, "fail": False}.get(s) for s in out["status"]], index=out.index,
                              dtype=object)
    return out
