"""Every number the calibrated cost model assumes, named once: value, the range the sensitivity table moves it
over, unit, and its source ("assumed" where nothing measured backs it).

The cost sources (:mod:`m3lab.cost.sources`) read these by name; :mod:`m3lab.cost.sensitivity` moves each over
its range. Measured inputs (AITER's MI355X tables, the H200 rows of vLLM's own kernels, the MI300X decode
profile) are not here: they are data, cited where they are read (:mod:`m3lab.cost.peers`,
:mod:`m3lab.cost.calibration`).

Kinds: ``efficiency`` (a factor on an achievable fraction of the roofline: the row's time divides by it),
``floor`` (the least µs of one kernel launch under graph replay).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from m3lab.errors import M3LabError


@dataclass(frozen=True)
class Assumption:
    """One assumed number: ``value`` and the ``low``..``high`` range the sensitivity table explores."""

    name: str
    value: float
    low: float
    high: float
    unit: str
    kind: str        # "efficiency" (time divides by it) or "floor" (µs)
    source: str


def _a(name, value, low, high, unit, kind, source) -> tuple[str, Assumption]:
    return name, Assumption(name, value, low, high, unit, kind, source)


ASSUMPTIONS: Mapping[str, Assumption] = dict((
    _a("amd_vs_h200_fraction", 0.7, 0.5, 1.0, "x", "efficiency",
       "derived: vLLM's Triton indexer score and sparse attend reach about 0.7 of the fraction of the HBM roofline "
       "on MI300X (InferenceX decode profile, 8K/c256) that they reach on H200 (traces/bench/sparse_attn.csv); see "
       "m3lab.cost.peers.amd_check. Applied to every H200-measured kernel carried to an AMD GPU (assumed to hold "
       "on MI355X); low: 0.5, high: parity"),
    _a("dot_scaled_decode_vs_aiter_fp8", 0.75, 0.5, 1.0, "x", "efficiency",
       "assumed: vLLM's Triton _mxfp8_linear_kernel with its narrow decode / mid-M tiles runs at this fraction of the "
       "speed of AITER's tuned FP8 GEMM of the same shape on MI355X (the closest measurement: same bytes, same GPU). "
       "No MI355X measurement of the Triton kernel exists here, and H200 rows are no peer (Hopper upcasts dot_scaled)"),
    _a("dot_scaled_prefill_vs_aiter_fp8", 0.75, 0.4, 1.0, "x", "efficiency",
       "assumed: the same for the wide prefill tiles (compute-bound MXFP8 dot_scaled vs AITER's tuned FP8)"),
    _a("mxfp8_moe_vs_bf16_fused_moe", 1.0, 0.5, 1.0, "x", "efficiency",
       "assumed: vLLM's Triton MXFP8 grouped GEMM (_mxfp8_grouped_gemm_kernel, same moe_align tiling) reaches the "
       "fraction of the roofline that vLLM's Triton bf16 fused_moe_kernel reaches on H200 (traces/bench/moe.csv)"),
    _a("aiter_moe_untuned", 1.0, 0.6, 1.0, "x", "efficiency",
       "assumed: AITER's fused MoE on MiniMax M3's shapes (no tuned row in the shipped tables, so AITER runs its "
       "default config) reaches the efficiency of its tuned MiniMax-M2.5 kernels at the same regime"),
    _a("aiter_pa_vs_triton", 1.0, 0.7, 1.4, "x", "efficiency",
       "assumed: AITER's pa_decode_gluon (page-16 sparse paged attention) reaches the fraction of the roofline of "
       "vLLM's Triton sparse attention on the same bytes (no measurement of the AITER kernel here)"),
    _a("msa_vs_triton_indexer", 1.0, 0.7, 1.4, "x", "efficiency",
       "assumed: AITER's fp8 MSA score + top-k reaches the fraction of the roofline of vLLM's Triton indexer"),
    _a("bf16_untuned_vs_aiter", 0.8, 0.5, 1.0, "x", "efficiency",
       "assumed: a BF16 GEMM run by hipBLASLt's default heuristics or vLLM's skinny kernels runs at this fraction "
       "of the speed of AITER's tuned choice for the shape (AITER tunes over hipBLASLt, so its time is a bound)"),
    _a("monokernel_eff", 0.6, 0.3, 0.8, "x", "efficiency",
       "assumed: fraction of the roofline of vLLM's FlyDSL persistent FFN kernel (--monokernel) over the ops it "
       "replaces (all-reduces, norm, router, experts); no measurement of it here"),
    _a("elementwise_eff", 0.6, 0.4, 0.8, "x", "efficiency",
       "assumed: fraction of the HBM roofline of norms, activations, quantisers, RoPE, KV/index cache writes, the "
       "page-table builder, routing top-k and MoE bookkeeping kernels (H200 torch.sum: 0.79 of 4.8 TB/s)"),
    _a("small_kernel_eff", 0.3, 0.15, 0.6, "x", "efficiency",
       "assumed: fraction of the roofline of latency-bound small kernels (routing and index top-k without a "
       "measured peer, the fp32 router GEMM at decode, MoE bookkeeping)"),
    _a("generic_gemm_eff", 0.45, 0.25, 0.7, "x", "efficiency",
       "assumed, for GEMMs with no vLLM decision and no measured table of their dtype (models the resolver does "
       "not know): the median efficiency of AITER's MI355X FP8 table"),
    _a("generic_attention_eff", 0.7, 0.4, 0.9, "x", "efficiency",
       "assumed, for attention-like kernels with no vLLM decision (MLA, DSA, linear attention): H200 dense SDPA "
       "decode reached 3.4-4.4 TB/s of 4.8"),
    _a("link_eff", 0.7, 0.5, 0.9, "x", "efficiency",
       "assumed: fraction of the one-way GPU link bandwidth a large all-reduce reaches"),
    _a("kernel_floor_us", 2.0, 1.0, 4.0, "us", "floor",
       "assumed: least GPU time of one small kernel under graph replay (elementwise, top-k, page table, router)"),
    _a("gemm_floor_us", 4.0, 2.0, 8.0, "us", "floor",
       "assumed: least time of a GEMM or attention kernel without a measured table (AITER's MI355X FP8 table: "
       "5.2 µs at a 1.6 µs roofline)"),
    _a("collective_floor_us", 10.0, 5.0, 20.0, "us", "floor",
       "assumed: latency of an all-gather or all-to-all across the group (logits gather, EP dispatch)"),
    _a("rccl_allreduce_us", 12.0, 8.0, 30.0, "us", "floor",
       "assumed: latency of one small RCCL all-reduce across the TP group in a graph (H200 NCCL, 2 GPUs, "
       "12 KB: 10 µs measured, traces/bench/collectives.csv)"),
    _a("custom_allreduce_us", 6.0, 3.0, 12.0, "us", "floor",
       "assumed: latency of one small one-stage custom all-reduce (AITER's or vLLM's own IPC kernel on ROCm)"),
))


def value(name: str, overrides: Mapping[str, float] | None = None) -> float:
    """The value of assumption ``name`` (``overrides`` first: the sensitivity table's perturbations)."""
    if name not in ASSUMPTIONS:
        raise M3LabError(f"unknown cost assumption {name!r}", field="assumption", hint=", ".join(ASSUMPTIONS))
    if overrides and name in overrides:
        return float(overrides[name])
    return ASSUMPTIONS[name].value


def table():
    """The assumptions as a DataFrame: ``[name, value, low, high, unit, kind, source]``."""
    import pandas as pd
    return pd.DataFrame([a.__dict__ for a in ASSUMPTIONS.values()])
