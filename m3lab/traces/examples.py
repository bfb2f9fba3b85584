"""Synthetic MiniMax M3 dispatch traces, for tests, docs and demos without running the model.

:func:`write_synthetic_m3_trace` writes the calls of one decode step the way :mod:`m3lab.dispatch`
records them (its path names, shape names and condition texts), with the fast-path conditions of
the reference write-up: the paged sparse attention kernel needs exactly one KV head per rank (M3 has
4 KV heads, so TP4 or TP8), the shared expert is fused into the grouped GEMM (129 experts) unless the
plan says otherwise, and GEMMs with M <= 64 take the decode tile table. The header carries
``"synthetic": true``; timings are random. Real traces come from
``m3lab.dispatch.capture.capture_dispatch_trace``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from m3lab.kernels.gemm.tables import DECODE_MAX_M as DECODE_M_MAX  # the decode tile table's M
from m3lab.traces.dispatch import DispatchTraceWriter

KV_HEADS, Q_HEADS, HEAD_DIM, HIDDEN, EXPERTS, EXPERT_INTER, DENSE_LAYERS = 4, 64, 128, 6144, 128, 3072, 3
FALLBACK = "torch"  # the dispatcher's name for the plain-torch path
# path names of m3lab/dispatch/registry.py
SPARSE_PAGED = "sparse_attn.paged_page16"
FUSED_MOE = "moe.fused_shared_grouped_gemm"
DECODE_GEMM = "gemm.decode_tile_table"


def _gemm(w: DispatchTraceWriter, rng: np.random.Generator, op: str, layer: int, m: int, n: int, k: int) -> None:
    decode = m <= DECODE_M_MAX
    w.write(op, layer=layer, shapes={"x": [m, k], "w": [n, k]}, dtypes={"x": "bfloat16", "w": "float8_e4m3fn"},
            path=DECODE_GEMM if decode else FALLBACK,
            kernels=["gemm_a16w16_decode"] if decode else ["m3lab.kernels.gemm.reference.linear_ref"],
            rejected=[] if decode else [(DECODE_GEMM, f"decode-sized M <= {DECODE_M_MAX} (got M={m})")],
            t_us=float(rng.uniform(2, 20)))


def write_synthetic_m3_trace(path: str | Path, *, tp: int = 4, tokens: int = 32, layers: int = 6,
                             fused_shared_expert: bool = True, seed: int | None = None) -> Path:
    """Write one synthetic M3 decode step (``tokens`` requests, first ``layers`` layers) at ``tp``."""
    rng = np.random.default_rng(seed)
    kv_local = max(KV_HEADS // tp, 1)
    q_local = Q_HEADS // tp
    path = Path(path)
    with DispatchTraceWriter(path, device="cpu", model="minimax-m3", synthetic=True,
                             plan={"tp": tp, "ep": 1, "fused_shared_expert": fused_shared_expert}) as w:
        for layer in range(layers):
            width = (q_local + 2 * kv_local) * HEAD_DIM
            _gemm(w, rng, "qkv_proj", layer, tokens, width, HIDDEN)
            sparse = layer >= DENSE_LAYERS
            attn_shapes = {"q": [tokens, q_local, HEAD_DIM], "k_cache": [1024, 128, kv_local, HEAD_DIM],
                           "v_cache": [1024, 128, kv_local, HEAD_DIM]}
            if sparse:
                attn_shapes["blocks"] = [tokens, kv_local, 16]
            why = ("sparse-attention layer (got dense layer)" if not sparse else None if kv_local == 1 else
                   f"one KV head per rank (kv heads per rank == 1, i.e. TP4 or TP8) "
                   f"(got {kv_local} KV heads per rank at tp={tp})")
            w.write("attention", layer=layer, shapes=attn_shapes, dtypes={"q": "bfloat16", "k_cache": "bfloat16"},
                    path=FALLBACK if why else SPARSE_PAGED,
                    kernels=["m3lab.model.attention.attention_varlen"] if why else ["sparse_paged_attention_page16"],
                    rejected=[(SPARSE_PAGED, why)] if why else [], t_us=float(rng.uniform(5, 40)))
            _gemm(w, rng, "o_proj", layer, tokens, HIDDEN, Q_HEADS * HEAD_DIM // tp)
            if layer < DENSE_LAYERS:
                _gemm(w, rng, "gate_up_proj", layer, tokens, 2 * 12288 // tp, HIDDEN)
                _gemm(w, rng, "down_proj", layer, tokens, HIDDEN, 12288 // tp)
                continue
            experts = EXPERTS + 1 if fused_shared_expert else EXPERTS
            why = None if fused_shared_expert else \
                "shared expert fused (plan.fused_shared_expert) (got fused_shared_expert=False)"
            w.write("moe_gate_up", layer=layer,
                    shapes={"x": [tokens, HIDDEN], "w": [experts, 2 * EXPERT_INTER // tp, HIDDEN]},
                    dtypes={"x": "bfloat16", "w": "float8_e4m3fn"}, path=FALLBACK if why else FUSED_MOE,
                    kernels=["m3lab.kernels.moe.reference.grouped_gemm_ref"] if why else ["fused_moe_kernel"],
                    rejected=[(FUSED_MOE, why)] if why else [], t_us=float(rng.uniform(20, 80)))
            if not fused_shared_expert:
                _gemm(w, rng, "shared_gate_up", layer, tokens, 2 * EXPERT_INTER // tp, HIDDEN)
                _gemm(w, rng, "shared_down", layer, tokens, HIDDEN, EXPERT_INTER // tp)
    return path
