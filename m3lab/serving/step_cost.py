"""Engine-step times for the serving estimates: OpTable -> cost, memoised on a coarse step signature.

A serving run has thousands of steps whose shapes barely differ (a decode batch one token longer
each step). :class:`StepCoster` maps each :class:`~m3lab.workload.step.EngineStep` to a
representative step — decode contexts replaced by their mean, context and chunk lengths rounded to
``QUANTUM`` relative steps; in steps with a prefill chunk the decode count and chunks under a tenth
of the step's tokens to ``MIXED_QUANTUM`` — builds that step's OpTable once, costs it once under each mode asked for (the ceiling, the
calibration), and reuses both. Layers of the same structure (attention kind, own top-k, MLP kind)
have identical rows, so each is costed once with ``calls`` = its layer count.

The OpTable is built with the deployment's :class:`~m3lab.optable.dispatch.Dispatch` (what vLLM runs for it,
:func:`m3lab.serving.dispatch.dispatch_for`), so every row is costed by the kernel vLLM runs
(:mod:`m3lab.cost.sources`). Each costed step keeps its rows' bound, efficiency, floor and assumption names, so
:func:`m3lab.cost.sensitivity.sensitivity` can re-time the whole run under another value of each assumption.

Speculative decoding (``spec_tokens`` = K > 0): every decode row verifies K + 1 tokens, and a draft
model runs K steps costing ``draft_cost`` × the target's plain decode step each.

Per-op overrides: ``op_overrides`` (:class:`m3lab.cost.overrides.OpOverride`, default none) re-cost the rows of
chosen (vLLM op, path) pairs in the calibrated mode (a time factor or another path's source); their
:func:`~m3lab.cost.overrides.overrides_key` is part of :attr:`StepCoster.cost_key`, and the costed rows keep the
override's name and ratio for the sensitivity table.

Host time: ``host_time`` (a callable ``EngineStep -> µs``, default none) adds the host work of each step that the
GPU waits for to the calibrated step time, reported as op ``host_time`` (kind ``host``); the ceiling stays the
GPU roofline.

:func:`cost_step` costs one step of a deployment (the costed OpTable, one row per op per layer).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from m3lab.arith import finite
from m3lab.cost.model import cost_columns, cost_optable
from m3lab.cost.overrides import OVERRIDE_COLUMNS, overrides_key
from m3lab.errors import M3LabError
from m3lab.optable import build_optable
from m3lab.optable.builder import class_columns
from m3lab.serving.dispatch import dispatch_for
from m3lab.spec.quant import load_quant
from m3lab.spec.record_key import stable_key
from m3lab.workload.step import EngineStep

QUANTUM = 1.03            # relative rounding of context / chunk lengths in the memo key (3%)
MIXED_QUANTUM = 1.15      # relative rounding of the decode count, and of small chunks, in prefill steps
AGG_COLUMNS = ("t_us", "t_bound_us", "flops", "bytes_compute", "bytes_weight", "bytes_kv", "bytes_comm")
TERM_COLUMNS = ("t_bound_us", "efficiency", "floor_us", "inside", "eff_terms", "floor_term")  # kept for sensitivity
OPTABLE_CACHE_SIZE = 2048  # compact OpTables kept per process (a few kB each)
_OPTABLE_CACHE: dict = {}


def _bucket(x: float, quantum: float = QUANTUM) -> int:
    return int(round(math.log(max(float(x), 1.0)) / math.log(quantum)))


def _unbucket(b: int, quantum: float = QUANTUM) -> int:
    return max(1, int(round(quantum ** b)))


@dataclass
class StepCoster:
    """Time (µs) of an engine step of ``deployment`` under the ceiling and (optionally) a calibration; see the
    module docstring. ``host_time``: ``EngineStep -> µs`` of host work per step (None: no host term);
    ``op_overrides``: per-op overrides of the calibrated cost (:mod:`m3lab.cost.overrides`)."""

    deployment: object
    calibration: object = None          # a Calibration or None (ceiling only)
    routing: object = None
    host_time: Callable[[EngineStep], float] | None = None
    op_overrides: tuple = ()
    _memo: dict = field(default_factory=dict, repr=False)
    _uses: Counter = field(default_factory=Counter, repr=False)
    _host: dict = field(default_factory=dict, repr=False)
    _host_steps: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        d = self.deployment
        self.model, self.plan, self.quant, self.hw = d.model, d.plan, d.quant, d.hardware
        self.spec_tokens, self.draft_cost = d.serving.spec_tokens, d.acceptance.draft_cost
        self.dispatch = dispatch_for(d)
        if self.dispatch is not None:
            self.dispatch.check_serves()
            self.plan = self.dispatch.plan(d.plan)   # local widths as vLLM runs the deployment
        # every field of model, plan and quant (KV / index dtypes, index sharing, ...) and every decision of
        # what vLLM runs for them keys the shared OpTables
        self._spec_key = stable_key(self.model, self.plan, load_quant(self.quant),
                                    self.dispatch.key() if self.dispatch is not None else None)
        self.op_overrides = tuple(self.op_overrides)

    @property
    def cost_key(self) -> tuple:
        """What decides every step's cost besides the step: the OpTables' key, the hardware, the calibration (name
        and label) and the per-op overrides (:func:`m3lab.cost.overrides.overrides_key`). A cache of costs keys on it."""
        cal = self.calibration
        return (self._spec_key, self.hw.name, None if cal is None else (cal.name, cal.label),
                overrides_key(self.op_overrides))

    # ---- keys and representative steps -------------------------------------------------------------
    def key(self, step: EngineStep) -> tuple:
        dec = step.is_decode
        n_dec = int(dec.sum())
        dec_ctx = _bucket(step.context_lens[dec].mean()) if n_dec else 0
        total = step.num_tokens
        pre = tuple(sorted((self._chunk_tokens(int(n), total), _bucket(c))
                           for n, c in zip(step.new_tokens[~dec], step.context_lens[~dec])))
        if pre and n_dec:  # prefill chunks dominate the step: the decode count matters less
            n_dec = _unbucket(_bucket(n_dec, MIXED_QUANTUM), MIXED_QUANTUM)
        return n_dec, dec_ctx, pre

    @staticmethod
    def _chunk_tokens(n: int, total: int) -> int:
        """Rounded chunk length: to QUANTUM, or to MIXED_QUANTUM when under a tenth of the step's tokens."""
        q = MIXED_QUANTUM if n * 10 < total else QUANTUM
        return _unbucket(_bucket(n, q), q)

    def representative(self, key: tuple, spec: bool) -> EngineStep:
        n_dec, dec_ctx, pre = key
        k = self.spec_tokens if spec else 0
        new = [1 + k] * n_dec + [n for n, _ in pre]
        ctx = [_unbucket(dec_ctx) + k] * n_dec + [max(_unbucket(c), n) for n, c in pre]
        return EngineStep(np.asarray(new, np.int64), np.asarray(ctx, np.int64),
                          decode_mask=np.asarray([True] * n_dec + [False] * len(pre), bool))

    # ---- costing -------------------------------------------------------------------------------------
    def compact_optable(self, step: EngineStep) -> pd.DataFrame:
        """The step's OpTable reduced to one layer per structure class, with ``calls`` = layers in the class
        (shared in this process between estimates whose model, plan and quantisation have equal fields)."""
        return pd.DataFrame(self._compact_columns(step))

    def _compact_columns(self, step: EngineStep) -> dict:
        """:meth:`compact_optable` as a dict of numpy columns (what the cost model consumes), memoised."""
        shared = isinstance(self.routing, (str, type(None)))
        key = (self._spec_key, self.routing, step.signature(), step.num_decodes) if shared else None
        if key is not None and key in _OPTABLE_CACHE:
            return _OPTABLE_CACHE[key]
        cols = class_columns(self.model, self.plan, self.quant, step, self.routing, self.dispatch)
        if key is not None:
            if len(_OPTABLE_CACHE) >= OPTABLE_CACHE_SIZE:
                _OPTABLE_CACHE.pop(next(iter(_OPTABLE_CACHE)))
            _OPTABLE_CACHE[key] = cols
        return cols

    def _per_op(self, cols: dict, cal) -> tuple[float, dict, dict, dict]:
        """(step µs, {(op, kind): [t_us, t_bound_us, flops, bytes..., calls]}, {(op, kind): bound}, row terms) of a
        compact OpTable's columns."""
        res = cost_columns(cols, self.hw, cal, op_overrides=self.op_overrides if cal is not None else ())
        calls = cols["calls"].astype(float)
        mat = np.column_stack([res["t_us"], res["t_bound_us"]]
                              + [finite(cols[c]) for c in AGG_COLUMNS[2:]]) * calls[:, None]
        mat = np.column_stack([mat, calls])
        labels = list(zip(cols["op"], cols["kind"]))
        per_op: dict = {}
        bounds: dict = {}
        for i, lab in enumerate(labels):
            per_op[lab] = per_op[lab] + mat[i] if lab in per_op else mat[i].copy()
            if lab not in bounds or mat[i, 0] > bounds[lab][0]:
                bounds[lab] = (mat[i, 0], res["bound"][i])
        terms = {c: res[c] for c in TERM_COLUMNS + OVERRIDE_COLUMNS if c in res} | {"calls": calls}
        return float(mat[:, 0].sum()), per_op, {lab: b for lab, (_, b) in bounds.items()}, terms

    def _cost_entry(self, key: tuple, mode: str) -> tuple:
        """(step µs, per-op totals, bounds, row terms) of the step ``key`` under ``mode``."""
        cal = None if mode == "ceiling" else self.calibration
        spec = self.spec_tokens > 0 and key[0] > 0
        t, per_op, bounds, terms = self._per_op(self._compact_columns(self.representative(key, spec)), cal)
        rows = {"step": terms}
        if spec:
            plain = self._compact_columns(self.representative(key, False))
            t_plain, _, _, plain_terms = self._per_op(plain, cal)
            draft = self.spec_tokens * self.draft_cost * t_plain
            rows["draft"] = plain_terms
            vec = np.zeros(len(AGG_COLUMNS) + 1)
            vec[0], vec[-1] = draft, self.spec_tokens
            per_op[("draft_model", "draft")] = vec
            bounds[("draft_model", "draft")] = "memory"
            t += draft
        return t, per_op, bounds, rows

    @property
    def modes(self) -> tuple[str, ...]:
        """The cost modes this coster has: ``ceiling``, and ``calibrated`` with a calibration."""
        return ("ceiling",) + (("calibrated",) if self.calibration is not None else ())

    def entry(self, step: EngineStep, mode: str | None = None) -> dict:
        """{mode: (step µs, per-op totals, bounds, row terms)} of ``step``'s key, costed under ``mode`` (None: every
        mode of :attr:`modes`) on first use; a mode not costed yet for the key is absent."""
        return self._entry(self.key(step), mode)

    def _entry(self, key: tuple, mode: str | None) -> dict:
        e = self._memo.setdefault(key, {})
        for m in (self.modes if mode is None else (mode,)):
            if m not in e and m in self.modes:
                e[m] = self._cost_entry(key, m)
        return e

    def time_us(self, step: EngineStep, mode: str = "ceiling", weight: float = 1.0) -> float:
        """Step time in µs under ``mode`` (+ the host time in the calibrated mode); ``weight`` (steps it stands
        for) accumulates the op totals."""
        key = self.key(step)
        e = self._entry(key, mode)
        self._uses[(key, mode)] += weight
        host = self._host_us(step, mode, weight)
        return e[mode][0] + host

    def _host_us(self, step: EngineStep, mode: str, weight: float) -> float:
        if self.host_time is None or mode != "calibrated":
            return 0.0
        us = float(self.host_time(step))
        if not math.isfinite(us) or us < 0:
            raise M3LabError(f"host_time returned {us!r} µs for a step", field="host_time",
                             hint="return a finite, non-negative number of microseconds")
        self._host[mode] = self._host.get(mode, 0.0) + weight * us
        self._host_steps[mode] = self._host_steps.get(mode, 0.0) + weight
        return us

    def host_total_us(self, mode: str) -> float:
        """Host µs added over every step timed so far under ``mode`` (0 without a host_time callable)."""
        return float(self._host.get(mode, 0.0))

    def uses(self, mode: str) -> list[tuple[float, dict]]:
        """(weight, row terms) of every step timed so far under ``mode`` (for the sensitivity table)."""
        return [(w, self._memo[key][m][3]) for (key, m), w in self._uses.items() if m == mode]

    def costed_rows(self, mode: str) -> dict:
        """{step key: row terms} of every distinct step costed under ``mode`` (for the sensitivity table: the
        device µs of a key is its rows' times, the draft rows' scaled by ``spec_tokens * draft_cost``)."""
        return {key: e[mode][3] for key, e in self._memo.items() if mode in e}

    @property
    def distinct_steps(self) -> int:
        return len(self._memo)

    def op_totals(self, mode: str) -> pd.DataFrame:
        """Per-op totals over every step timed so far under ``mode``: ``[op, kind, calls, t_us, bytes..., bound]``."""
        acc: dict = {}
        bound: dict = {}   # (op, kind) -> (time under that bound, bound): the bound where it spends most time
        for (key, m), w in self._uses.items():
            if m != mode:
                continue
            _, per_op, bounds, _ = self._memo[key][mode]
            for lab, vec in per_op.items():
                acc[lab] = acc[lab] + w * vec if lab in acc else w * vec
                t = w * vec[0]
                if lab not in bound or t > bound[lab][0]:
                    bound[lab] = (t, bounds.get(lab, "memory"))
        if self._host.get(mode):
            vec = np.zeros(len(AGG_COLUMNS) + 1)
            vec[0], vec[-1] = self._host[mode], self._host_steps[mode]
            acc[("host_time", "host")] = vec
            bound[("host_time", "host")] = (vec[0], "host")
        cols = list(AGG_COLUMNS) + ["calls"]
        out = pd.DataFrame([[op, kind, *vec] for (op, kind), vec in acc.items()], columns=["op", "kind", *cols])
        out["bound"] = [bound[(o, k)][1] for o, k in zip(out["op"], out["kind"])]
        return out


def cost_step(deployment, step, *, calibration="default", routing=None) -> pd.DataFrame:
    """Build the OpTable of one engine ``step`` of ``deployment`` with the kernels vLLM runs for it (its
    Dispatch, where the resolver knows the model) and cost it on its hardware: one row per op per layer."""
    d = deployment
    return cost_optable(build_optable(d.model, d.plan, d.quant, step, routing, dispatch_for(d)), d.hardware,
                        calibration)
