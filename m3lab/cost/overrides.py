"""Per-op cost overrides: the rows of chosen vLLM ops on a chosen path, costed otherwise than their source says.

The cost model times every OpTable row by the source of the kernel vLLM runs for it (:mod:`m3lab.cost.sources`).
An :class:`OpOverride` changes that for the rows of the vLLM ops ``ops`` (the resolver's op names,
:data:`m3lab.optable.dispatch.OP_DECISION` of the row's OpTable op) whose path id starts with ``path``, in one of two
ways:

- **a time factor**: ``ratio(rows)`` gives, per row, how many times longer the row takes (at ``scale`` 1); the row's
  efficiency is divided by ``1 + scale * (ratio - 1)``, so ``scale`` 0 is the source's own time and the launch floor
  stays the source's;
- **a replacement**: ``path_as`` costs the rows by that path's source instead (its efficiency, floor and named
  assumptions, which the sensitivity table then moves).

Overrides act on the calibrated cost only: the ceiling is the roofline of the rows' own bytes and FLOPs, which an
override does not change. :func:`m3lab.cost.model.cost_columns` applies them (``op_overrides``); a
:class:`~m3lab.serving.step_cost.StepCoster` carries them (and their :func:`overrides_key` in its cost key). The
ladder's representation of the state before a fix that vLLM has as code (:mod:`m3lab.ladder.before`) is the user.

Rows an override touched carry ``override`` (its name) and ``override_ratio`` (the ratio at scale 1; 1 for a
replacement) so that a scale can be moved afterwards by exact re-timing (:func:`rescaled_efficiency`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from m3lab.cost.sources import Rows
from m3lab.optable.dispatch import OP_DECISION
from m3lab.spec.record_key import stable_key

OVERRIDE_COLUMNS = ("override", "override_ratio")


@dataclass(frozen=True)
class OpOverride:
    """One override (see the module docstring). ``where(rows) -> bool mask`` narrows the rows further (None: all);
    ``kinds`` limits it to OpTable kinds (empty: every kind); ``label`` says what it represents and its source;
    ``data`` names the version of the data ``ratio`` reads (part of the cache key)."""

    name: str
    ops: tuple[str, ...]
    path: str
    ratio: Callable | None = None
    path_as: str = ""
    where: Callable | None = None
    kinds: tuple[str, ...] = ()
    scale: float = 1.0
    label: str = ""
    data: str = ""

    def key(self) -> tuple:
        """Everything that decides the override's costs (the callables by their qualified names)."""
        fn = [getattr(f, "__qualname__", repr(f)) if f is not None else None for f in (self.ratio, self.where)]
        return (self.name, tuple(self.ops), self.path, self.path_as, tuple(self.kinds), float(self.scale),
                self.data, *fn)

    def factor(self, ratio: np.ndarray, scale: float | None = None) -> np.ndarray:
        """The time factor of rows with ``ratio`` at ``scale`` (default: the override's)."""
        s = self.scale if scale is None else scale
        return 1.0 + s * (np.asarray(ratio, float) - 1.0)


def overrides_key(op_overrides: Sequence[OpOverride]) -> str:
    """Stable key of a set of overrides ("" for none): cost caches include it."""
    return stable_key([o.key() for o in op_overrides]) if op_overrides else ""


def _vllm_op(cols, n: int) -> np.ndarray:
    return np.array([OP_DECISION.get(o, o) for o in np.asarray(cols["op"], dtype=object)], dtype=object)


def select(cols, op_overrides: Sequence[OpOverride], hw=None, cal=None) -> list[tuple[OpOverride, np.ndarray]]:
    """(override, row indices) of every override that touches a row of ``cols``; a row takes the first override
    that selects it. ``where`` gets the candidate rows as :class:`m3lab.cost.sources.Rows` (on ``hw``, ``cal``)."""
    if not op_overrides:
        return []
    n = len(cols["op"])
    paths = np.asarray(cols["path"], dtype=object) if "path" in cols else np.full(n, None, dtype=object)
    kinds = np.asarray(cols["kind"], dtype=object)
    vop = _vllm_op(cols, n)
    free = np.ones(n, bool)
    out = []
    for ov in op_overrides:
        hit = free & np.isin(vop, list(ov.ops)) & np.array([isinstance(p, str) and p.startswith(ov.path)
                                                            for p in paths])
        if ov.kinds:
            hit &= np.isin(kinds, list(ov.kinds))
        if ov.where is not None and hit.any():
            idx = np.flatnonzero(hit)
            hit[idx] = np.asarray(ov.where(Rows(cols, idx, hw, cal, None)), bool)
        if hit.any():
            out.append((ov, np.flatnonzero(hit)))
            free &= ~hit
    return out


def replaced_paths(cols, chosen: list[tuple[OpOverride, np.ndarray]]):
    """``cols`` with ``path`` replaced on the rows of overrides that have ``path_as`` (a shallow copy; ``cols``
    itself when none does)."""
    if not any(ov.path_as for ov, _ in chosen):
        return cols
    out = dict(cols) if hasattr(cols, "keys") else {c: cols[c].to_numpy() for c in cols.columns}
    path = np.asarray(out["path"], dtype=object).copy()
    for ov, idx in chosen:
        if ov.path_as:
            path[idx] = ov.path_as
    out["path"] = path
    return out


def apply(terms: dict, cols, chosen: list[tuple[OpOverride, np.ndarray]], hw, cal) -> dict:
    """``terms`` (:func:`m3lab.cost.sources.cost_terms` of the rows, replaced paths included) with each override's
    time factor on its rows' efficiency, its label in ``source`` and the :data:`OVERRIDE_COLUMNS`."""
    n = len(terms["efficiency"])
    eff, src = terms["efficiency"].copy(), terms["source"].copy()
    name, ratio = np.full(n, "", dtype=object), np.ones(n)
    for ov, idx in chosen:
        r = np.ones(len(idx)) if ov.ratio is None else np.asarray(ov.ratio(Rows(cols, idx, hw, cal, None)), float)
        eff[idx] = eff[idx] / np.maximum(ov.factor(r), 1e-12)
        name[idx], ratio[idx] = ov.name, r
        src[idx] = [f"{s}; {ov.label}" if ov.label else s for s in src[idx]]
    return {**terms, "efficiency": eff, "source": src, "override": name, "override_ratio": ratio}


def rescaled_efficiency(rows: dict, name: str, old: float, new: float) -> np.ndarray:
    """The ``efficiency`` of costed ``rows`` (with :data:`OVERRIDE_COLUMNS`) had override ``name`` run at scale
    ``new`` instead of ``old``: exact, since its factor divides the efficiency."""
    eff = np.asarray(rows["efficiency"], float)
    hit = np.asarray(rows["override"], dtype=object) == name
    r = np.asarray(rows["override_ratio"], float)
    return np.where(hit, eff * (1.0 + old * (r - 1.0)) / np.maximum(1.0 + new * (r - 1.0), 1e-12), eff)
