"""The kernels' problems on one rank, as the OpTable, the ModelSpec and the ParallelPlan give them: the dense GEMM
shapes (benchmarked, tuned and gated), the grouped-MoE problem and the sparse-attention problem. Benchmarks, tuners
and gates take their dimensions from here, never as literals.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from m3lab.optable.builder import build_optable
from m3lab.spec.model import load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.quant import load_quant
from m3lab.workload.step import EngineStep


@lru_cache(maxsize=None)
def model_gemm_shapes(model: str = "minimax-m3", tp: int = 4, quant: str = "bf16") -> tuple[tuple[int, int], ...]:
    """The model's distinct dense GEMM shapes (N, K) per rank, from the OpTable (kind == "gemm"). MiniMax M3
    at TP4 (the default) gives the benchmarked, tuned and gated set. A broken OpTable raises."""
    spec = load_model(model)
    df = build_optable(spec, ParallelPlan(tp=tp).validate(spec), load_quant(quant), EngineStep.decode(1, 1))
    nk = df[df["kind"] == "gemm"][["n", "k"]].drop_duplicates().astype(int)
    return tuple(sorted((int(n), int(k)) for n, k in nk.itertuples(index=False)))


@dataclass(frozen=True)
class MoeProblem:
    """One rank's grouped MoE: x [T, hidden] through ``routed`` experts (w13 [2·inter, hidden], w2 [hidden, inter]
    each), ``topk`` routed experts per token, plus ``shared`` shared experts of the same width."""
    hidden: int
    inter: int
    routed: int
    topk: int
    shared: int


@lru_cache(maxsize=None)
def moe_problem(model: str = "minimax-m3", tp: int = 4) -> MoeProblem:
    """The MoE of ``model`` on one rank at TP ``tp`` (no EP): widths from ``ParallelPlan.expert_inter_local``."""
    spec = load_model(model)
    plan = ParallelPlan(tp=tp).validate(spec)
    return MoeProblem(spec.hidden, plan.expert_inter_local(spec), plan.experts_local(spec), spec.topk, spec.n_shared)


@dataclass(frozen=True)
class SparseProblem:
    """One rank's sparse attention and indexer: ``heads_q`` query heads over ``heads_kv`` KV heads of ``head_dim``,
    one index key head of ``index_dim``, KV blocks of ``block`` tokens, ``topk`` blocks kept per query row."""
    heads_q: int
    heads_kv: int
    head_dim: int
    index_dim: int
    block: int
    topk: int


@lru_cache(maxsize=None)
def sparse_problem(model: str = "minimax-m3", tp: int = 4) -> SparseProblem:
    """The sparse attention of ``model`` on one rank at TP ``tp``: head counts from the ParallelPlan."""
    spec = load_model(model)
    plan = ParallelPlan(tp=tp).validate(spec)
    return SparseProblem(plan.heads_q_local(spec), plan.heads_kv_local(spec), spec.head_dim, spec.index_dim,
                         spec.block_size, spec.topk_blocks)


@dataclass(frozen=True)
class RankDims:
    """Widths of one rank's dense GEMMs and activations (elements): ``hidden``, ``head_dim``, the fused q/k/v(/index)
    projection of a sparse (``qkv_sparse``) and a dense (``qkv_dense``) attention layer, the attention output
    (``attn_out``, o_proj's K), and the per-rank intermediate widths of a routed expert, the dense MLP and the shared
    expert (``expert_inter``, ``dense_inter``, ``shared_inter``)."""
    hidden: int
    head_dim: int
    qkv_sparse: int
    qkv_dense: int
    attn_out: int
    expert_inter: int
    dense_inter: int
    shared_inter: int


@lru_cache(maxsize=None)
def rank_dims(model: str = "minimax-m3", tp: int = 4) -> RankDims:
    """The widths of ``model`` on one rank at TP ``tp``, every one from the ParallelPlan."""
    spec = load_model(model)
    plan = ParallelPlan(tp=tp).validate(spec)
    return RankDims(spec.hidden, spec.head_dim, sum(plan.qkv_widths(spec, sparse=True)),
                    sum(plan.qkv_widths(spec, sparse=False)), plan.heads_q_local(spec) * spec.head_dim,
                    plan.expert_inter_local(spec), plan.dense_inter_local(spec), plan.shared_inter_local(spec))
