"""vLLM's scheduler and memory limits of a deployment (:class:`SchedulerLimits`), with vLLM 0.33.0's defaults.

``max_num_seqs`` and ``max_num_batched_tokens`` have no single default in vLLM: ``vllm serve`` takes them from
``EngineArgs.get_batch_defaults`` (``vllm/engine/arg_utils.py``) by the GPU's memory — 1024 sequences on any GPU
with 70 GiB or more (not A100), and a token budget of 16384 from 160 GiB up (MI300X, MI325X, MI355X, B200),
8192 from 70 GiB (H200). ``None`` in the record means "what vLLM resolves for this hardware"
(:meth:`SchedulerLimits.resolved`): :data:`VLLM_SERVE_BATCH_DEFAULTS` holds vLLM's answer for the shipped
hardware profiles (a test asks vLLM's own function for each), and :func:`vllm_batch_defaults` asks vLLM for
any other profile. The other defaults: ``gpu_memory_utilization`` 0.92 (``vllm/config/cache.py``
``CacheConfig``), chunked prefill and prefix caching on for generative decoder models
(``EngineArgs._set_default_chunked_prefill_and_prefix_caching_args``), async scheduling on unless an option
excludes it (``vllm/config/vllm.py`` ``VllmConfig.__post_init__``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

from m3lab.errors import M3LabError

VLLM_GPU_MEMORY_UTILIZATION = 0.92   # vllm/config/cache.py CacheConfig.gpu_memory_utilization

#: (max_num_seqs, max_num_batched_tokens) that ``vllm serve`` (UsageContext.OPENAI_API_SERVER) picks on each
#: shipped hardware profile: vLLM's ``EngineArgs.get_batch_defaults`` (tested against it).
VLLM_SERVE_BATCH_DEFAULTS: Mapping[str, tuple[int, int]] = {
    "mi355x": (1024, 16384), "mi325x": (1024, 16384), "mi300x": (1024, 16384), "b200": (1024, 16384),
    "h200": (1024, 8192),
}


class _PlatformStandIn:
    """What ``EngineArgs.get_batch_defaults`` asks ``current_platform``: memory, name, capability, kind."""

    def __init__(self, hbm_bytes: float, name: str):
        self.hbm_bytes, self.name = int(hbm_bytes), name

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return self.hbm_bytes

    def get_device_name(self, device_id: int = 0) -> str:
        return self.name

    def is_device_capability(self, capability, device_id: int = 0) -> bool:
        return False

    def is_tpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False


def vllm_batch_defaults(hardware) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) of ``vllm serve`` on ``hardware``, from vLLM's own
    ``EngineArgs.get_batch_defaults`` with ``current_platform`` standing for that GPU (imports vLLM: seconds)."""
    from m3lab.vllm_src.imports import vllm_module  # heavy: imports vLLM's engine arguments

    args = vllm_module("vllm.engine.arg_utils")
    usage = vllm_module("vllm.usage.usage_lib").UsageContext.OPENAI_API_SERVER
    saved = args.current_platform
    args.current_platform = _PlatformStandIn(hardware.hbm_bytes, hardware.name)
    try:
        tokens, seqs = args.EngineArgs.get_batch_defaults(world_size=1)
    finally:
        args.current_platform = saved
    return int(seqs[usage]), int(tokens[usage])


@dataclass(frozen=True)
class SchedulerLimits:
    """vLLM's engine limits (``vllm serve`` flags in the comments); ``None``: vLLM's default for the hardware."""

    max_num_seqs: int | None = None            # --max-num-seqs
    max_num_batched_tokens: int | None = None  # --max-num-batched-tokens
    chunked_prefill: bool = True               # --enable-chunked-prefill / --no-enable-chunked-prefill
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION  # --gpu-memory-utilization
    prefix_caching: bool = True                # --enable-prefix-caching / --no-enable-prefix-caching
    async_scheduling: bool = True              # --async-scheduling / --no-async-scheduling

    def validate(self, prefix: str = "") -> SchedulerLimits:
        """Raise M3LabError naming the field when a value is out of range; return self."""
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise M3LabError(f"{prefix}{name} must be a positive integer, got {v!r}", field=prefix + name)
        for name in ("chunked_prefill", "prefix_caching", "async_scheduling"):
            if not isinstance(getattr(self, name), bool):
                raise M3LabError(f"{prefix}{name} must be true or false", field=prefix + name)
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or isinstance(u, bool) or not 0 < u <= 1:
            raise M3LabError(f"{prefix}gpu_memory_utilization={u!r} must be in (0, 1]",
                             field=prefix + "gpu_memory_utilization", hint="vLLM's default is 0.92")
        return self

    def resolved(self, hardware) -> SchedulerLimits:
        """These limits with ``None`` replaced by what ``vllm serve`` picks on ``hardware``."""
        if self.max_num_seqs is not None and self.max_num_batched_tokens is not None:
            return self
        seqs, tokens = VLLM_SERVE_BATCH_DEFAULTS.get(hardware.name) or vllm_batch_defaults(hardware)
        tokens = self.max_num_batched_tokens or tokens
        if self.max_num_seqs is None:  # vLLM caps it at the token budget (EngineArgs.
            # _set_default_max_num_seqs_and_batched_tokens_args)
            seqs = min(seqs, tokens)
        return dataclasses.replace(self, max_num_seqs=self.max_num_seqs or seqs, max_num_batched_tokens=tokens)
