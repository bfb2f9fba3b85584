"""The optimisation ladder: a deployment's fixes switched on one at a time, in the write-up's order, each step
estimated (:func:`m3lab.ladder.evaluate.evaluate`) beside the write-up's own figure for that fix where the
configuration it states is this step's (:func:`m3lab.published.fix_gain_for`), else its configuration beside a null.

:func:`plan` finds the fixes between two deployments: every switch fix whose settings the target has and the start
has not (``aiter``, the optimised deployment's ``VLLM_ROCM_USE_AITER=1``, among them: its own rung, before the fixes
that assume it, and never a write-up figure beside it), and every code fix (vLLM 0.33.0 has no switch for it) whose
code path runs. The ladder starts from the start deployment with those code fixes in m3lab's representation of their
state before (:mod:`m3lab.ladder.before`: per-op overrides of the cost on the rows that run the fix's code); once they
are on it is the start deployment, and once every switch is on it is the target (:func:`run` checks the keys).
Figures are **projected** (hardware profile and calibration named in ``label``).

:func:`sensitivity` is where the sensitivity is computed: the cost model's table for the first and last rungs, and
for each code fix its step's gain with the assumption of its state before at the low and high end of its range
(exact re-timing of the rungs either side of the step).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from m3lab.cost.overrides import rescaled_efficiency
from m3lab.cost.sensitivity import at_value, retimed
from m3lab.errors import M3LabError
from m3lab.ladder.before import ASSUMPTIONS as BEFORE_ASSUMPTIONS
from m3lab.ladder.before import BEFORE as REPRESENTED
from m3lab.ladder.evaluate import Rung, evaluate
from m3lab.ladder.fixes import FIXES, NOT_NAMED, Fix, applied, get_fix
from m3lab.published import fix_gain_for
from m3lab.serving.dispatch import dispatch_for
from m3lab.spec.settings import changes

START = "start"
BEFORE = {f.name: f.before for f in FIXES if f.before}
# code fix -> (resolver op on a sparse layer, prefix of the path that runs the fix's code)
CODE_PATHS = {"decode_gemm_launcher": ("qkv_proj", "mxfp8_dot_scaled"),
              "moe_program_order": ("experts", "triton_mxfp8"),
              "request_level_index_batching": ("indexer", "triton_amd"),
              "multi_token_verification": ("attention", "aiter_sparse_pa")}


def compare_config(d) -> dict:
    """The fields a published per-fix figure is compared on (``m3lab.published.FIX_CONFIG_FIELDS``)."""
    wl = d.workload
    return {"model": d.model.name, "hardware": d.hardware.name, "quant": d.quant.name, "tp": d.plan.tp,
            "ep": d.plan.ep, "isl": wl.isl, "osl": wl.osl, "concurrency": wl.concurrency,
            "index_topk_freq": d.index_sharing_freq, "spec_method": d.serving.spec_method or "none"}


def code_fix_runs(fix: Fix, d) -> str | None:
    """None when vLLM runs ``fix``'s code path for ``d`` at decode (its Dispatch, :func:`m3lab.serving.dispatch.
    dispatch_for`: the resolver's answer, cached), else why not."""
    if fix.spec_only and not d.serving.spec_tokens:
        return "no speculative decoding"
    op, prefix = CODE_PATHS[fix.name]
    disp = dispatch_for(d)
    got = disp.choice(op, "sparse", "decode") if disp is not None else None
    if got is None:
        return f"{d.model.name} has no sparse-layer {op}"
    return None if got.path.startswith(prefix) else f"{op} runs {got.path}, not the fix's {prefix}* path"


def plan(start, target) -> list[Fix]:
    """The fixes between ``start`` and ``target`` in the write-up's order (see the module docstring); raises
    M3LabError naming what differs that is no fix."""
    out, d = [], start
    for fix in FIXES:
        if fix.is_switch:
            if not applied(fix, d) and applied(fix, target):
                out.append(fix)
                d = _switch_on(d, fix, acceptance_of(target))
        elif code_fix_runs(fix, start if not fix.spec_only else target) is None:
            out.append(fix)
    rest = changes(d, target)
    if rest or d.key() != target.key():
        raise M3LabError(f"{target.name or 'the target'} differs from {start.name or 'the start'} in more than the "
                         f"write-up's fixes: {', '.join(f'{k}={v}' for k, v in rest.items()) or 'other fields'}",
                         field="to", hint="give both the same settings apart from the fixes (--set applies to both)")
    return out


def plan_from(start, names: Sequence[str] | None = None) -> list[Fix]:
    """The fixes to climb from ``start``: ``names`` in the write-up's order, or (None) every fix ``start`` lacks —
    the switch fixes it has not applied and the code fixes whose code it runs (speculative ones only where it
    speculates; switching speculation on needs an acceptance length, so it is never chosen by default)."""
    if names is not None:
        wanted = {get_fix(n).name for n in names}
        return [f for f in FIXES if f.name in wanted]
    out = []
    for fix in FIXES:
        if fix.is_switch and not fix.spec_only and not applied(fix, start):
            out.append(fix)
        elif not fix.is_switch and code_fix_runs(fix, start) is None:
            out.append(fix)
    return out


@dataclass
class Step:
    """One rung: the fix just switched on (``start`` for the first), its estimate and the write-up's figure."""

    fix: str
    title: str
    rung: Rung | None             # None: a fix m3lab cannot represent (not estimated)
    gain_pct: float | None
    tpot_change_pct: float | None
    writeup: dict | None          # m3lab.published.fix_gain_for (None for the start and for a switch it names not)

    @property
    def named(self) -> bool:
        """False for a rung that is no fix the write-up names (``aiter``)."""
        return self.fix == START or get_fix(self.fix).named

    def to_dict(self) -> dict:
        f = self.rung.figures if self.rung is not None else {}
        w = self.writeup or {}
        note = None if self.named else NOT_NAMED
        if self.rung is None:
            note = "not estimated: " + get_fix(self.fix).before
        return {"fix": self.fix, "title": self.title, "deployment": self.rung.deployment.name if self.rung else None,
                "undone": list(self.rung.undone) if self.rung else None, "named": self.named,
                **{k: f.get(k) for k in ("output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms")},
                "gain_pct": self.gain_pct, "tpot_change_pct": self.tpot_change_pct,
                "writeup_gain_pct": w.get("value_pct"), "writeup_metric": w.get("metric"),
                "writeup_text": w.get("text"), "writeup_configuration": w.get("configuration"),
                "writeup_not_stated": w.get("not_stated"), "note": note}


@dataclass
class Ladder:
    """The steps from ``start`` to ``target``; ``label`` names the estimate's hardware profile and calibration."""

    start: object
    target: object
    steps: list[Step] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The estimate's label (hardware profile and calibration) of the last estimated step."""
        return [s.rung for s in self.steps if s.rung is not None][-1].figures["label"]

    @property
    def before(self) -> str:
        """How the first step represents the code fixes it starts without ("" when none)."""
        first = self.steps[0].rung
        undone = first.undone if first is not None else ()
        return "; ".join(f"{u} in its state before: {BEFORE[u]}" for u in undone)

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([s.to_dict() for s in self.steps])

    def to_dict(self) -> dict:
        return {"from": self.start.name, "to": self.target.name, "kind": self.steps[0].rung.figures["kind"],
                "label": self.label, "before": self.before, "steps": [s.to_dict() for s in self.steps]}


def _change(new: float, old: float) -> float:
    return (new / old - 1.0) * 100.0


def acceptance_of(d) -> dict:
    """The speculative-decoding acceptance of ``d`` as settings (what a fix that switches speculation on needs)."""
    a = d.acceptance
    return {"accept_len": a.accept_len, "accept_dataset": a.accept_dataset, "draft_cost": a.draft_cost}


def _switch_on(d, fix: Fix, acceptance: dict | None):
    """``d`` with ``fix``'s settings, plus ``acceptance`` when the fix switches speculative decoding on."""
    extra = acceptance if fix.spec_only and acceptance and not d.serving.spec_tokens else {}
    return d.with_settings({**fix.settings, **extra})


def climb(start, fixes: Sequence[Fix], *, calibration="default", scales: Mapping[str, float] | None = None,
          progress: Callable[[str], None] | None = None, acceptance: dict | None = None) -> Ladder:
    """Switch ``fixes`` on one at a time from ``start``: the code fixes among them start in m3lab's representation of
    their state before (``scales``: as for :func:`~m3lab.ladder.evaluate.evaluate`). ``acceptance``
    (:func:`acceptance_of`) goes with a fix that switches speculation on. ``progress`` gets one line per step before it
    is estimated."""
    undone = tuple(f.name for f in fixes if not f.is_switch and f.name in REPRESENTED)
    lad, d, prev = Ladder(start, start), start, None
    names = [START] + [f.name for f in fixes]
    for i, name in enumerate(names):
        fix = None if name == START else get_fix(name)
        if progress:
            progress(f"[{i + 1}/{len(names)}] {name}")
        if fix is not None and fix.is_switch:
            d = _switch_on(d, fix, acceptance)
        elif fix is not None:
            undone = tuple(u for u in undone if u != fix.name)
        writeup = fix_gain_for(fix.name, compare_config(d)) if fix is not None and fix.named else None
        if fix is not None and not fix.is_switch and fix.name not in REPRESENTED:
            lad.steps.append(Step(fix.name, fix.title, None, None, None, writeup))
            continue
        rung = evaluate(d, undone, calibration=calibration, scales=scales)
        gain = _change(rung.throughput, prev.throughput) if prev else None
        tpot = _change(rung.figures["tpot_ms"], prev.figures["tpot_ms"]) if prev else None
        title = fix.title if fix else start.name + (" with the code fixes in their state before" if undone else "")
        lad.steps.append(Step(name, title, rung, gain, tpot, writeup))
        prev = rung
    lad.target = d
    return lad


def run(start, target, *, calibration="default", scales: Mapping[str, float] | None = None,
        progress: Callable[[str], None] | None = None) -> Ladder:
    """The ladder from ``start`` to ``target`` (the fixes of :func:`plan`); it ends at ``target`` (checked)."""
    lad = climb(start, plan(start, target), calibration=calibration, scales=scales, progress=progress,
                acceptance=acceptance_of(target))
    if lad.target.key() != target.key():
        raise AssertionError(f"the ladder ends at {lad.target.name}, not {target.name}")
    lad.target = target
    return lad


def toggled(start, fixes: Sequence[Fix], on, *, calibration="default") -> Rung:
    """The estimate of ``start`` with the fixes named in ``on`` switched on and the other ``fixes`` off: switch
    fixes applied, code fixes not in ``on`` in m3lab's representation of their state before (what a toggle per fix
    shows)."""
    d = start
    for fix in fixes:
        if fix.is_switch and fix.name in on:
            d = d.with_settings(fix.settings)
    undone = tuple(f.name for f in fixes if not f.is_switch and f.name in REPRESENTED and f.name not in on)
    return evaluate(d, undone, calibration=calibration)


SENSITIVITY_COLUMNS = ("rung", "assumption", "value", "low", "high", "unit", "tok_s", "change_low_pct",
                       "change_high_pct", "swing_pct", "gain_pct", "gain_low_pct", "gain_high_pct", "source")


def _tok_at(rung: Rung, fix: str, v: float) -> float:
    """Output tok/s/GPU of ``rung`` with the assumption of ``fix``'s state before at ``v`` (exact re-timing)."""
    a = BEFORE_ASSUMPTIONS[fix]
    if a.kind != "scale":                        # one of the cost model's own assumptions
        return at_value(rung.estimate, a.name, v)
    if fix not in rung.undone:                   # the fix is on: its assumption moves nothing
        return rung.throughput
    old = dict(rung.scales).get(fix, a.value)
    return retimed(rung.estimate, lambda rows: (rescaled_efficiency(rows, fix, old, v), rows["floor_us"]))


def fix_sensitivity(lad: Ladder) -> pd.DataFrame:
    """For each code fix of the ladder, its step's gain with the assumption of its state before
    (:data:`m3lab.ladder.before.ASSUMPTIONS`) at its value, low and high: the rungs either side of the step re-timed
    exactly. ``tok_s`` and ``change_*_pct`` are the rung before the step (the fix in its state before); ``gain_*_pct``
    the step's gain in % of output tokens/s/GPU. Columns :data:`SENSITIVITY_COLUMNS`."""
    rows, prev = [], None
    for step in lad.steps:
        if step.rung is None:
            continue
        if prev is not None and step.fix in BEFORE_ASSUMPTIONS and prev.rung.estimate is not None \
                and prev.rung.figures["kind"] == "calibrated":
            a = BEFORE_ASSUMPTIONS[step.fix]
            b = {v: _tok_at(prev.rung, step.fix, v) for v in (a.low, a.high)}
            g = {v: (_tok_at(step.rung, step.fix, v) / b[v] - 1) * 100 for v in (a.low, a.high)}
            lo, hi = (b[x] / prev.rung.throughput - 1 for x in (a.low, a.high))
            rows.append({"rung": step.fix, "assumption": a.name, "value": a.value, "low": a.low, "high": a.high,
                         "unit": a.unit, "tok_s": prev.rung.throughput, "change_low_pct": 100 * lo,
                         "change_high_pct": 100 * hi, "swing_pct": 100 * max(abs(lo), abs(hi)),
                         "gain_pct": step.gain_pct, "gain_low_pct": g[a.low], "gain_high_pct": g[a.high],
                         "source": a.source})
        prev = step
    return pd.DataFrame(rows, columns=list(SENSITIVITY_COLUMNS))


def sensitivity(lad: Ladder, *, top: int = 6) -> pd.DataFrame:
    """Which assumption matters: the cost model's ``top`` assumptions by swing for the ladder's first and last
    estimated rungs (``m3lab.cost.sensitivity``: exact re-timing of each run with one assumption at its low and high
    value; computed here, once per rung shown), and each code fix's :func:`fix_sensitivity` between them. Columns
    :data:`SENSITIVITY_COLUMNS`; changes in % of output tokens/s/GPU."""
    rungs = [s.rung for s in lad.steps if s.rung is not None]
    parts = []
    for name, rung in (("start", rungs[0]), ("fixes", None), ("end", rungs[-1])):
        if rung is None:
            parts.append(fix_sensitivity(lad))
        elif rung.sensitivity is not None:
            t = rung.sensitivity.head(top).assign(rung=name, tok_s=rung.throughput, gain_pct=np.nan,
                                                  gain_low_pct=np.nan, gain_high_pct=np.nan)
            parts.append(t[list(SENSITIVITY_COLUMNS)])
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=list(SENSITIVITY_COLUMNS))
    return pd.concat(parts, ignore_index=True)[list(SENSITIVITY_COLUMNS)]
