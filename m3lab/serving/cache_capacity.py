"""KV blocks per rank for the cache simulator, from the memory model (nothing recomputed here).

:func:`m3lab.serving.capacity.capacity` gives the KV capacity in tokens per GPU: ``gpu_memory_utilization
× HBM`` minus the weights per GPU (:func:`m3lab.spec.memory.weight_bytes_per_gpu`) and the activation /
workspace reserve, divided by the KV + index-key bytes per token per rank of the model and plan
(:func:`m3lab.spec.memory.kv_bytes`), in whole blocks of the model's block size (128 for MiniMax M3).
vLLM's ``num_gpu_blocks`` is that many blocks; block 0 of them is the null block, so ``num_blocks - 1``
blocks hold KV (as :class:`~m3lab.cache.pool.PrefixCache` counts them). Every TP rank holds the same
blocks, so one rank's pool stands for the replica.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from m3lab.errors import M3LabError
from m3lab.serving.capacity import capacity
from m3lab.spec.limits import VLLM_GPU_MEMORY_UTILIZATION as GPU_MEMORY_UTILIZATION


MAX_SIM_BLOCKS = 1 << 24   # the simulator's block table: ~16.8 M blocks take ~250 MB (arrays and a list per block)


def check_sim_capacity(tokens: float | None, block_size: int, field: str = "capacity_tokens") -> None:
    """Raise M3LabError when a finite KV capacity needs more blocks than the simulator holds (MAX_SIM_BLOCKS);
    None (unlimited) is always fine: an unlimited pool grows with what is cached."""
    if tokens is None or tokens == float("inf"):
        return
    if tokens / block_size > MAX_SIM_BLOCKS:
        raise M3LabError(f"{field}={tokens:.4g} tokens is more than the simulator's limit of "
                         f"{MAX_SIM_BLOCKS * block_size:,} ({MAX_SIM_BLOCKS:,} blocks of {block_size})", field=field,
                         hint="use inf (or None) for an unlimited cache")


@dataclass(frozen=True)
class CacheCapacity:
    """Blocks of one rank's KV pool and where they come from."""

    num_blocks: int                     # vLLM's num_gpu_blocks (null block included)
    block_size: int
    kv_capacity_tokens: int             # num_blocks * block_size
    kv_bytes_per_token_per_gpu: float
    weight_bytes_per_gpu: float
    gpu_memory_utilization: float
    hbm_bytes: float

    def with_tokens(self, tokens: int) -> CacheCapacity:
        """The same pool resized to ``tokens`` of KV (a what-if on capacity)."""
        if not isinstance(tokens, int) or tokens < 2 * self.block_size:
            raise M3LabError(f"capacity_tokens={tokens!r} must be an integer of at least two blocks",
                             field="capacity_tokens")
        n = tokens // self.block_size
        return replace(self, num_blocks=n, kv_capacity_tokens=n * self.block_size)

    def as_dict(self) -> dict:
        return asdict(self)


def cache_capacity(model, plan, quant, hw, *, gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                   spec_tokens: int = 0) -> CacheCapacity:
    """One rank's KV pool for ``model`` under ``plan`` and ``quant`` on ``hw`` (see module docstring)."""
    cap = capacity(model, plan, quant, hw, isl=1, osl=1, gpu_memory_utilization=gpu_memory_utilization,
                   spec_tokens=spec_tokens)
    n = cap.kv_capacity_tokens // cap.block_size
    return CacheCapacity(num_blocks=n, block_size=cap.block_size, kv_capacity_tokens=n * cap.block_size,
                         kv_bytes_per_token_per_gpu=cap.kv_bytes_per_token_per_gpu,
                         weight_bytes_per_gpu=cap.weight_bytes_per_gpu,
                         gpu_memory_utilization=gpu_memory_utilization, hbm_bytes=cap.hbm_bytes)
