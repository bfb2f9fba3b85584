"""Per-kernel-kind defaults of the cost model: launch/latency floors and achievable fractions.

These apply where no measured table calibrates a kind (every kind but GEMMs on a calibrated
hardware profile). They are stated assumptions, each with the measurement that suggests it, and
every projection that uses them says so (``Calibration.label``).

- ``FLOOR_US``: the least time one kernel of the kind takes on a GPU with CUDA/HIP-graph replay
  (no CPU launch), whatever its size.
- ``ACHIEVABLE``: the fraction of the roofline bound an optimised kernel of the kind reaches.
- ``FUSED_INTO``: ops that vLLM runs inside a neighbouring kernel (no floor of their own).
"""
from __future__ import annotations

FLOOR_US: dict[str, float] = {
    "gemm": 4.0,           # MI355X AITER fp8 table: min 5.24 µs at a 1.6 µs roofline (M=4, N=6144, K=2048)
    "lm_head": 4.0,        # a GEMM
    "grouped_gemm": 8.0,   # H200 graph-replayed torch._grouped_mm at T=1 is 80 µs; tuned MoE kernels ~2 launches
    "attention": 4.0,      # H200 graph-replayed SDPA decode B=1, L=8K: 9.2 µs for 0.5 µs of bytes
    "indexer": 4.0,        # same class of kernel as attention
    "topk": 3.0,           # assumed: one small reduction kernel
    "router": 3.0,         # assumed: a tiny fp32 GEMM plus sigmoid/top-k
    "norm": 2.0,           # assumed: elementwise kernel minimum under graph replay
    "rope": 2.0,
    "activation": 2.0,
    "embedding": 2.0,
    "allreduce": 8.0,      # assumed: one-shot custom all-reduce latency on one node (IF / NVLink)
    "allgather": 8.0,
    "all2all": 15.0,       # assumed: EP dispatch or combine on one node
    "kv_transfer": 20.0,   # assumed: one P/D KV hand-off message
    "cache_write": 2.0,    # assumed: reshape_and_cache, an elementwise scatter (fused into qk_norm where listed below)
    "quant": 2.0,          # assumed: dynamic activation quantisation is an elementwise kernel (norm class)
    "moe_align": 4.0,      # assumed: vLLM moe_align_block_size is a small multi-phase (count, scan, scatter) kernel
    "moe_sum": 2.0,        # assumed: top-k weighted sum, an elementwise reduction kernel
    "linear_attention": 6.0,  # assumed: gated-delta-rule recurrent decode kernel (one launch per layer)
    "conv": 2.0,           # assumed: causal depthwise conv1d update, elementwise class
}
DEFAULT_FLOOR_US = 2.0

ACHIEVABLE: dict[str, float] = {
    "gemm": 0.45,          # uncalibrated hardware: median of the MI355X AITER fp8 table's efficiency
    "lm_head": 0.45,
    "grouped_gemm": 0.45,  # H200 torch._grouped_mm: 1.76-2.95 TB/s of 4.8 (0.37-0.61)
    "attention": 0.70,     # H200 dense SDPA decode 3.4-4.4 TB/s of 4.8
    "indexer": 0.70,
    "topk": 0.30,          # assumed
    "router": 0.30,        # assumed
    "norm": 0.60,          # H200 torch.sum 3.8 TB/s of 4.8 (0.79), less for small tensors
    "rope": 0.60,
    "activation": 0.60,
    "embedding": 0.60,
    "allreduce": 0.70,     # assumed fraction of the one-way link bandwidth
    "allgather": 0.70,
    "all2all": 0.60,
    "kv_transfer": 0.70,
    "cache_write": 0.60,   # assumed: elementwise
    "quant": 0.60,         # assumed: as the other elementwise kernels
    "moe_align": 0.30,     # assumed: latency-bound bookkeeping, like top-k
    "moe_sum": 0.60,       # assumed: elementwise
    "linear_attention": 0.50,  # assumed: state read + write dominated; less streamlined than attention
    "conv": 0.60,          # assumed: elementwise
}
DEFAULT_ACHIEVABLE = 0.5

# op -> the op whose kernel it runs inside: on AMD vLLM fuses the post-attention residual add + Gemma norm into
# the all-reduce (the FFN all-reduce stays separate and the next layer's input norm is its own fused add + norm
# kernel, vllm/models/minimax_m3/amd/model.py:1366-1379), RoPE (and, with AITER, the KV cache write) into the q/k-norm kernel, the M3 index top-k into the
# indexer's scoring kernel, and the MoE activation into the fused-MoE stage-1 kernel.
FUSED_INTO: dict[str, str] = {
    "post_attn_norm": "allreduce_attn",
    "rope": "qk_norm",
    "cache_write": "qk_norm",
    "topk": "indexer",
    "moe_act": "moe_gate_up",
}


def floor_us(kind: str) -> float:
    """The launch/latency floor of one kernel of ``kind`` in µs."""
    return FLOOR_US.get(kind, DEFAULT_FLOOR_US)


def achievable(kind: str) -> float:
    """The default achievable fraction of the roofline bound for ``kind``."""
    return ACHIEVABLE.get(kind, DEFAULT_ACHIEVABLE)
