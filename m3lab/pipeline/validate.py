"""Value checks of a step's parameters before anything runs, through the library's own validators.

:mod:`m3lab.pipeline.params` checks names and types; this module checks values. A step's deployment parameters
(:data:`DEPLOYMENT_PARAMETERS`: ``preset`` plus the override keys every checklist notebook declares, and
``settings`` for any other field of the record) are built into the one Deployment the notebook builds
(:func:`m3lab.spec.serving.make_deployment`, the same call), so the whole record is validated up front: ``tp``
must divide the model's heads, ``quant`` must be a known scheme, the workload lengths must be positive, the KV
cache must fit the hardware (:meth:`Capacity.check`), and so on. The step's other parameters (calibration,
routing, speculative what-ifs, device, thresholds) are checked by name.

A failed check raises :class:`M3LabError` naming the parameter, the step and the fix, in one line.
"""
from __future__ import annotations

from typing import Any, Callable

from m3lab.errors import M3LabError
from m3lab.optable.routing import make_routing
from m3lab.serving.capacity import capacity
from m3lab.spec.hardware import load_hardware
from m3lab.spec.serving import make_deployment
from m3lab.workload.deployed import check_spec

NULL_WORDS = ("none", "null", "~")   # -p KEY=None / none / null all mean null (YAML reads only null and ~)
#: the deployment vocabulary of the notebooks' parameters cells (None: the preset's value)
DEPLOYMENT_PARAMETERS = ("preset", "model", "hardware", "tp", "ep", "quant", "kv_dtype", "isl", "osl", "concurrency",
                         "num_prompts", "settings")


def is_null(value: Any) -> bool:
    """True for None and the strings that mean it (``None``, ``none``, ``null``)."""
    return value is None or (isinstance(value, str) and value.strip().lower() in NULL_WORDS)


def step_deployment(values: dict[str, Any]):
    """The Deployment a step's parameters describe (None when it declares none of
    :data:`DEPLOYMENT_PARAMETERS`), built by the notebooks' own call and validated, its KV checked to fit."""
    if not any(k in values for k in DEPLOYMENT_PARAMETERS):
        return None
    given = {k: values[k] for k in DEPLOYMENT_PARAMETERS[1:-1] if k in values and not is_null(values[k])}
    settings = values.get("settings")
    if settings is not None and not isinstance(settings, dict):
        raise M3LabError(f"settings={settings!r} must be a mapping of deployment fields", field="settings",
                         hint="e.g. settings='{VLLM_ROCM_USE_AITER: 1, max_num_seqs: 128}'")
    preset = values.get("preset")
    d = make_deployment(None if is_null(preset) else preset, settings or {}, **given)
    wl = d.workload
    if wl.kind == "fixed":
        limits = d.scheduler_limits()
        capacity(d.model, d.plan, d.quant, d.hardware, isl=wl.isl, osl=wl.osl,
                 gpu_memory_utilization=limits.gpu_memory_utilization,
                 spec_tokens=d.serving.spec_tokens).check(wl.concurrency)
    return d


def _check_calibration(p, d):
    from m3lab.cost.model import resolve_calibration  # local: pulls in pandas
    if not is_null(p["calibration"]):
        resolve_calibration(d.hardware if d is not None else load_hardware(p.get("hardware") or "mi355x"),
                            p["calibration"])


def _check_routing(p, d):
    make_routing(p["routing"], 8, 2)


def _check_spec(p, d):
    check_spec(p["spec_tokens"], p.get("accept_len"))


def _check_device(p, d):
    if p["device"] == "cpu":  # always valid; skips importing torch
        return
    from m3lab.bench_analysis.runs import resolve_device  # local: pulls in pandas
    resolve_device(p["device"])   # auto, cpu, or cuda with a GPU visible


def _check_threshold(name):
    def check(p, d):
        v = p[name]
        if not isinstance(v, (int, float)) or v <= 0:
            raise M3LabError(f"{name}={v!r} must be a positive number", field=name)
    return check


# (parameter names a check reads, the check(values, deployment or None)). A check runs when a step declares all
# of its names; the first name is the one the error is reported against.
def _check_fixes(p, d):
    from m3lab.ladder.fixes import get_fix  # local: pulls in pandas
    if not is_null(p["fixes"]):
        if isinstance(p["fixes"], str) or not hasattr(p["fixes"], "__iter__"):
            raise M3LabError(f"fixes={p['fixes']!r} must be a list of fix names", field="fixes",
                             hint="e.g. -p fixes='[shared_expert_fusion, index_sharing]' (m3lab ladder --fixes)")
        for name in p["fixes"]:
            get_fix(name)


CHECKS: tuple[tuple[tuple[str, ...], Callable[[dict, Any], None]], ...] = (
    (("calibration",), _check_calibration),
    (("fixes",), _check_fixes),
    (("routing",), _check_routing),
    (("spec_tokens",), _check_spec),
    (("device",), _check_device),
    (("kv_link_gbps",), _check_threshold("kv_link_gbps")),
)


def _fail(step: str, values: dict, changed: set[str], names: tuple[str, ...], err: Exception) -> M3LabError:
    field = getattr(err, "field", None)
    culprit = field if field in values else next((n for n in names if n in changed), names[0])
    shown = ", ".join(f"{n}={values[n]!r}" for n in dict.fromkeys([culprit, *names]) if n in changed)
    return M3LabError(f"parameter {culprit} (step {step}{': ' + shown if shown else ''}): {err}", field=culprit)


def validate_step(step: str, values: dict[str, Any], changed: set[str]) -> None:
    """Build and check the step's deployment, then run every other check whose names the step declares
    (``values``: its parameters, defaults included).

    ``changed`` are the names set by the pipeline file or ``-p``: an error is reported against the field it
    names when the step declares it, else the first changed name, since that is what the user can fix.
    """
    names = tuple(k for k in DEPLOYMENT_PARAMETERS if k in values)
    try:
        d = step_deployment(values)
    except (M3LabError, TypeError, ValueError) as err:  # a null or odd value can fail below the checks
        raise _fail(step, values, changed, names or ("preset",), err) from None
    for names, check in CHECKS:
        if not all(n in values for n in names):
            continue
        try:
            check(values, d)
        except (M3LabError, TypeError, ValueError) as err:
            raise _fail(step, values, changed, names, err) from None
