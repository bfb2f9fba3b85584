"""How much an estimate moves when each assumed number moves over its stated range: the sensitivity table.

``sensitivity(coster, figures)`` re-times every step a serving run costed (a
:class:`~m3lab.serving.step_cost.StepCoster` after :func:`m3lab.serving.estimate.estimate`) with one assumption
of :mod:`m3lab.cost.assumptions` at its ``low`` and at its ``high`` value, all others at their values. The
scheduler's steps do not depend on their times (closed-loop, fixed lengths), so the run's makespan is the
weighted sum of its step times and the throughput scales with its inverse: the table is exact for throughput.
Each costed row kept its bound, efficiency, floor and the names its efficiency and floor depend on, so a
re-timing is a vectorised recomputation (milliseconds), not a new run.

Columns: ``assumption, value, low, high, unit, tok_s_at_low, tok_s_at_high, change_low_pct, change_high_pct,
swing_pct, source``; sorted by ``swing_pct`` (the larger |change|), assumptions that touch no costed row last.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from m3lab.cost.assumptions import ASSUMPTIONS

FIGURE = "output_tokens_per_s_per_gpu"


def _flat(coster, mode: str) -> dict:
    """Every costed row of the run as flat arrays, with its step's weight; draft rows scaled by their factor."""
    parts = []
    for weight, rows in coster.uses(mode):
        for name, terms in rows.items():
            scale = coster.spec_tokens * coster.draft_cost if name == "draft" else 1.0
            parts.append((weight * scale, terms))
    if not parts:
        return {}
    cat = {c: np.concatenate([np.asarray(t[c]) for _, t in parts]) for c in parts[0][1]}
    cat["weight"] = np.concatenate([np.full(len(t["calls"]), w) for w, t in parts]) * cat["calls"]
    return cat


def _total(rows: dict, eff: np.ndarray, floor: np.ndarray) -> float:
    t = np.where(rows["inside"], 0.0, np.maximum(rows["t_bound_us"] / eff, floor))
    return float((t * rows["weight"]).sum())


def sensitivity(coster, figures: dict | None = None, mode: str = "calibrated") -> pd.DataFrame:
    """The sensitivity table of a costed run (see the module docstring). ``figures``: the run's results under
    ``mode`` (for the absolute throughput columns; without them only the changes)."""
    rows = _flat(coster, mode)
    host = coster.host_total_us(mode)
    out = []
    if not rows:
        return pd.DataFrame(columns=["assumption", "value", "low", "high", "unit", "tok_s_at_low", "tok_s_at_high",
                                     "change_low_pct", "change_high_pct", "swing_pct", "source"])
    eff, floor = rows["efficiency"].astype(float), rows["floor_us"].astype(float)
    base = _total(rows, eff, floor) + host
    terms = [set(t.split("+")) for t in rows["eff_terms"]]
    for a in ASSUMPTIONS.values():
        changes = []
        for v in (a.low, a.high):
            if a.kind == "floor":
                f = np.where(rows["floor_term"] == a.name, v, floor)
                total = _total(rows, eff, f)
            else:
                hit = np.array([a.name in t for t in terms])
                total = _total(rows, np.where(hit, eff * v / a.value, eff), floor)
            changes.append(base / (total + host) - 1.0)
        tok = figures.get(FIGURE) if figures else None
        out.append({"assumption": a.name, "value": a.value, "low": a.low, "high": a.high, "unit": a.unit,
                    "tok_s_at_low": None if tok is None else tok * (1 + changes[0]),
                    "tok_s_at_high": None if tok is None else tok * (1 + changes[1]),
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
