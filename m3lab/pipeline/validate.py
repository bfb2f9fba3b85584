"""Value checks of a step's parameters before anything runs, through the library's own validators.

:mod:`m3lab.pipeline.params` checks names and types; this module checks values: ``tp`` must divide the
model's heads (:meth:`ParallelPlan.validate`), ``quant`` must be a known scheme (:func:`load_quant`), the
workload lengths must be positive (:class:`Workload`), the KV cache must fit the hardware
(:meth:`Capacity.check`), and so on — the exact calls the notebooks make, so a value accepted here is
accepted there. Each check runs only when the step's parameters cell declares the names it reads.

A failed check raises :class:`M3LabError` naming the parameter, the step and the fix, in one line.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

from m3lab.errors import M3LabError

NULL_WORDS = ("none", "null", "~")   # -p KEY=None / none / null all mean null (YAML reads only null and ~)


def is_null(value: Any) -> bool:
    """True for None and the strings that mean it (``None``, ``none``, ``null``)."""
    return value is None or (isinstance(value, str) and value.strip().lower() in NULL_WORDS)


@lru_cache(maxsize=16)
def _model(name: str, index_topk_freq: int = 1):
    from m3lab.spec.model import load_model
    m = load_model(name)
    return m if index_topk_freq == 1 else m.with_index_sharing(index_topk_freq)


@lru_cache(maxsize=16)
def _hardware(name: str):
    from m3lab.spec.hardware import load_hardware
    return load_hardware(name)


def _quant(p: dict):
    from m3lab.spec.quant import load_quant
    q = load_quant(p["quant"])
    kv = p.get("kv_dtype")
    return q.with_cache(kv) if kv and not is_null(kv) else q


def _check_model(p):
    _model(p["model"], p.get("index_topk_freq", 1) if isinstance(p.get("index_topk_freq", 1), int) else 1)


def _check_index_sharing(p):
    freq = p["index_topk_freq"]
    if not isinstance(freq, int) or freq < 1:
        raise M3LabError(f"index_topk_freq={freq!r} must be a positive integer", field="index_topk_freq")
    _model(p.get("model", "minimax-m3"), freq)


def _check_plan(p):
    from m3lab.spec.plan import ParallelPlan
    ParallelPlan(tp=p["tp"], ep=p.get("ep", 1)).validate(_model(p["model"]))


def _check_workload(p):
    from m3lab.workload.scheduler import Workload
    Workload(isl=p["isl"], osl=p["osl"], concurrency=p["concurrency"], num_requests=p.get("num_requests"))


def _check_capacity(p):
    from m3lab.serving.capacity import capacity
    from m3lab.spec.plan import ParallelPlan
    m = _model(p["model"])
    plan = ParallelPlan(tp=p["tp"], ep=p.get("ep", 1)).validate(m)
    capacity(m, plan, _quant(p), _hardware(p["hardware"]), isl=p["isl"], osl=p["osl"]).check(p["concurrency"])


def _check_calibration(p):
    from m3lab.cost.model import resolve_calibration
    if not is_null(p["calibration"]):
        resolve_calibration(_hardware(p.get("hardware", "mi355x")), p["calibration"])


def _check_routing(p):
    from m3lab.optable.routing import make_routing
    make_routing(p["routing"], 8, 2)


def _check_spec(p):
    from m3lab.serving.estimate import spec_decode_steps
    spec_decode_steps(p.get("osl", 2), p["spec_tokens"], p.get("accept_len"))


def _check_device(p):
    if p["device"] == "cpu":  # always valid; skips importing torch
        return
    from m3lab.analysis.kernel_runs import resolve_device
    resolve_device(p["device"])   # auto, cpu, or cuda with a GPU visible


def _check_threshold(name):
    def check(p):
        v = p[name]
        if not isinstance(v, (int, float)) or v <= 0:
            raise M3LabError(f"{name}={v!r} must be a positive number", field=name)
    return check


# (parameter names a check reads, the check). A check runs when a step declares all of its names; the
# first name is the one the error is reported against.
CHECKS: tuple[tuple[tuple[str, ...], Callable[[dict], None]], ...] = (
    (("model",), _check_model),
    (("index_topk_freq",), _check_index_sharing),
    (("quant",), _quant),
    (("kv_dtype", "quant"), _quant),
    (("hardware",), lambda p: _hardware(p["hardware"])),
    (("tp", "model"), _check_plan),
    (("ep", "model"), _check_plan),
    (("isl", "osl", "concurrency"), _check_workload),
    (("num_requests", "isl", "osl", "concurrency"), _check_workload),
    (("calibration",), _check_calibration),
    (("routing",), _check_routing),
    (("spec_tokens",), _check_spec),
    (("device",), _check_device),
    (("kv_link_bw",), _check_threshold("kv_link_bw")),
    (("concurrency", "model", "tp", "quant", "hardware", "isl", "osl"), _check_capacity),
)


def validate_step(step: str, values: dict[str, Any], changed: set[str]) -> None:
    """Run every check whose names the step declares (``values``: its parameters, defaults included).

    ``changed`` are the names set by the pipeline file or ``-p``: an error is reported against the first
    of a check's names that was changed (else its first name), since that is what the user can fix.
    """
    for names, check in CHECKS:
        if not all(n in values for n in names):
            continue
        try:
            check(values)
        except (M3LabError, TypeError, ValueError) as err:  # a null or odd value can fail below the checks
            field = getattr(err, "field", None)
            culprit = field if field in values else next((n for n in names if n in changed), names[0])
            shown = ", ".join(f"{n}={values[n]!r}" for n in dict.fromkeys([culprit, *names]) if n in changed)
            raise M3LabError(f"parameter {culprit} (step {step}{': ' + shown if shown else ''}): {err}",
                             field=culprit) from None
