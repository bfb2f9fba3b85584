"""The deployment's :class:`~m3lab.optable.dispatch.Dispatch`: the fast-path resolver's answer, resolved once.

``dispatch_for(deployment)`` resolves the deployment (:func:`m3lab.vllm.fastpaths.resolve`) for one decode step
and one prefill step and keeps every decision as plain data, with vLLM's answers that change local widths
(:func:`m3lab.vllm.fastpaths.plan_of`: index q replicated, shared expert fused). Decode is resolved at the
deployment's steady decode batch (``concurrency`` requests, at most ``max_num_seqs``, x (1 + speculative tokens)
rows) and prefill at ``max_num_batched_tokens`` tokens: every decode step of a run takes the decode decisions and every step with
a prefill chunk the prefill ones (a decision that changes with the step size inside a phase, such as the GEMM
tile between 32 and 128 decode rows, is taken at the resolved size).

Resolving runs vLLM's selection code (seconds), so the answer is cached on the fields that decide the kernels
(model, hardware, plan, quant, serving switches, scheduler limits and the resolved sizes; not the traffic): in
the process, and on disk under ``$M3LAB_CACHE_DIR/dispatch`` (default ``~/.cache/m3lab``; ``M3LAB_CACHE_DIR=off``
disables it), keyed also on a hash of the resolver's source (``m3lab/vllm``, ``m3lab/spec``) and vLLM's version,
so a changed rule or vLLM never reads a stale answer.

Returns None for deployments the resolver does not build (other models; M3 in a weight format no M3 checkpoint
has, e.g. fp8; on B200, whose vLLM kernels compile at construction): their rows are costed by kind
(:mod:`m3lab.cost.sources`).
"""
from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

from m3lab.atomic import write_text
from m3lab.optable.dispatch import PHASES, Dispatch, PathChoice
from m3lab.spec.record_key import stable_key
from m3lab.vllm.fastpaths import plan_of, resolve, resolves

_CACHE: dict = {}
CACHE_SIZE = 64
CACHE_ENV = "M3LAB_CACHE_DIR"
_SOURCES = ("vllm", "spec")   # m3lab packages whose code decides a resolution
_FIELDS = ("op", "layer_kind", "path", "kernels", "status", "decision", "note")
_PLAN_FIELDS = ("index_q_replicated", "shared_expert_fused", "fusion_off")   # vLLM's answers in the effective plan


def dispatch_key(deployment, decode_tokens: int, prefill_tokens: int) -> str:
    """The fields that decide the kernels, and the resolved step sizes."""
    d = deployment
    return stable_key(d.model, d.hardware, d.plan, d.quant, d.serving, d.limits, decode_tokens, prefill_tokens)


def resolved_tokens(deployment) -> dict[str, int]:
    """Step sizes the phases are resolved at (see the module docstring)."""
    d = deployment
    limits = d.scheduler_limits()
    requests = max(1, min(int(d.workload.concurrency or 1), int(limits.max_num_seqs)))
    return {"decode": requests * d.serving.decode_query_len, "prefill": int(limits.max_num_batched_tokens)}


def resolvable(deployment) -> bool:
    """True when the resolver builds the deployment (MiniMax M3's block-sparse attention, in a weight format an M3
    checkpoint has, on a GPU whose vLLM model it builds)."""
    return resolves(deployment.model, deployment.quant.name, deployment.hardware)


def dispatch_for(deployment, tokens: dict[str, int] | None = None) -> Dispatch | None:
    """The deployment's Dispatch (cached, see the module docstring), or None when the resolver does not know
    its model."""
    if not resolvable(deployment):
        return None
    tokens = tokens or resolved_tokens(deployment)
    key = dispatch_key(deployment, tokens["decode"], tokens["prefill"])
    if key not in _CACHE:
        found = _read_disk(key)
        if found is None:
            found = _resolve(deployment, tokens)
            _write_disk(key, found)
        if len(_CACHE) >= CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = found
    return _CACHE[key]


def resolved_before(deployment) -> bool:
    """True when :func:`dispatch_for` answers ``deployment`` without running vLLM (from this process's or the disk
    cache, or because the resolver does not build it); False when it will start vLLM (seconds)."""
    if not resolvable(deployment):
        return True
    tokens = resolved_tokens(deployment)
    key = dispatch_key(deployment, tokens["decode"], tokens["prefill"])
    path = _disk_path(key)
    return key in _CACHE or (path is not None and path.is_file())


def cache_location() -> str:
    """Where resolutions are kept on disk (or that the disk cache is off)."""
    root = _cache_dir()
    return f"{CACHE_ENV}=off: this process only" if root is None else str(root)


def _resolve(deployment, tokens: dict[str, int]) -> Dispatch:
    # heavy dependency: the resolver imports vLLM (seconds); only resolvable deployments reach it
    choices, res = {}, None
    for phase in PHASES:
        res = resolve(deployment, tokens=tokens[phase], phase=phase)
        choices[phase] = {(x.op, x.layer_kind): PathChoice(x.op, x.layer_kind, x.path, tuple(x.kernels), x.status,
                                                          x.decision, x.note)
                          for x in res.decisions}
    plan = plan_of(res)   # vLLM's answers taken while it built the model: the same for both phases
    return Dispatch(hardware=deployment.hardware.name, choices=choices, tokens=dict(tokens),
                    index_q_replicated=plan.index_q_replicated, shared_expert_fused=plan.shared_expert_fused,
                    fusion_off=plan.fusion_off)


# ---------------------------------------------------------------- the disk cache
def _cache_dir() -> Path | None:
    root = os.environ.get(CACHE_ENV, "")
    if root.lower() == "off":
        return None
    return (Path(root) if root else Path.home() / ".cache" / "m3lab") / "dispatch"


@lru_cache(maxsize=1)
def resolver_fingerprint() -> str:
    """Hash of the resolver's sources and vLLM's version: part of every disk-cache key."""
    import importlib.metadata as md
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for pkg in _SOURCES:
        for p in sorted((root / pkg).rglob("*.py")):
            h.update(p.relative_to(root).as_posix().encode())
            h.update(p.read_bytes())
    try:
        h.update(md.version("vllm").encode())
    except md.PackageNotFoundError:
        h.update(b"no-vllm")
    return h.hexdigest()[:16]


def _disk_path(key: str) -> Path | None:
    root = _cache_dir()
    return None if root is None else root / f"{key[:24]}-{resolver_fingerprint()}.json"


def _read_disk(key: str) -> Dispatch | None:
    p = _disk_path(key)
    if p is None or not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
        choices = {ph: {(c["op"], c["layer_kind"]): PathChoice(**{**c, "kernels": tuple(c["kernels"])})
                        for c in data["choices"][ph]} for ph in PHASES}
        return Dispatch(hardware=data["hardware"], choices=choices, tokens=data["tokens"],
                        **{k: data["plan"][k] for k in _PLAN_FIELDS})
    except (OSError, ValueError, KeyError, TypeError):  # a damaged entry is resolved again and rewritten
        return None


def _write_disk(key: str, d: Dispatch) -> None:
    p = _disk_path(key)
    if p is None:
        return
    data = {"hardware": d.hardware, "tokens": d.tokens, "plan": {k: getattr(d, k) for k in _PLAN_FIELDS},
            "choices": {ph: [{f: (list(getattr(c, f)) if f == "kernels" else getattr(c, f)) for f in _FIELDS}
                             for c in d.choices[ph].values()] for ph in PHASES}}
    try:
        write_text(p, json.dumps(data))
    except OSError:   # a read-only home: the process cache still holds it
        pass
