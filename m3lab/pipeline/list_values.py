"""Value checks of the list parameters of the notebooks (``concurrencies``, ``isls``, ``capacities_tokens`` ...),
element by element, before anything runs.

:mod:`m3lab.pipeline.params` checks each element's type against the default's elements; this module checks
their values with the library's own rules, so ``-p "concurrencies=[1,-8]"`` fails in a second, not in step 8
after a minute. Each check runs only when the step's parameters cell declares the names it reads.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from m3lab.cache.policies import POLICIES
from m3lab.cache.trace import read_trace
from m3lab.errors import M3LabError
from m3lab.pipeline import validate
from m3lab.serving.cache_capacity import check_sim_capacity
from m3lab.spec.model import load_model
from m3lab.spec.plan import ParallelPlan


def _each(name: str, least: int = 1, *, null: bool = False) -> Callable[[dict], None]:
    """Every element of the list parameter ``name`` is an integer >= ``least`` (or null, where ``null``)."""
    def check(p):
        for i, v in enumerate(p[name] or []):
            if v is None and null:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise M3LabError(f"{name}[{i}]={v!r} must be an integer >= {least}", field=name)
    return check


def _capacities(p: dict) -> None:
    from m3lab.cache.replay import blocks_for_tokens  # local: pulls in pandas
    block = inspect.signature(read_trace).parameters["block_size"].default   # what notebook 06 replays with
    _each("capacities_tokens", null=True)(p)
    for v in p["capacities_tokens"]:
        check_sim_capacity(v, block, "capacities_tokens")
        blocks_for_tokens(v, block)


def _model(p: dict):
    """The step's model: from its Deployment (a null ``model`` is the preset's), else by name."""
    deployment = validate.step_deployment(p)
    if deployment is not None:
        return deployment.model
    return load_model(p["model"])


def _sharding_tps(p: dict) -> None:
    model = _model(p)
    for tp in p["sharding_tps"]:
        ParallelPlan(tp=tp).validate(model)


def _ratios(p: dict) -> None:
    for i, pair in enumerate(p["ratios"]):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and
                all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair)):
            raise M3LabError(f"ratios[{i}]={pair!r} must be a pair of positive integers [prefill, decode]",
                             field="ratios")


def _policies(p: dict) -> None:
    bad = [v for v in p["policies"] if v not in POLICIES]
    if bad:
        raise M3LabError(f"policies: {bad[0]!r} is not an eviction policy", field="policies",
                         hint=f"choose from {', '.join(POLICIES)}")


# (parameter names a check reads, the check); the first name is the one an error is reported against
CHECKS: tuple[tuple[tuple[str, ...], Callable[[dict], None]], ...] = (
    (("concurrencies",), _each("concurrencies")),
    (("isls",), _each("isls")),
    (("live_ms",), _each("live_ms")),
    (("draft_lengths",), _each("draft_lengths", 0)),
    (("capacities_tokens",), _capacities),
    (("sharding_tps", "model"), _sharding_tps),
    (("ratios",), _ratios),
    (("policies",), _policies),
)


def validate_lists(step: str, values: dict[str, Any], changed: set[str]) -> None:
    """Run every list check whose names the step declares; one-line M3LabError naming the parameter."""
    for names, check in CHECKS:
        if not all(n in values for n in names) or values[names[0]] is None:
            continue
        try:
            check(values)
        except (M3LabError, TypeError, ValueError) as err:
            shown = f": {names[0]}={values[names[0]]!r}" if names[0] in changed else ""
            raise M3LabError(f"parameter {names[0]} (step {step}{shown}): {err}", field=names[0]) from None
