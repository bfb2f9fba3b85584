"""A Deployment's traffic and limits as the scheduler's inputs: :class:`~m3lab.workload.scheduler.SchedulerConfig`
from ``Deployment.limits`` (or a P/D role's), :class:`~m3lab.workload.scheduler.Workload` from
``Deployment.workload``."""
from __future__ import annotations

from m3lab.errors import M3LabError
from m3lab.workload.scheduler import SchedulerConfig, Workload


def scheduler_config(deployment, *, role: str | None = None, block_size: int = 128,
                     num_kv_blocks: int | None = None) -> SchedulerConfig:
    """vLLM's engine limits of ``deployment`` (of one P/D ``role`` when given), resolved for its hardware."""
    lim = deployment.role_limits(role) if role else deployment.scheduler_limits()
    return SchedulerConfig(max_num_seqs=lim.max_num_seqs, max_num_batched_tokens=lim.max_num_batched_tokens,
                           chunked_prefill=lim.chunked_prefill, block_size=block_size, num_kv_blocks=num_kv_blocks)


def fixed_workload(deployment, *, osl: int | None = None, what: str = "this estimate") -> Workload:
    """The fixed-length closed loop of ``deployment.workload`` (``osl`` replaces the output length, e.g. the
    verification steps of speculative decoding). Refuses what a fixed closed loop cannot honour."""
    wl = deployment.workload
    if wl.kind != "fixed":
        raise M3LabError(f"{what} needs a fixed-length workload, got workload={wl.kind}", field="workload",
                         hint="use workload=fixed, or the agentic estimate (m3lab estimate --workload agentx)")
    if wl.request_rate is not None:
        raise M3LabError(f"{what} runs a closed loop at the concurrency (vllm bench's default, request_rate inf); "
                         f"request_rate={wl.request_rate} is not modelled", field="request_rate",
                         hint="leave request_rate unset")
    return Workload(isl=wl.isl, osl=wl.osl if osl is None else osl, concurrency=wl.concurrency,
                    num_requests=wl.num_prompts, seed=wl.seed)
