"""Synthetic MiniMax M3 dispatch traces (and large Kineto traces), for tests, docs and demos without running
the model.

:func:`write_synthetic_m3_trace` writes the calls of one decode step the way :mod:`m3lab.dispatch` records them
(its op names, shape names and the registry's path names) for the optimised MXFP8 deployment on MI355X
(``mxfp8-tp4-optimised``, whose generated expectations are ``minimax_m3_tp4``): the sparse layers run AITER's
paged sparse attention; at TP2 (two KV heads per rank) the call falls back to plain torch with the condition the
reference model's dispatcher records when the resolver's answer for that launch is vLLM's refusal (vLLM starts
AITER's paged sparse attention with more than one KV head per rank only when the fp8 MSA indexer emits its page
table; the optimised deployment's index cache is bf16), the indexer runs on the layers that compute their top-k
(index sharing every 4th sparse layer), the shared expert is fused into the grouped GEMM (129 experts, top-5)
unless told otherwise, decode GEMMs take the MXFP8 decode tiles. The header carries ``"synthetic": true``;
timings are random. Real traces come from ``m3lab.capture.reference.capture_dispatch_trace``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from m3lab.kernels.gemm.tables import DECODE_MAX_M as DECODE_M_MAX  # m3lab's GEMM launcher bound (not vLLM's)
from m3lab.spec.model import ModelSpec
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.serving import load_preset
from m3lab.traces.dispatch import DispatchTraceWriter

DEPLOYMENT = "mxfp8-tp4-optimised"  # the serving preset the trace stands for: its model and index sharing
FALLBACK = "torch"  # the dispatcher's name for the plain-torch path
# path names of m3lab/dispatch/registry.py
SPARSE_PAGED = "attention.aiter_sparse_pa"
INDEXER, TOPK_PATH = "indexer.triton_amd_decode", "topk.triton_decode"
FUSED_MOE = "moe.aiter_mxfp8_flydsl"
DECODE_GEMM = "gemm.mxfp8_dot_scaled_decode"
NORM, ACT = "norm.triton_gemma_rmsnorm", "activation.triton_swiglu_oai"


def _gemm(w: DispatchTraceWriter, rng: np.random.Generator, op: str, layer: int, m: int, n: int, k: int) -> None:
    decode = m <= DECODE_M_MAX
    w.write(op, layer=layer, shapes={"x": [m, k], "w": [n, k]}, dtypes={"x": "bfloat16", "w": "float8_e4m3fn"},
            path=DECODE_GEMM if decode else FALLBACK,
            kernels=["_mxfp8_linear_kernel"] if decode else ["m3lab.kernels.gemm.reference.linear_ref"],
            rejected=[] if decode else [(DECODE_GEMM, f"M <= {DECODE_M_MAX} (m3lab's GEMM launcher decode bound) "
                                                      f"(got M={m})")],
            t_us=float(rng.uniform(2, 20)))


def _simple(w, rng, op: str, layer: int, path: str, kernels: list[str], shapes: dict) -> None:
    w.write(op, layer=layer, shapes=shapes, dtypes={k: "bfloat16" for k in shapes}, path=path, kernels=kernels,
            rejected=[], t_us=float(rng.uniform(1, 5)))


def write_synthetic_m3_trace(path: str | Path, *, tp: int = 4, tokens: int = 32, layers: int = 8,
                             fused_shared_expert: bool = True, seed: int | None = None) -> Path:
    """Write one synthetic M3 decode step (``tokens`` requests, first ``layers`` layers) at ``tp``."""
    rng = np.random.default_rng(seed)
    m: ModelSpec = load_preset(DEPLOYMENT).model
    plan = ParallelPlan(tp=tp, fused_shared_expert=fused_shared_expert)
    kv_local, q_local, hd, hidden = plan.heads_kv_local(m), plan.heads_q_local(m), m.head_dim, m.hidden
    index_local, index_dim, computes_topk = plan.index_heads_local(m), m.sparse.index_dim, m.topk_source()
    path = Path(path)
    meta = {"cu_seqlens_q": [tokens + 1], "seq_lens": [tokens], "block_tables": [tokens, 64]}
    with DispatchTraceWriter(path, device="hip", model="minimax-m3-mxfp8", synthetic=True,
                             plan={"tp": tp, "ep": 1, "fused_shared_expert": fused_shared_expert}) as w:
        for layer in range(layers):
            sparse = layer in m.sparse_layers
            _simple(w, rng, "input_norm", layer, NORM, ["_gemma_rmsnorm_kernel"], {"x": [tokens, hidden], "w": [hidden]})
            _gemm(w, rng, "qkv_proj", layer, tokens, sum(plan.qkv_widths(m, sparse)), hidden)
            computes = sparse and computes_topk[layer] == layer
            if computes:
                _simple(w, rng, "indexer", layer, INDEXER, ["_decode_index_score_kernel", "_decode_topk_fused_kernel"],
                        {"iq": [tokens, index_local, index_dim], "index_cache": [1024, 128, index_dim], **meta})
                _simple(w, rng, "topk", layer, TOPK_PATH, [], {"scores": [kv_local, tokens, 64], "positions": [tokens]})
            attn_shapes = {"q": [tokens, q_local, hd], "k_cache": [1024, 128, kv_local, hd],
                           "v_cache": [1024, 128, kv_local, hd], **meta}
            if sparse:
                attn_shapes["blocks"] = [kv_local, tokens, 16]
            why = ("sparse-attention layer (got dense layer)" if not sparse else None if kv_local == 1 else
                   f"vLLM starts this deployment (mxfp8-tp4-optimised+tp={tp}) (got vLLM refuses AITER's paged "
                   f"sparse attention with {kv_local} KV heads per rank: no fp8 MSA indexer emits its page table)")
            w.write("attention", layer=layer, shapes=attn_shapes, dtypes={"q": "bfloat16", "k_cache": "bfloat16"},
                    path=FALLBACK if why else SPARSE_PAGED,
                    kernels=["m3lab.model.attention.attention_varlen"] if why else ["pa_decode_gluon"],
                    rejected=[(SPARSE_PAGED, why)] if why else [], t_us=float(rng.uniform(5, 40)))
            _gemm(w, rng, "o_proj", layer, tokens, hidden, q_local * hd)
            _simple(w, rng, "post_attn_norm", layer, NORM, ["_gemma_rmsnorm_kernel"], {"x": [tokens, hidden], "w": [hidden]})
            if layer not in m.moe_layers:
                dense = plan.dense_inter_local(m)
                _gemm(w, rng, "gate_up_proj", layer, tokens, 2 * dense, hidden)
                _simple(w, rng, "act", layer, ACT, ["_swiglu_oai_kernel"], {"h": [tokens, 2 * dense]})
                _gemm(w, rng, "down_proj", layer, tokens, hidden, dense)
                continue
            experts = plan.expert_rows_local(m)
            topk = m.topk + (m.n_shared if plan.fuses_shared(m) else 0)
            inter = plan.expert_inter_local(m)
            w.write("moe_experts", layer=layer, shapes={"x": [tokens, hidden], "w13": [experts, 2 * inter, hidden],
                                                        "w2": [experts, hidden, inter], "ids": [tokens, topk]},
                    dtypes={"x": "bfloat16", "w13": "float8_e4m3fn", "w2": "float8_e4m3fn"}, path=FUSED_MOE,
                    kernels=["fused_moe"], rejected=[], t_us=float(rng.uniform(40, 160)))
            if not fused_shared_expert:
                shared = plan.shared_inter_local(m)
                _gemm(w, rng, "shared_gate_up", layer, tokens, 2 * shared, hidden)
                _simple(w, rng, "shared_act", layer, ACT, ["_swiglu_oai_kernel"], {"h": [tokens, 2 * shared]})
                _gemm(w, rng, "shared_down", layer, tokens, hidden, shared)
        _simple(w, rng, "final_norm", -1, NORM, ["_gemma_rmsnorm_kernel"], {"x": [tokens, hidden], "w": [hidden]})
    return path


KINETO_KERNELS = ("void gemm_kernel<float, 128, 64>(float*, float const*, int)", "_gemma_rmsnorm_kernel",
                  "void at::native::elementwise_kernel<128, 2>(int)", "_gqa_sparse_fwd_kernel", "fused_moe_kernel")


def write_synthetic_kineto_trace(path: str | Path, *, kernels: int = 1000, seed: int = 0) -> Path:
    """Write a synthetic PyTorch-profiler (Kineto) trace, gzipped when ``path`` ends in .gz: per kernel an
    annotation, an operator (with shapes), a runtime launch, the kernel and its flow events, as PyTorch writes
    them (about 95 bytes of JSON per event before compression). Written as a stream: ``kernels=300_000`` makes
    a 141 MB file of 1.5 M events without holding it in memory. Timings are random; the device is named
    ``synthetic``."""
    import gzip
    import json

    rng = np.random.default_rng(seed)
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "synthetic"}], "traceEvents": [\n')
        durations = rng.uniform(1, 50, size=kernels).round(3)
        for i in range(kernels):
            ts = 10.0 * i
            name = KINETO_KERNELS[i % len(KINETO_KERNELS)]
            events = (
                {"ph": "X", "cat": "user_annotation", "name": f"m3lab::op[L{i % 60}]", "pid": 1, "tid": 1, "ts": ts,
                 "dur": 9},
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts + 1, "dur": 5,
                 "args": {"External id": i, "Input Dims": [[32, 64], [64, 128]], "Input type": ["float", "float"]}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts + 2,
                 "dur": 2, "args": {"External id": i, "correlation": i}},
                {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts + 4, "dur": durations[i],
                 "args": {"External id": i, "correlation": i, "device": 0, "stream": 7, "grid": [64, 1, 1],
                          "block": [128, 1, 1]}},
                {"ph": "s", "cat": "ac2g", "id": i, "pid": 1, "tid": 1, "ts": ts + 2})
            fh.write(",\n".join(json.dumps(e) for e in events) + (",\n" if i < kernels - 1 else "\n"))
        fh.write("]}\n")
    return path
