"""Per-op row formulas: FLOPs and bytes of one op on one GPU for one step (rows of the OpTable).

Each function returns a dict of OpTable columns (see :mod:`m3lab.optable`). Conventions:
- GEMM y[m, n] = x[m, k] @ w[n, k]^T: flops 2mnk; bytes_weight = n*k weights (+ MX scales);
  bytes_compute = x read (in the GEMM's activation dtype, + MX activation scales) + y written (bf16).
- Norms/activations/rope: memory-bound elementwise; a few FLOPs per element.
- Norms read their weight vector (bf16) into ``bytes_weight``.
- Dynamic activation quantisation (``act_quant``, kind "quant") before a GEMM with quantised weights:
  reads x [m, k] bf16, writes x [m, k] in the GEMM's activation dtype plus its scales (MX/NVFP4: one scale byte
  per block of k; fp8: one fp32 scale per row, per-token dynamic).
- All-reduce of P bytes over p ranks (ring): 2(p-1)/p * P on the wire per GPU; gather: (p-1)/p * P.
- ``bytes_compute_written`` / ``bytes_kv_written``: what of ``bytes_compute`` / ``bytes_kv`` is written (a GEMM's
  y, a norm's outputs, a cache write); the rest is read.
"""
from __future__ import annotations

from m3lab.errors import M3LabError
from m3lab.spec.dtypes import QUANTIZED, dtype_bytes, gemm_act_dtype, scale_bytes
from m3lab.spec.gemm_cost import gemm_cost

# The OpTable's columns, in order (meanings and units: m3lab.optable). Rows may leave any of them out (NaN).
COLUMNS = ("layer", "op", "kind", "m", "n", "k", "experts", "topk", "hidden", "inter", "routed_tokens",
           "experts_active", "tokens_per_expert_max", "q_tokens", "ctx_tokens", "keys_attended",
           "selected_blocks", "heads_q", "heads_kv", "head_dim", "act_dtype", "w_dtype", "flops",
           "bytes_compute", "bytes_weight", "bytes_kv", "bytes_comm", "bytes_compute_written", "bytes_kv_written",
           "comm_payload", "comm_factor", "comm_algo", "comm_group", "fused_into", "requests", "phase", "decision",
           "path", "kernel")
_KNOWN = frozenset(COLUMNS)
ACT = "bf16"
OUT_BYTES = dtype_bytes(ACT)


def check_columns(cols) -> None:
    """Raise M3LabError naming any key of ``cols`` that is not an OpTable column (a misspelt column)."""
    unknown = sorted(set(cols) - _KNOWN)
    if unknown:
        raise M3LabError(f"OpTable row has unknown column(s) {unknown}", field="columns",
                         hint="use the names in m3lab.optable.ops.COLUMNS")


def row(op: str, kind: str, **cols) -> dict:
    """One OpTable row; every keyword must be a column of :data:`COLUMNS` (missing ones become NaN)."""
    check_columns(cols)
    return {"op": op, "kind": kind, **cols}


def needs_act_quant(w_dtype: str) -> bool:
    """True when a GEMM with weights ``w_dtype`` consumes a dynamically quantised activation."""
    return gemm_act_dtype(w_dtype) in QUANTIZED


def act_quant(op: str, m: float, k: int, w_dtype: str) -> dict:
    """Quantise the input x [m, k] (bf16) of GEMM ``op`` to its activation dtype (see module docstring)."""
    a = gemm_act_dtype(w_dtype)
    scales = m * k * scale_bytes(a) if scale_bytes(a) else m * dtype_bytes("fp32")
    return row(f"{op}_quant", "quant", m=m, k=k, act_dtype=a, w_dtype=w_dtype, flops=4.0 * m * k,
               bytes_compute=m * k * (OUT_BYTES + dtype_bytes(a)) + scales, bytes_weight=0.0, bytes_kv=0.0,
               bytes_comm=0.0, bytes_compute_written=m * k * dtype_bytes(a) + scales, bytes_kv_written=0.0)


def dequant(op: str, experts: int, n: int, k: int, w_dtype: str) -> dict:
    """Dequantise ``experts`` local experts' weights w [experts, n, k] of GEMM ``op`` from ``w_dtype`` (+ its MX
    scales) to BF16, the whole tensor at once (what vLLM's OCP MX emulation of the experts does every forward)."""
    elems = float(experts) * n * k
    return row(f"{op}_dequant", "quant", m=experts, n=n, k=k, act_dtype=ACT, w_dtype=w_dtype, flops=elems,
               bytes_compute=elems * OUT_BYTES, bytes_weight=elems * (dtype_bytes(w_dtype) + scale_bytes(w_dtype)),
               bytes_kv=0.0, bytes_comm=0.0, bytes_compute_written=elems * OUT_BYTES, bytes_kv_written=0.0)


def gemm(op: str, m: float, n: int, k: int, w_dtype: str, kind: str = "gemm") -> dict:
    """A GEMM y[m, n] = x[m, k] w[n, k]^T as vLLM runs it: activations in :func:`gemm_act_dtype` of the weights."""
    a_dtype = gemm_act_dtype(w_dtype)
    c = gemm_cost(m, n, k, w_dtype, a_dtype, out_dtype="fp32" if a_dtype == "fp32" else ACT)
    return row(op, kind, m=m, n=n, k=k, act_dtype=a_dtype, w_dtype=w_dtype, flops=c.flops,
               bytes_compute=c.bytes_compute, bytes_weight=c.bytes_weight, bytes_kv=0.0, bytes_comm=0.0,
               bytes_compute_written=c.bytes_out, bytes_kv_written=0.0)


def grouped_gemm(op: str, routed: float, n: int, k: int, w_dtype: str, *, experts: int, topk: int, hidden: int,
                 inter: int, active_experts: float, max_load: float) -> dict:
    """A MoE grouped GEMM over ``routed`` (token, expert) rows; weights of the ``active_experts`` touched
    experts are read (``Routing.active_experts``)."""
    a_dtype = gemm_act_dtype(w_dtype)
    c = gemm_cost(routed, n, k, w_dtype, a_dtype, out_dtype="fp32" if a_dtype == "fp32" else ACT,
                  weights_read=active_experts)
    return row(op, "grouped_gemm", m=routed, n=n, k=k, act_dtype=a_dtype, w_dtype=w_dtype, flops=c.flops,
               bytes_compute=c.bytes_compute, bytes_weight=c.bytes_weight, bytes_kv=0.0, bytes_comm=0.0,
               bytes_compute_written=c.bytes_out, bytes_kv_written=0.0, experts=experts, topk=topk, hidden=hidden, inter=inter, routed_tokens=routed,
               experts_active=active_experts, tokens_per_expert_max=max_load)


def elementwise(op: str, kind: str, elements: float, *, reads: float, writes: float, flops_per: float,
                weight_elems: float = 0.0, **cols) -> dict:
    """Memory-bound op over ``elements`` values: ``reads``/``writes`` tensors of that size in bf16; a norm reads
    its ``weight_elems`` bf16 weights (into ``bytes_weight``)."""
    return row(op, kind, m=cols.pop("m", float("nan")), act_dtype=ACT, flops=flops_per * elements,
               bytes_compute=(reads + writes) * elements * OUT_BYTES, bytes_weight=weight_elems * OUT_BYTES,
               bytes_kv=0.0, bytes_comm=0.0, bytes_compute_written=writes * elements * OUT_BYTES,
               bytes_kv_written=0.0, **cols)


def moe_align(routed: float, tokens: float, topk: int, expert_rows: int) -> dict:
    """Sort the (token, expert) pairs by expert (vLLM ``moe_align_block_size``): reads the top-k ids [T, topk]
    int32, writes sorted row ids [routed] and per-expert offsets [expert_rows + 1] int32 (tile padding ignored)."""
    i32 = dtype_bytes("int32")
    return row("moe_align", "moe_align", m=tokens, topk=topk, routed_tokens=routed, act_dtype="int32",
               flops=0.0, bytes_compute=tokens * topk * i32 + routed * i32 + (expert_rows + 1) * i32,
               bytes_weight=0.0, bytes_kv=0.0, bytes_comm=0.0,
               bytes_compute_written=routed * i32 + (expert_rows + 1) * i32, bytes_kv_written=0.0)


def moe_sum(routed: float, tokens: float, hidden: int, topk: int) -> dict:
    """Top-k combine: y[t] = sum_j w[t, j] * out[t, j] — reads the [routed, H] expert outputs and the fp32
    routing weights, writes [T, H] (vLLM ``moe_sum``; ``routed`` rows include a fused shared expert's)."""
    return row("moe_sum", "moe_sum", m=tokens, n=hidden, topk=topk, routed_tokens=routed, act_dtype=ACT,
               flops=2.0 * routed * hidden,
               bytes_compute=routed * hidden * OUT_BYTES + routed * dtype_bytes("fp32") + tokens * hidden * OUT_BYTES,
               bytes_weight=0.0, bytes_kv=0.0, bytes_comm=0.0, bytes_compute_written=tokens * hidden * OUT_BYTES,
               bytes_kv_written=0.0)


def allreduce(op: str, tokens: float, hidden: int, group: int) -> dict:
    payload = tokens * hidden * OUT_BYTES
    factor = 2.0 * (group - 1) / group
    return row(op, "allreduce", m=tokens, n=hidden, act_dtype=ACT, flops=tokens * hidden * (group - 1) / group,
               bytes_compute=2.0 * payload, bytes_weight=0.0, bytes_kv=0.0, bytes_comm=factor * payload,
               bytes_compute_written=payload, bytes_kv_written=0.0, comm_payload=payload, comm_factor=factor, comm_algo="ring", comm_group=group)


def gather(op: str, rows: float, width_total: int, group: int, dtype: str = ACT) -> dict:
    payload = rows * width_total * dtype_bytes(dtype)
    factor = (group - 1) / group
    return row(op, "allgather", m=rows, n=width_total, act_dtype=dtype, flops=0.0, bytes_compute=payload,
               bytes_weight=0.0, bytes_kv=0.0, bytes_comm=factor * payload, bytes_compute_written=payload,
               bytes_kv_written=0.0, comm_payload=payload,
               comm_factor=factor, comm_algo="gather", comm_group=group)


def all2all(op: str, rows: float, hidden: int, group: int) -> dict:
    payload = rows * hidden * OUT_BYTES
    factor = (group - 1) / group
    return row(op, "all2all", m=rows, n=hidden, act_dtype=ACT, flops=0.0, bytes_compute=payload,
               bytes_weight=0.0, bytes_kv=0.0, bytes_comm=factor * payload, bytes_compute_written=payload,
               bytes_kv_written=0.0, comm_payload=payload,
               comm_factor=factor, comm_algo="all2all", comm_group=group)
