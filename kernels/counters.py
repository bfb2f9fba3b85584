"""Per-device buffers that are zero when made and that the kernels leave zero after each call.

Split-K arrival counters (kernels/gemm), stream-K tile sums and the sparse-attention merge counters live in
such buffers: a kernel counts arrivals with atomics and the last arrival resets its slot, so CUDA-graph
replays need no memset. A buffer that is outgrown is kept alive (:data:`OUTGROWN`), never freed: a CUDA graph
captured with it (vLLM captures one per batch size) keeps launching kernels on its address. New buffers at
least double, so the kept ones add up to less than the newest.
"""
import torch

OUTGROWN: list[torch.Tensor] = []     # outgrown buffers: graphs may still use them
MIN_ELEMENTS = 4096


def zeroed(pool: dict, device: torch.device, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``pool[device]``, grown (zero-filled) to at least n elements when needed."""
    buf = pool.get(device)
    if buf is None or buf.numel() < n:
        if buf is not None:
            OUTGROWN.append(buf)
        buf = torch.zeros(max(n, MIN_ELEMENTS, 2 * (buf.numel() if buf is not None else 0)), dtype=dtype,
                          device=device)
        pool[device] = buf
    return buf
