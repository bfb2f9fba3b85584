"""The next fix: what the write-up's team did by hand, for any deployment.

For each switch fix (:data:`m3lab.ladder.fixes.FIXES`) the deployment has not applied, vLLM's own rules
(the resolver's answer, :func:`m3lab.serving.dispatch.dispatch_for`) say whether it would take it: a fix vLLM refuses
at start-up or quietly turns off, or one with which vLLM runs no other kernel for this deployment (the page adapter
without AITER), is listed under ``blocked`` with the reason, never ranked. A ranked fix whose ``requires`` the
deployment lacks says so (``assumes``: shared-expert fusion with AITER off fuses into vLLM's Triton experts, not the
write-up's AITER kernel). ``aiter`` is ranked like a fix and marked ``named`` False: a switch of the write-up's
optimised deployment, not one of its fixes. Each remaining fix is estimated
(:func:`m3lab.ladder.evaluate.evaluate`); ``fixes`` ranks them by the estimated gain in output tokens/s/GPU, best
first, each with the op it relieves most (from the per-op time of the decode step before and after), that op's share
of the step now, and the checklist step that would confirm it ran. A fix the deployment has is never listed, so
applying the first and asking again no longer lists it. Code fixes (vLLM 0.33.0 has them, no switch) are applied
wherever their code runs and are never advised. Gains are **projected** (the estimate's label names the hardware
profile and calibration).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.ladder.evaluate import Rung, evaluate
from m3lab.ladder.fixes import CHECKLIST, FIXES, Fix, applied
from m3lab.serving.dispatch import dispatch_for


@dataclass
class Advice:
    """``fixes`` (ranked, best first) and ``blocked`` (vLLM refuses or turns them off) for ``deployment``."""

    deployment: object
    base: Rung
    fixes: list[dict] = field(default_factory=list)
    blocked: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        f = self.base.figures
        return {"deployment": self.deployment.name, "kind": f["kind"], "label": f["label"],
                "output_tokens_per_s_per_gpu": f["output_tokens_per_s_per_gpu"], "ttft_s": f["ttft_s"],
                "tpot_ms": f["tpot_ms"], "decode_step": self.base.decode_step,
                "fixes": self.fixes, "blocked": self.blocked}

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.fixes)


def _status(disp, status: str) -> list:
    """The decisions of ``disp`` (a Dispatch) with ``status`` (``off``, ``refused``), every phase."""
    return [c for table in disp.choices.values() for c in table.values() if c.status == status]


def vllm_objection(fix: Fix, d, after) -> str | None:
    """vLLM's reason not to run ``fix`` on ``after`` (= ``d`` with the fix applied), or None when it takes it:
    a refusal at start-up, a path vLLM turns off that it does not turn off for ``d``, or no kernel vLLM runs
    differently (the resolver's answers, cached: :func:`m3lab.serving.dispatch.dispatch_for`)."""
    res, base = dispatch_for(after), dispatch_for(d)
    if res is None or base is None:
        return None
    if res.refused():
        return "; ".join(dict.fromkeys(f"vLLM refuses {x.op}: {x.note}" for x in res.refused()))
    before = {(x.op, x.layer_kind) for x in _status(base, "off")}
    new = [x for x in _status(res, "off") if (x.op, x.layer_kind) not in before]
    if new:
        return "; ".join(dict.fromkeys(f"{x.op}: {x.note}" for x in new))
    if res.choices == base.choices:
        need = {k: v for k, v in fix.requires.items() if not _has(d, {k: v})}
        return "vLLM runs no other kernel for this deployment with " + _text(fix.settings) + \
            (f": the fix assumes {_text(need)} (apply it first)" if need else "")
    return None


def _text(settings) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def _has(d, settings) -> bool:
    """True when ``d`` already has ``settings`` (applying them changes nothing)."""
    return d.with_settings(settings).key() == d.key()


def relieved_op(fix: Fix, base: Rung, after: Rung) -> tuple[str, float, float]:
    """(op, its share of the decode step now, µs it saves) for the op of ``fix.touches()`` whose decode time falls
    most; the fix's first op present in the step when none falls."""
    now = base.decode_ops.groupby("op")["us"].sum()
    then = after.decode_ops.groupby("op")["us"].sum()
    total = now.sum()
    saved = {op: now.get(op, 0.0) - then.get(op, 0.0) for op in fix.touches() if op in now.index or op in then.index}
    if saved and max(saved.values()) > 0:
        op = max(saved, key=saved.get)
    else:
        op = next((o for o in fix.ops if o in now.index), fix.ops[0])
    return op, float(now.get(op, 0.0) / total), float(saved.get(op, 0.0))


def candidates(d) -> list[Fix]:
    """The switch fixes ``d`` has not applied (speculative ones only where it speculates)."""
    return [f for f in FIXES if f.is_switch and not f.spec_only and not applied(f, d)] + \
        [f for f in FIXES if f.is_switch and f.spec_only and d.serving.spec_tokens and not applied(f, d)]


def _entry(fix: Fix, base: Rung, after: Rung) -> dict:
    op, share, saved = relieved_op(fix, base, after)
    return {"fix": fix.name, "title": fix.title, "op": op, "gain_pct": (after.throughput / base.throughput - 1) * 100,
            "tpot_change_pct": (after.figures["tpot_ms"] / base.figures["tpot_ms"] - 1) * 100,
            "op_share_pct": share * 100, "op_saved_us": saved, "settings": dict(fix.settings),
            "checklist_step": fix.confirm_step, "confirm": f"step {fix.confirm_step} "
                                                           f"({CHECKLIST[fix.confirm_step]}): {fix.confirm}",
            "found_by": f"step {fix.found_by} ({CHECKLIST[fix.found_by]}): {fix.found}", "vllm": fix.vllm,
            "named": fix.named, "assumes": {k: v for k, v in fix.requires.items() if not _has(base.deployment,
                                                                                              {k: v})}}


def advise(d, *, calibration="default", progress: Callable[[str], None] | None = None) -> Advice:
    """Rank the fixes ``d`` has not applied by estimated gain (see the module docstring)."""
    todo = candidates(d)
    if progress:
        progress(f"[1/{len(todo) + 1}] {d.name or 'deployment'} as it is")
    out = Advice(d, evaluate(d, calibration=calibration))
    for i, fix in enumerate(todo):
        if progress:
            progress(f"[{i + 2}/{len(todo) + 1}] {fix.name}")
        try:
            after = d.with_settings(fix.settings)
        except M3LabError as err:   # the record itself refuses the combination
            out.blocked.append({"fix": fix.name, "reason": str(err), "settings": dict(fix.settings)})
            continue
        why = vllm_objection(fix, d, after)
        if why:
            out.blocked.append({"fix": fix.name, "reason": why, "settings": dict(fix.settings)})
            continue
        out.fixes.append(_entry(fix, out.base, evaluate(after, calibration=calibration)))
    out.fixes.sort(key=lambda e: e["gain_pct"], reverse=True)
    out.blocked += already_off(d)
    return out


def already_off(d) -> list[dict]:
    """Switch fixes ``d`` asks for that vLLM turns off or refuses (listed with vLLM's reason)."""
    res = dispatch_for(d)
    if res is None:
        return []
    out = {}
    for x in _status(res, "off") + res.refused():
        fix = next((f for f in FIXES if f.is_switch and (f.name == x.op or x.op in f.ops) and applied(f, d)), None)
        name = fix.name if fix else f"(as deployed: {x.op})"
        out.setdefault(name, {"fix": name, "reason": f"{x.op}: {x.note}",
                              "settings": dict(fix.settings) if fix else {}})
    return list(out.values())
