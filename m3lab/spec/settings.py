"""The one vocabulary of deployment settings: ``KEY=VALUE`` pairs applied to a :class:`~m3lab.spec.serving.Deployment`.

Every command's ``--set``, every pipeline's ``-p`` and every notebook's parameters go through :func:`apply`.
A key is one of:

- an m3lab field name (:func:`keys`): ``tp``, ``kv_dtype``, ``aiter``, ``isl``, ``max_num_seqs``, ``accept_len``,
  ``decode_tp``, ``kv_link_gbps``, ``index_topk_freq``, ``model``, ``hardware``, ``quant``, ...;
- a vLLM environment variable (``VLLM_ROCM_USE_AITER=0``, ``VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1``,
  ``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1``, ...);
- a ``vllm serve`` or ``vllm bench serve`` flag (``--max-num-seqs``, ``--kv-cache-dtype``,
  ``--enable-expert-parallel``, ``--no-enable-prefix-caching``, ``--max-concurrency``, ``--random-input-len``, ...).

Values are text (``"1"``, ``"fp8"``, ``"none"``) or Python values of the field's type. An unknown key raises
M3LabError listing the close matches. :func:`flat` gives a deployment as ``{key: value}`` in the same
vocabulary, and :func:`changes` what differs between two deployments (the derived names of changed presets).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Callable, Mapping

from m3lab.errors import M3LabError
from m3lab.spec.hardware import load_hardware
from m3lab.spec.limits import SchedulerLimits
from m3lab.spec.model import load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.quant import load_quant
from m3lab.spec.roles import ROLE_NAMES, RoleSpec
from m3lab.spec.speculation import SpecAcceptance
from m3lab.spec.switches import ENV_FLAGS, FSE_ENV, V2_RUNNER_ENV, ServingConfig
from m3lab.spec.traffic import WorkloadSpec

NULL_WORDS = ("none", "null", "~", "")

# (attribute of the Deployment, its record class) whose fields are keys of the same name
_SUBRECORDS = (("plan", ParallelPlan), ("serving", ServingConfig), ("limits", SchedulerLimits),
               ("acceptance", SpecAcceptance))
_WORKLOAD_KEYS = {"workload": "kind", **{f.name: f.name for f in dataclasses.fields(WorkloadSpec) if f.name != "kind"}}
_ROLE_FIELDS = tuple(f.name for f in dataclasses.fields(RoleSpec))

# vLLM's names (environment variables, vllm serve and vllm bench serve flags) -> m3lab key. Flags whose name is
# the m3lab key with dashes (--max-num-seqs, --gpu-memory-utilization, --num-prompts, ...) need no entry.
VLLM_NAMES: Mapping[str, str] = {
    **{var: f for f, var in ENV_FLAGS.items()}, FSE_ENV: "fused_shared_expert", V2_RUNNER_ENV: "model_runner_v2",
    "--tensor-parallel-size": "tp", "-tp": "tp", "--data-parallel-size": "dp", "-dp": "dp",
    "--enable-expert-parallel": "enable_expert_parallel", "--kv-cache-dtype": "kv_dtype",
    "--enable-chunked-prefill": "chunked_prefill", "--enable-prefix-caching": "prefix_caching",
    "--max-concurrency": "concurrency", "--random-input-len": "isl", "--random-output-len": "osl",
    "--input-len": "isl", "--output-len": "osl",
}


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    low = str(value).strip().lower()
    if low not in ("1", "0", "true", "false", "on", "off", "yes", "no"):
        raise M3LabError(f"{key}={value!r} is not a boolean", field=key, hint="use 1/0 or true/false")
    return low in ("1", "true", "on", "yes")


def convert(key: str, type_text: str, value: Any) -> Any:
    """``value`` (text or Python) as a field declared ``type_text`` (e.g. ``"int | None"``)."""
    optional = "None" in type_text
    if isinstance(value, str) and value.strip().lower() in NULL_WORDS:
        if optional:
            return None
        raise M3LabError(f"{key} cannot be empty", field=key)
    if value is None:
        if optional:
            return None
        raise M3LabError(f"{key} cannot be None", field=key)
    base = type_text.replace("| None", "").strip()
    try:
        if base == "bool":
            return _bool(key, value)
        if base == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if base == "float":
            if isinstance(value, bool):
                raise ValueError
            v = float(value)
            return None if optional and math.isinf(v) else v
    except (TypeError, ValueError):
        kind = {"bool": "a boolean (1/0, true/false)", "int": "an integer", "float": "a number"}[base]
        raise M3LabError(f"{key}={value!r} is not {kind}", field=key) from None
    return str(value).strip()


def _field_type(cls: type, name: str) -> str:
    return str({f.name: f.type for f in dataclasses.fields(cls)}[name])


def _set_in(d, attr: str, cls: type, name: str, key: str, value: Any):
    return dataclasses.replace(d, **{attr: dataclasses.replace(getattr(d, attr), **{name: convert(
        key, _field_type(cls, name), value)})})


def _set_role(d, role: str, name: str, key: str, value: Any):
    r = getattr(d.pd, role)
    r = dataclasses.replace(r, **{name: convert(key, _field_type(RoleSpec, name), value)})
    return dataclasses.replace(d, pd=dataclasses.replace(d.pd, **{role: r}))


def parse_pd(text: Any) -> tuple[int, int]:
    """``"P:D"`` -> (P, D), both positive integers (``"0:0"`` or none: colocated)."""
    if text is None or str(text).strip().lower() in NULL_WORDS:
        return 0, 0
    try:
        p, d = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise M3LabError(f"pd {text!r} is not P:D", field="pd", hint="e.g. pd=2:1 (2 prefill, 1 decode)") from None
    if (p, d) != (0, 0) and (p < 1 or d < 1):
        raise M3LabError(f"pd {text!r} needs at least one prefill and one decode instance", field="pd")
    return p, d


def _set_pd(d, value: Any):
    p, n = parse_pd(value)
    pd = dataclasses.replace(d.pd, prefill=dataclasses.replace(d.pd.prefill, instances=p),
                             decode=dataclasses.replace(d.pd.decode, instances=n))
    return dataclasses.replace(d, pd=pd)


def _set_model(d, value: Any):
    m = load_model(str(value).strip())
    sp = d.model.sparse
    if sp is not None and sp.index_topk_freq > 1 and m.sparse is not None:
        m = m.with_index_sharing(sp.index_topk_freq, sp.index_skip_topk_offset)
    return dataclasses.replace(d, model=m)


def _set_index_sharing(d, value: Any):
    freq = convert("index_topk_freq", "int", value)
    if freq < 1:
        raise M3LabError(f"index_topk_freq={freq} must be >= 1 (1: off)", field="index_topk_freq")
    sp = d.model.sparse
    if sp is None:
        if freq == 1:
            return d
        raise M3LabError(f"index sharing needs a sparse-attention model; {d.model.name} has none",
                         field="index_topk_freq")
    return dataclasses.replace(d, model=d.model.with_index_sharing(freq, sp.index_skip_topk_offset))


def _set_expert_parallel(d, value: Any):
    on = _bool("enable_expert_parallel", value)   # vLLM's EP group spans TP x DP
    return dataclasses.replace(d, plan=dataclasses.replace(d.plan, ep=d.plan.tp * d.plan.dp if on else 1))


def _handlers() -> dict[str, Callable]:
    """m3lab key -> function(deployment, value) -> deployment."""
    out: dict[str, Callable] = {
        "model": _set_model,
        "hardware": lambda d, v: dataclasses.replace(d, hardware=load_hardware(str(v).strip())),
        "quant": lambda d, v: dataclasses.replace(d, quant=load_quant(str(v).strip()).with_cache(
            d.quant.kv_dtype, d.quant.index_dtype)),
        "kv_dtype": lambda d, v: dataclasses.replace(d, quant=d.quant.with_cache(kv_dtype=str(v))),
        "index_dtype": lambda d, v: dataclasses.replace(d, quant=d.quant.with_cache(index_dtype=str(v))),
        "index_topk_freq": _set_index_sharing,
        "enable_expert_parallel": _set_expert_parallel,
        "pd": _set_pd,
        "kv_link_gbps": lambda d, v: dataclasses.replace(d, pd=dataclasses.replace(
            d.pd, kv_link_gbps=convert("kv_link_gbps", "float", v))),
    }
    for attr, cls in _SUBRECORDS:
        for f in dataclasses.fields(cls):
            out[f.name] = (lambda a, c, n: lambda d, v: _set_in(d, a, c, n, n, v))(attr, cls, f.name)
    for key, name in _WORKLOAD_KEYS.items():
        out[key] = (lambda n, k: lambda d, v: _set_in(d, "workload", WorkloadSpec, n, k, v))(name, key)
    for role in ROLE_NAMES:
        for name in _ROLE_FIELDS:
            key = f"{role}_{name}"
            out[key] = (lambda r, n, k: lambda d, v: _set_role(d, r, n, k, v))(role, name, key)
    return out


HANDLERS = _handlers()
# applied first, so the other settings refine them (a quant keeps the KV dtype given beside it, EP follows TP)
_FIRST = ("model", "hardware", "quant")
_LAST = ("enable_expert_parallel",)


def keys() -> list[str]:
    """Every m3lab key, sorted."""
    return sorted(HANDLERS)


def canonical(key: str) -> tuple[str, bool]:
    """(m3lab key, inverted) for any accepted spelling; ``inverted`` for vLLM's ``--no-`` flags."""
    k = key.strip()
    if k in HANDLERS:
        return k, False
    if k in VLLM_NAMES:
        return VLLM_NAMES[k], False
    if k.startswith("--no-"):
        inner, _ = canonical("--" + k[5:])
        return inner, True
    if k.startswith("-"):
        name = k.lstrip("-").replace("-", "_")
        if name in HANDLERS:
            return name, False
    choices = [*HANDLERS, *VLLM_NAMES]
    close = difflib.get_close_matches(k, choices, n=5, cutoff=0.6)
    raise M3LabError(f"unknown setting {key!r}", field=key,
                     hint=("did you mean " + ", ".join(close) if close else
                           "an m3lab field (m3lab.spec.settings.keys()), a VLLM_* variable or a vllm serve flag"))


def apply(d, settings: Mapping[str, Any]):
    """``d`` with ``settings`` applied (keys in any accepted spelling); not validated."""
    items = []
    for key, value in settings.items():
        name, inverted = canonical(key)
        items.append((name, (not _bool(key, value)) if inverted else value))
    order = {k: i for i, k in enumerate(_FIRST)}
    items.sort(key=lambda kv: order.get(kv[0], len(_FIRST) + (1 if kv[0] in _LAST else 0)))
    for name, value in items:
        d = HANDLERS[name](d, value)
    return d


def flat(d) -> dict[str, Any]:
    """The deployment as ``{m3lab key: value}`` (what ``summary.json`` and the derived names show)."""
    sp = d.model.sparse
    out: dict[str, Any] = {"model": d.model.name, "hardware": d.hardware.name, "quant": d.quant.name,
                           "kv_dtype": d.quant.kv_dtype, "index_dtype": d.quant.index_dtype,
                           "index_topk_freq": sp.index_topk_freq if sp is not None else 1}
    for attr, cls in _SUBRECORDS:
        out.update({f.name: getattr(getattr(d, attr), f.name) for f in dataclasses.fields(cls)})
    out.update({key: getattr(d.workload, name) for key, name in _WORKLOAD_KEYS.items()})
    out["pd"] = f"{d.pd.prefill.instances}:{d.pd.decode.instances}"
    out["kv_link_gbps"] = d.pd.kv_link_gbps
    for role in ROLE_NAMES:
        out.update({f"{role}_{n}": getattr(getattr(d.pd, role), n) for n in _ROLE_FIELDS if n != "instances"})
    return out


def changes(base, new) -> dict[str, Any]:
    """``{key: new value}`` for every key of :func:`flat` whose value differs between ``base`` and ``new``."""
    a, b = flat(base), flat(new)
    return {k: v for k, v in b.items() if a.get(k) != v}
