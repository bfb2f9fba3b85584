"""Memory per GPU: weights, KV capacity in tokens at a memory-utilisation setting, largest concurrency.

vLLM gives the KV cache what is left of ``gpu_memory_utilization × HBM`` after the weights and the
activation/workspace peak of its profiling run (``RESERVE_BYTES`` here, an assumption). KV is
allocated in blocks of ``block_size`` tokens (128 for MiniMax M3), so a request of ``isl + osl``
tokens holds ``ceil((isl + osl) / block_size)`` blocks. Models with linear-attention layers (Qwen3.5) also
hold a fixed-size recurrent state per request (``state_bytes_per_request_per_gpu``, independent of the
context length): it comes out of the same pool, so the largest concurrency is
``free // (tokens_per_request * kv_bytes_per_token + state_bytes_per_request)`` and ``kv_capacity_tokens``
is what remains for KV once that many requests' state is reserved. With speculative decoding vLLM keeps
one state slot per verified position (``1 + spec_tokens`` per request), so the state counts that many times.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from m3lab.errors import M3LabError
from m3lab.spec.limits import VLLM_GPU_MEMORY_UTILIZATION as GPU_MEMORY_UTILIZATION  # vLLM's default
from m3lab.spec.memory import kv_bytes, state_bytes_per_request, weight_bytes_per_gpu
from m3lab.spec.quant import load_quant

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
    max_concurrency: int             # requests whose whole KV (and recurrent state) fits at once
    state_bytes_per_request_per_gpu: float = 0.0   # linear-attention state per request (0 for pure attention)

    def as_dict(self) -> dict:
        return asdict(self)

    def check(self, concurrency: int) -> None:
        """Raise M3LabError when ``concurrency`` requests' KV does not fit."""
        need = concurrency * self.tokens_per_request
        if need > self.kv_capacity_tokens or concurrency > self.max_concurrency:
            state = (f" plus {self.state_bytes_per_request_per_gpu / 1e6:.0f} MB of recurrent state per request"
                     if self.state_bytes_per_request_per_gpu else "")
            raise M3LabError(
                f"concurrency {concurrency} needs {need:,} KV tokens per GPU{state} but only "
                f"{self.kv_capacity_tokens:,} fit at gpu_memory_utilization {self.gpu_memory_utilization} "
                f"(weights {self.weight_bytes_per_gpu / 1e9:.1f} GB/GPU)", field="concurrency",
                hint=f"the largest that fits is {self.max_concurrency}; lower the concurrency, raise tp, or use an "
                     f"fp8 KV cache: kv_dtype fp8 (m3lab estimate --kv-dtype fp8, m3lab run -p kv_dtype=fp8)")


MLA_SPARSE_BLOCK = 64         # DSA (token-level sparse MLA) KV block: vLLM's sparse FlashMLA page size


def block_size_of(model) -> int:
    """KV block size the model fixes (M3: the sparse block, 128 tokens; DSA: 64), else vLLM's default."""
    sp = getattr(model, "sparse", None)
    if sp is None:
        return DEFAULT_BLOCK
    return MLA_SPARSE_BLOCK if getattr(sp, "style", "block") == "dsa" else sp.block_size


def capacity(model, plan, quant, hw, *, isl: int, osl: int,
             gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION, reserve_bytes: float = RESERVE_BYTES,
             spec_tokens: int = 0) -> Capacity:
    """Weights per GPU, KV capacity in tokens and the largest concurrency that fits (see module docstring)."""
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
    per_req = math.ceil((isl + osl) / block) * block
    state = float(state_bytes_per_request(model, plan)) * (1 + max(int(spec_tokens or 0), 0))
    max_conc = int(free // (per_req * kv_tok + state))
    cap_tokens = int((free - max_conc * state) // (kv_tok * block)) * block
    return Capacity(hbm_bytes=hw.hbm_bytes, gpu_memory_utilization=gpu_memory_utilization,
                    weight_bytes_per_gpu=weights, reserve_bytes=reserve_bytes, kv_bytes_per_token_per_gpu=kv_tok,
                    kv_capacity_tokens=cap_tokens, block_size=block, tokens_per_request=per_req,
                    max_concurrency=min(max_conc, cap_tokens // per_req), state_bytes_per_request_per_gpu=state)
