"""The optimisation ladder: a deployment's fixes switched on one at a time, in the write-up's order, each step
estimated (:func:`m3lab.ladder.evaluate.evaluate`) beside the write-up's own figure for that fix where the
configuration it states is this step's (:func:`m3lab.published.fix_gain_for`), else its configuration beside a null.

:func:`plan` finds the fixes between two deployments: every switch fix whose settings the target has and the start
has not, and every code fix (vLLM 0.33.0 has no switch for it) whose code path the start runs. The ladder starts
from the start deployment with those code fixes in m3lab's representation of their state before
(:mod:`m3lab.ladder.before`); once they are on it is the start deployment, and once every switch is on it is the
target (:func:`run` checks the keys). Figures are **projected** (hardware profile and calibration named in ``label``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.ladder.before import REPRESENTED, SCALE
from m3lab.ladder.evaluate import Rung, evaluate
from m3lab.ladder.fixes import FIXES, Fix, applied, get_fix
from m3lab.published import fix_gain_for
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
    """None when vLLM runs ``fix``'s code path for ``d`` (:func:`m3lab.vllm.fastpaths.resolve`), else why not."""
    from m3lab.vllm.fastpaths import resolve  # vLLM's rules: loaded on first use (seconds)

    if fix.spec_only and not d.serving.spec_tokens:
        return "no speculative decoding"
    op, prefix = CODE_PATHS[fix.name]
    try:
        got = resolve(d).decision(op, "sparse").path
    except KeyError:
        return f"{d.model.name} has no sparse-layer {op}"
    return None if got.startswith(prefix) else f"{op} runs {got}, not the fix's {prefix}* path"


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
    writeup: dict | None          # m3lab.published.fix_gain_for

    def to_dict(self) -> dict:
        f = self.rung.figures if self.rung is not None else {}
        w = self.writeup or {}
        return {"fix": self.fix, "title": self.title, "deployment": self.rung.deployment.name if self.rung else None,
                "undone": list(self.rung.undone) if self.rung else None,
                **{k: f.get(k) for k in ("output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms")},
                "gain_pct": self.gain_pct, "tpot_change_pct": self.tpot_change_pct,
                "writeup_gain_pct": w.get("value_pct"), "writeup_metric": w.get("metric"),
                "writeup_text": w.get("text"), "writeup_configuration": w.get("configuration"),
                "writeup_not_stated": w.get("not_stated"),
                "note": None if self.rung is not None else get_fix(self.fix).before}


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
        return "; ".join(f"{u} in its state before: {BEFORE[u]} (m3lab's representation, not vLLM's)"
                         for u in undone)

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


def climb(start, fixes: Sequence[Fix], *, calibration="default", scale: float = SCALE,
          progress: Callable[[str], None] | None = None, acceptance: dict | None = None) -> Ladder:
    """Switch ``fixes`` on one at a time from ``start``: the code fixes among them start in m3lab's representation of
    their state before. ``acceptance`` (:func:`acceptance_of`) goes with a fix that switches speculation on.
    ``progress`` gets one line per step before it is estimated."""
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
        writeup = fix_gain_for(fix.name, compare_config(d)) if fix else None
        if fix is not None and not fix.is_switch and fix.name not in REPRESENTED:
            lad.steps.append(Step(fix.name, fix.title, None, None, None, writeup))
            continue
        rung = evaluate(d, undone, calibration=calibration, scale=scale)
        gain = _change(rung.throughput, prev.throughput) if prev else None
        tpot = _change(rung.figures["tpot_ms"], prev.figures["tpot_ms"]) if prev else None
        title = fix.title if fix else start.name + (" with the code fixes in their state before" if undone else "")
        lad.steps.append(Step(name, title, rung, gain, tpot, writeup))
        prev = rung
    lad.target = d
    return lad


def run(start, target, *, calibration="default", scale: float = SCALE,
        progress: Callable[[str], None] | None = None) -> Ladder:
    """The ladder from ``start`` to ``target`` (the fixes of :func:`plan`); it ends at ``target`` (checked)."""
    lad = climb(start, plan(start, target), calibration=calibration, scale=scale, progress=progress,
                acceptance=acceptance_of(target))
    if lad.target.key() != target.key():
        raise AssertionError(f"the ladder ends at {lad.target.name}, not {target.name}")
    lad.target = target
    return lad


def toggled(start, fixes: Sequence[Fix], on, *, calibration="default", scale: float = SCALE) -> Rung:
    """The estimate of ``start`` with the fixes named in ``on`` switched on and the other ``fixes`` off: switch
    fixes applied, code fixes not in ``on`` in m3lab's representation of their state before (what a toggle per fix
    shows)."""
    d = start
    for fix in fixes:
        if fix.is_switch and fix.name in on:
            d = d.with_settings(fix.settings)
    undone = tuple(f.name for f in fixes if not f.is_switch and f.name in REPRESENTED and f.name not in on)
    return evaluate(d, undone, calibration=calibration, scale=scale)


SENSITIVITY_COLUMNS = ("rung", "assumption", "value", "low", "high", "unit", "tok_s", "change_low_pct",
                       "change_high_pct", "swing_pct", "source")


def sensitivity(lad: Ladder, *, calibration="default", scales: Sequence[float] = (0.5, 1.5),
                top: int = 6) -> pd.DataFrame:
    """Which assumption matters, for the ladder's first and last estimated rungs: the cost model's ``top``
    assumptions by swing (``m3lab.cost.sensitivity``: exact re-timing of each run with one assumption at its low
    and high value) and the ladder's own, :data:`SCALE` of the code fixes' H200 ratios (re-estimated at each of
    ``scales``). Columns :data:`SENSITIVITY_COLUMNS`; changes in % of output tokens/s/GPU."""
    rungs = [s.rung for s in lad.steps if s.rung is not None]
    parts = []
    for name, rung in (("start", rungs[0]), ("end", rungs[-1])):
        if rung.sensitivity is not None:
            t = rung.sensitivity.head(top).assign(rung=name, tok_s=rung.throughput)
            parts.append(t)
    first = rungs[0]
    if first.undone:
        runs = {x: evaluate(first.deployment, first.undone, calibration=calibration, scale=x).throughput
                for x in scales}
        lo, hi = runs[min(scales)] / first.throughput - 1, runs[max(scales)] / first.throughput - 1
        parts.append(pd.DataFrame([{
            "rung": "start", "assumption": "ladder.before.SCALE", "value": SCALE, "low": min(scales),
            "high": max(scales), "unit": "x (ratio excess over 1)", "tok_s": first.throughput,
            "change_low_pct": 100 * lo, "change_high_pct": 100 * hi, "swing_pct": 100 * max(abs(lo), abs(hi)),
            "source": "assumed: m3lab's H200 before/after kernel ratios (" + ", ".join(first.undone) + ") carry to "
                      f"{first.deployment.hardware.name}"}]))
    if not parts:
        return pd.DataFrame(columns=list(SENSITIVITY_COLUMNS))
    return pd.concat(parts, ignore_index=True)[list(SENSITIVITY_COLUMNS)]
