"""A Deployment as the scheduler's inputs: :class:`~m3lab.workload.scheduler.SchedulerConfig` from the record's
limits, switches and speculative config (or a P/D role's), the fixed-length requests of ``Deployment.workload``
as vllm bench sends them, and the fake model's draft acceptance from ``Deployment.acceptance``.

Speculative methods, as vLLM's scheduler sees them (``vllm/config/vllm.py``: ``num_lookahead_tokens``,
``num_prefill_lookahead_tokens``, ``num_hash_lookahead_tokens``; ``vllm/config/speculative.py`` ``use_eagle``):
EAGLE, EAGLE3 and M3's single-module MTP (``mtp``, ``minimax_m3_mtp``) all reserve k lookahead KV slots, never end
a prefill chunk one token short of the prompt, and key prefix-cache blocks one token past the block — the
generator's ``mtp``; ``ngram`` reserves nothing — its ``ngram``.

Acceptance: the fake model accepts each of the k drafts with one probability p until the first rejection
(:class:`~m3lab.workload.requests.FakeOutputs`), p chosen so that the mean tokens per verification (bonus
included) is the record's ``accept_len``: ``1 + p + p^2 + ... + p^k = accept_len``. That chain is a model of how
acceptances spread (named "assumed" in every output); the mean is the record's.
"""
from __future__ import annotations

from m3lab.errors import M3LabError
from m3lab.workload.requests import FakeOutputs, UniqueContents
from m3lab.workload.scheduler import SchedulerConfig, Workload

#: The record's speculative methods -> the step generator's (what vLLM's scheduler derives from each).
SCHEDULER_SPEC_METHOD = {"eagle": "mtp", "eagle3": "mtp", "mtp": "mtp", "minimax_m3_mtp": "mtp", "ngram": "ngram"}
#: Assumed mean tokens per EAGLE3 verification on agentic traffic when the record gives none (no measurement of
#: M3's drafts on agentic traffic exists; MT-Bench's published 2.70 is not carried over): shown as "assumed",
#: with its sensitivity, wherever it is used.
ASSUMED_AGENTIC_ACCEPT_LEN = 2.0
#: Its sensitivity range: a weak draft (1.5) to MT-Bench's published figure for M3 with 3 drafts (2.70).
AGENTIC_ACCEPT_LEN_RANGE = (1.5, 2.7)
ACCEPTANCE_MODEL = "chain: each draft accepted with one probability until the first rejection (assumed)"


def scheduler_config(deployment, *, role: str | None = None, block_size: int = 128,
                     num_kv_blocks: int | None = None) -> SchedulerConfig:
    """vLLM's engine of ``deployment`` (of one P/D ``role`` when given), resolved for its hardware: token and
    sequence limits, chunked prefill, prefix caching, async scheduling, the speculative method and k, the
    ``max_model_len``; ``num_kv_blocks``: vLLM's ``num_gpu_blocks`` (the null block included; None: unlimited)."""
    lim = deployment.role_limits(role) if role else deployment.scheduler_limits()
    sv = deployment.serving
    method = SCHEDULER_SPEC_METHOD.get(sv.spec_method) if sv.spec_tokens else None
    if sv.spec_tokens and method is None:
        raise M3LabError(f"spec_method {sv.spec_method!r} has no scheduler model", field="spec_method",
                         hint=f"use one of {', '.join(SCHEDULER_SPEC_METHOD)}")
    return SchedulerConfig(max_num_seqs=lim.max_num_seqs, max_num_batched_tokens=lim.max_num_batched_tokens,
                           chunked_prefill=lim.chunked_prefill, block_size=block_size, num_kv_blocks=num_kv_blocks,
                           prefix_caching=lim.prefix_caching, spec_method=method,
                           spec_tokens=sv.spec_tokens if method else 0, async_scheduling=lim.async_scheduling,
                           max_model_len=sv.max_model_len)


def chain_acceptance(accept_len: float, k: int) -> float:
    """The per-draft probability p with ``1 + p + ... + p^k = accept_len`` (bisection; exact to 1e-12)."""
    if not 1 <= accept_len <= k + 1:
        raise M3LabError(f"accept_len={accept_len!r} must lie in [1, spec_tokens + 1 = {k + 1}]", field="accept_len")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 1 + sum(mid ** j for j in range(1, k + 1)) < accept_len:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def check_spec(spec_tokens, accept_len, *, agentic: bool = False) -> None:
    """Refuse speculative settings the estimates cannot use: ``accept_len`` without ``spec_tokens``, a
    non-integer ``spec_tokens``, an ``accept_len`` outside [1, k + 1], or none for a fixed-length workload."""
    if not spec_tokens:
        if accept_len not in (None, 1, 1.0):
            raise M3LabError("accept_len needs spec_tokens > 0", field="accept_len", hint="pass --spec-tokens K")
        return
    if isinstance(spec_tokens, bool) or not isinstance(spec_tokens, int) or spec_tokens < 0:
        raise M3LabError(f"spec_tokens={spec_tokens!r} must be a non-negative integer", field="spec_tokens")
    if accept_len is None and not agentic:
        raise M3LabError(f"spec_tokens={spec_tokens} needs accept_len, the mean tokens emitted per verification step",
                         field="accept_len", hint=f"set accept_len in [1, {spec_tokens + 1}] (--accept-len A) and "
                                                  "its traffic (accept_dataset); published for EAGLE3 on M3 with 3 "
                                                  "draft tokens: 2.70 on MT-Bench (m3lab.serving.speculation)")
    if accept_len is not None and (isinstance(accept_len, bool) or not isinstance(accept_len, (int, float))
                                   or not 1 <= accept_len <= spec_tokens + 1):
        raise M3LabError(f"accept_len={accept_len!r} must lie in [1, spec_tokens + 1 = {spec_tokens + 1}]",
                         field="accept_len", hint="vLLM's mean acceptance length counts the bonus token")


def acceptance(deployment) -> tuple[float | None, str | None]:
    """(mean tokens per verification, its source in words) of ``deployment``: the record's, or for agentic traffic
    without one :data:`ASSUMED_AGENTIC_ACCEPT_LEN`; (None, None) without speculative decoding. A fixed-length
    workload with speculative decoding needs the record's value."""
    k, acc = deployment.serving.spec_tokens, deployment.acceptance
    agentic = deployment.workload.kind != "fixed"
    check_spec(k, acc.accept_len, agentic=agentic)
    if not k:
        return None, None
    if acc.accept_len is not None:
        return float(acc.accept_len), acc.source()
    return ASSUMED_AGENTIC_ACCEPT_LEN, (f"assumed {ASSUMED_AGENTIC_ACCEPT_LEN} (m3lab default for agentic traffic; "
                                       "no measurement exists)")


def fake_outputs(deployment, accept_len: float | None = None) -> FakeOutputs:
    """The fake model of ``deployment``: draft acceptance from ``accept_len`` (default :func:`acceptance`),
    seeded with the workload's seed."""
    k = deployment.serving.spec_tokens
    a = acceptance(deployment)[0] if accept_len is None else accept_len
    return FakeOutputs(p=chain_acceptance(a, k) if k else 0.0, seed=deployment.workload.seed)


def fixed_contents(deployment, *, what: str = "this estimate") -> UniqueContents:
    """``vllm bench serve --dataset-name random`` of ``deployment.workload``: ``num_prompts`` requests of ``isl``
    prompt tokens (no prefix shared) and ``osl`` output tokens (``--ignore-eos``). Refuses what a fixed closed
    loop cannot honour."""
    wl = deployment.workload
    if wl.kind != "fixed":
        raise M3LabError(f"{what} needs a fixed-length workload, got workload={wl.kind}", field="workload",
                         hint="use workload=fixed, or the agentic estimate (m3lab estimate --workload agentx)")
    if wl.request_rate is not None:
        raise M3LabError(f"{what} runs a closed loop at the concurrency (vllm bench's default, request_rate inf); "
                         f"request_rate={wl.request_rate} is not modelled", field="request_rate",
                         hint="leave request_rate unset")
    return UniqueContents([wl.isl] * wl.num_prompts, [wl.osl] * wl.num_prompts)


def fixed_workload(deployment, *, what: str = "this estimate") -> Workload:
    """The same closed loop as a :class:`~m3lab.workload.scheduler.Workload` (lengths, concurrency, requests)."""
    fixed_contents(deployment, what=what)
    wl = deployment.workload
    return Workload(isl=wl.isl, osl=wl.osl, concurrency=wl.concurrency, num_requests=wl.num_prompts, seed=wl.seed)
