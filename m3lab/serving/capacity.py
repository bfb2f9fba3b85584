"""Memory per GPU: weights, KV capacity in tokens at a memory-utilisation setting, largest concurrency.

vLLM gives the KV cache what is left of ``gpu_memory_utilization × HBM`` after the weights and the
activation/workspace peak of its profiling run (``RESERVE_BYTES`` here, an assumption). KV is
allocated in blocks of ``block_size`` tokens (128 for MiniMax M3), so a request of ``isl + osl``
tokens holds ``ceil((isl + osl) / block_size)`` blocks.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from m3lab.errors import M3LabError

GPU_MEMORY_UTILIZATION = 0.9   # vLLM's default --gpu-memory-utilization
RESERVE_BYTES = 4 * 2**30      # assumed activation peak + CUDA/HIP graph pools + workspace per GPU
DEFAULT_BLOCK = 16             # vLLM's default KV block when the model does not fix one


@dataclass(frozen=True)
class Capacity:
    """Bytes per GPU and the KV capacity they leave."""

    hbm_bytes: float
    gpu_memory_utilization: float
    weight_bytes_per_gpu: float
    reserve_bytes: float
    kv_bytes_per_token_per_gpu: float
    kv_capacity_tokens: int
    block_size: int
    tokens_per_request: int          # isl + osl rounded up to whole blocks
    max_concurrency: int             # requests whose whole KV fits at once

    def as_dict(self) -> dict:
        return asdict(self)

    def check(self, concurrency: int) -> None:
        """Raise M3LabError when ``concurrency`` requests' KV does not fit."""
        need = concurrency * self.tokens_per_request
        if need > self.kv_capacity_tokens:
            raise M3LabError(
                f"concurrency {concurrency} needs {need:,} KV tokens per GPU but only {self.kv_capacity_tokens:,} "
                f"fit at gpu_memory_utilization {self.gpu_memory_utilization} "
                f"(weights {self.weight_bytes_per_gpu / 1e9:.1f} GB/GPU)", field="concurrency",
                hint=f"the largest that fits is {self.max_concurrency}; lower --concurrency, raise --tp, "
                     f"or use an fp8 KV cache")


def block_size_of(model) -> int:
    """KV block size the model fixes (M3: the sparse block, 128 tokens), else vLLM's default."""
    return model.sparse.block_size if getattr(model, "sparse", None) else DEFAULT_BLOCK


def capacity(model, plan, quant, hw, *, isl: int, osl: int,
             gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION, reserve_bytes: float = RESERVE_BYTES) -> Capacity:
    """Weights per GPU, KV capacity in tokens and the largest concurrency that fits (see module docstring)."""
    from m3lab.spec.memory import kv_bytes, weight_bytes_per_gpu
    from m3lab.spec.quant import load_quant

    if not 0 < gpu_memory_utilization <= 1:
        raise M3LabError(f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]",
                         field="gpu_memory_utilization")
    for name, v in (("isl", isl), ("osl", osl)):
        if not isinstance(v, int) or v < 1:
            raise M3LabError(f"{name}={v!r} must be a positive integer", field=name)
    q = load_quant(quant)
    weights = weight_bytes_per_gpu(model, plan, q)
    kv_tok = kv_bytes(model, q.kv_dtype, q.index_dtype, plan).total
    free = gpu_memory_utilization * hw.hbm_bytes - weights - reserve_bytes
    if free <= 0:
        raise M3LabError(f"{model.name} weights ({weights / 1e9:.1f} GB/GPU at tp={plan.tp}, {q.name}) leave no room "
                         f"for KV on {hw.name} ({hw.hbm_bytes / 1e9:.0f} GB × {gpu_memory_utilization})",
                         field="tp", hint="raise --tp or use a smaller quantisation")
    block = block_size_of(model)
    cap_tokens = int(free // (kv_tok * block)) * block
    per_req = math.ceil((isl + osl) / block) * block
    return Capacity(hbm_bytes=hw.hbm_bytes, gpu_memory_utilization=gpu_memory_utilization,
                    weight_bytes_per_gpu=weights, reserve_bytes=reserve_bytes, kv_bytes_per_token_per_gpu=kv_tok,
                    kv_capacity_tokens=cap_tokens, block_size=block, tokens_per_request=per_req,
                    max_concurrency=cap_tokens // per_req)
