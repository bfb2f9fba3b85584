"""How much an estimate moves when each assumed number moves over its stated range: the sensitivity table.

``sensitivity(est)`` re-times a serving run (a :class:`~m3lab.serving.estimate.ServingEstimate`) with one
assumption of :mod:`m3lab.cost.assumptions` at its ``low`` and at its ``high`` value, all others at their values.
The scheduler's steps do not depend on their times (closed loop, fixed lengths), so the run under another value
is the same schedule with other device µs per step: each distinct step the coster costed
(:meth:`~m3lab.serving.step_cost.StepCoster.costed_rows`) kept its rows' bound, efficiency, floor and the names
its efficiency and floor depend on, so its µs under the moved value is a vectorised recomputation, and
:meth:`~m3lab.serving.estimate.ServingEstimate.retimed_rate` runs those µs through the same timeline (host time,
async overlap) to the run's output tokens/s per GPU. The table is therefore exactly what a re-run would report.

Columns: ``assumption, value, low, high, unit, tok_s_at_low, tok_s_at_high, change_low_pct, change_high_pct,
swing_pct, source``; sorted by ``swing_pct`` (the larger |change|), assumptions that touch no costed row last.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from m3lab.cost.assumptions import ASSUMPTIONS

FIGURE = "output_tokens_per_s_per_gpu"
COLUMNS = ["assumption", "value", "low", "high", "unit", "tok_s_at_low", "tok_s_at_high", "change_low_pct",
           "change_high_pct", "swing_pct", "source"]


def _flat(coster, mode: str) -> tuple[list, dict]:
    """(the costed step keys, every costed row of them as flat arrays with ``key`` (its step's index in the
    keys) and ``weight`` (calls, draft rows scaled by their factor))."""
    keys, parts = [], []
    for i, (key, rows) in enumerate(coster.costed_rows(mode).items()):
        keys.append(key)
        for name, terms in rows.items():
            scale = coster.spec_tokens * coster.draft_cost if name == "draft" else 1.0
            parts.append((i, scale, terms))
    if not parts:
        return keys, {}
    cat = {c: np.concatenate([np.asarray(t[c]) for _, _, t in parts]) for c in parts[0][2]}
    cat["key"] = np.concatenate([np.full(len(t["calls"]), i) for i, _, t in parts])
    cat["weight"] = np.concatenate([np.full(len(t["calls"]), w) for _, w, t in parts]) * cat["calls"]
    return keys, cat


def _per_key(rows: dict, eff: np.ndarray, floor: np.ndarray, n: int) -> np.ndarray:
    """Device µs of each costed step key [n] with these efficiencies and floors."""
    t = np.where(rows["inside"], 0.0, np.maximum(rows["t_bound_us"] / eff, floor))
    return np.bincount(rows["key"], weights=t * rows["weight"], minlength=n)


def _moved(rows: dict, a, v: float, terms: list) -> tuple[np.ndarray, np.ndarray]:
    """(efficiency, floor) of the costed ``rows`` with assumption ``a`` at ``v`` (``terms``: each row's eff terms)."""
    eff, floor = rows["efficiency"].astype(float), rows["floor_us"].astype(float)
    if a.kind == "floor":
        return eff, np.where(rows["floor_term"] == a.name, v, floor)
    hit = np.array([a.name in t for t in terms])
    return np.where(hit, eff * v / a.value, eff), floor


def retimed(est, adjust, mode: str = "calibrated") -> float:
    """Output tok/s/GPU of ``est`` re-timed exactly (the same schedule, timeline and metrics) with its costed rows'
    efficiency and floor replaced by ``adjust(rows) -> (efficiency, floor)`` (``rows``: every costed row as flat
    arrays: the coster's row terms, ``key`` and ``weight``); ``adjust(rows, name, value)`` forms: :func:`at_value`."""
    keys, rows = _flat(est.coster, mode)
    tok = est.results[mode][FIGURE]
    if not rows:
        return tok
    eff, floor = adjust(rows)
    base = _per_key(rows, rows["efficiency"].astype(float), rows["floor_us"].astype(float), len(keys))
    us = _per_key(rows, np.asarray(eff, float), np.asarray(floor, float), len(keys))
    if np.array_equal(us, base):
        return tok
    index = {k: i for i, k in enumerate(keys)}
    return est.retimed_rate(lambda k: us[index[k]], mode)


def at_value(est, name: str, v: float, mode: str = "calibrated") -> float:
    """Output tok/s/GPU of ``est`` with the assumption ``name`` (:mod:`m3lab.cost.assumptions`) at ``v``."""
    a = ASSUMPTIONS[name]
    return retimed(est, lambda rows: _moved(rows, a, v, [set(t.split("+")) for t in rows["eff_terms"]]), mode)


def sensitivity(est, mode: str = "calibrated") -> pd.DataFrame:
    """The sensitivity table of a serving estimate ``est`` under ``mode`` (see the module docstring)."""
    keys, rows = _flat(est.coster, mode)
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    tok = est.results[mode][FIGURE]
    index = {k: i for i, k in enumerate(keys)}
    base = _per_key(rows, rows["efficiency"].astype(float), rows["floor_us"].astype(float), len(keys))
    terms = [set(t.split("+")) for t in rows["eff_terms"]]
    out = []
    for a in ASSUMPTIONS.values():
        at = []
        for v in (a.low, a.high):
            us = _per_key(rows, *_moved(rows, a, v, terms), len(keys))
            same = np.array_equal(us, base)   # the assumption touches no costed row: the estimate itself
            at.append(tok if same else est.retimed_rate(lambda k, us=us: us[index[k]], mode))
        changes = [x / tok - 1.0 for x in at]
        out.append({"assumption": a.name, "value": a.value, "low": a.low, "high": a.high, "unit": a.unit,
                    "tok_s_at_low": at[0], "tok_s_at_high": at[1],
                    "change_low_pct": 100 * changes[0], "change_high_pct": 100 * changes[1],
                    "swing_pct": 100 * max(abs(changes[0]), abs(changes[1])), "source": a.source})
    return pd.DataFrame(out).sort_values("swing_pct", ascending=False, kind="stable").reset_index(drop=True)


def format_sensitivity(table: pd.DataFrame, top: int = 8) -> str:
    """The table's top rows as plain text at most 80 columns wide."""
    head = f"{'assumption':<34} {'value':>6} {'range':>13} {'at low':>9} {'at high':>9}"
    lines = ["sensitivity of output tok/s/GPU to each assumption (m3lab.cost.assumptions)", head, "-" * len(head)]
    for r in table.head(top).itertuples():
        rng = f"{r.low:g}..{r.high:g}"
        lines.append(f"{r.assumption[:34]:<34} {r.value:>6g} {rng:>13} {r.change_low_pct:+8.1f}% "
                     f"{r.change_high_pct:+8.1f}%")
    return "\n".join(lines)
