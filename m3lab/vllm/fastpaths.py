"""Which code vLLM 0.33.0 runs for each op of MiniMax M3, for a deployment and a step: the fast-path resolver.

``resolve(deployment, tokens=32)`` answers, for each op of a dense layer, a sparse layer that computes its
top-k, one that reuses it under index sharing, and the model-level ops: the path vLLM takes, the kernels it
launches, the conditions with their values, and the vLLM code that decided. vLLM's own code decides: it
runs on an emulated platform of the deployment's GPU (:mod:`m3lab.vllm.emulate`), builds its own M3 model
for the deployment (:mod:`m3lab.vllm.vllm_build`) and runs one step of each layer kind on fake tensors
with every kernel recorded, not run (:mod:`m3lab.vllm.decide`). A row vLLM's code did not decide says
``how="restated"`` (the flashinfer all-reduce fusion on CUDA; EMULATION.md beside this file lists what stays
restated or undecided). The work runs in a worker process per GPU (:mod:`m3lab.vllm.workers`); the first
resolution for a GPU costs vLLM's imports (10-15 s on an idle 2-core CPU), later ones about a second.

Outcomes (``status``): ``runs``; ``off`` (asked for, vLLM turned it off, with why); ``refused`` (vLLM raises at
start-up: the deployment does not serve; the CLI exits 2; the message is vLLM's); ``skipped`` (the op
launches nothing on this layer kind, e.g. the indexer of an index-sharing reuse layer).

Op names (``Decision.op``, stable) and the path ids each can return (``Decision.path``, stable: cost tables
key on ``(op, path)``):

- ``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``, ``shared_gate_up``, ``shared_down``, ``lm_head``:
  ``mxfp8_dot_scaled_decode`` | ``mxfp8_dot_scaled_prefill`` (G2, the tile of one row or a larger one),
  ``mxfp8_bf16_emulation``, ``marlin_mxfp8``, ``skinny_wvsplitkrc`` | ``skinny_wvsplitk`` | ``skinny_llmm1``,
  ``aiter_triton_gemm``, ``aiter_tgemm``, ``hipblaslt`` (ROCm G1), ``cublas`` (CUDA G1);
- ``qk_norm_rope_insert``: ``vllm_fused_qknorm_rope`` (dense), ``aiter_fused_qknorm_idxrqknorm``,
  ``vllm_fused_qknorm_rope_aiter_cache``, ``vllm_fused_qknorm_rope_kv_insert``;
- ``attention``: dense: the backend's name lower-cased (``rocm_attn``, ``rocm_aiter_unified_attn``, ``triton_attn``,
  ``flash_attn``: vLLM's FlashAttention on CUDA, AITER's FA backend on ROCm, which names itself so; ``flashinfer``);
  sparse: ``aiter_sparse_pa``, ``triton_sparse``, ``msa_sm100``;
- ``indexer``: ``msa_fp8``, ``msa_fp8_cp``, ``triton_cp``, ``triton_amd_fused_topk``,
  ``triton_amd_fused_topk_emit_table``, ``triton_amd_prefill``, ``triton_common``, ``reuse_topk``;
- ``page_table``: ``none``, ``msa_topk_emits``, ``fused_topk_emits``, ``cp_merge_emits``, ``triton_builder``;
- ``allreduce_norm``: ``norm_only`` (TP1), ``aiter_fused_ar_rmsnorm``, ``flashinfer_fused_ar_norm``,
  ``allreduce_then_norm``, ``flashinfer_fused_ar_norm_or_nccl`` (restated, CUDA);
- ``router``: ``rocm_fp32_router_gemm``, ``rocm_bf16x3``, ``fp32_router_gemm``, ``fp32_linear``;
- ``routing``: ``aiter_biased_grouped_topk_fse``, ``aiter_biased_grouped_topk``, ``topk_bias_router_cat_shared``,
  ``topk_bias_router``; ``shared_expert_fusion``: ``fse_off``;
- ``experts``: ``aiter_mxfp8_flydsl``, ``triton_mxfp8_native``, ``mxfp8_emulation``, ``mxfp4_emulation``,
  ``aiter_mxfp4_mxfp4``, ``aiter_ck_fused_moe``, ``triton_fused_moe``, ``marlin`` (else the expert class in snake case);
- ``activation``: ``triton_swiglu_oai``, ``silu_and_mul_with_clamp``; ``norm``: ``triton_gemma_rmsnorm``,
  ``flashinfer_gemma_rmsnorm``; ``cuda_graphs``: ``full``, ``piecewise``, ``eager``;
- ``monokernel``: ``mono_ffn``, ``stock_layers`` (when ``--monokernel`` is on);
- any op: ``refused``.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from m3lab.errors import M3LabError
from m3lab.spec.plan import EffectivePlan
from m3lab.spec.serving import Deployment
from m3lab.vllm import decide, workers
from m3lab.vllm.decide import DEFAULT_CONTEXT
from m3lab.vllm.emulate import Target
from m3lab.vllm.fastpath_types import Check, Decision, ExpertShape, GemmShape
from m3lab.vllm.vllm_build import BUILT_ARCHS, CHECKPOINT_SCHEMES

__all__ = ["Check", "Decision", "ExpertShape", "GemmShape", "Resolution", "resolve", "resolve_cached",
           "effective_plan", "plan_of", "resolves", "PHASES", "DEFAULT_CONTEXT"]
PHASES = ("decode", "prefill")


@dataclass
class Resolution:
    """Every decision for one deployment and step, plus what vLLM refuses or turns off."""

    deployment: Deployment
    tokens: int
    phase: str
    context: int
    decisions: list[Decision] = field(default_factory=list)

    @property
    def platform(self):
        return Target.of(self.deployment.hardware)

    @property
    def refused(self) -> list[Decision]:
        return [d for d in self.decisions if d.status == "refused"]

    @property
    def turned_off(self) -> list[Decision]:
        return [d for d in self.decisions if d.status == "off"]

    @property
    def restated(self) -> list[Decision]:
        return [d for d in self.decisions if d.how == "restated"]

    @property
    def ok(self) -> bool:
        """False when vLLM refuses this deployment at start-up."""
        return not self.refused

    def decision(self, op: str, layer_kind: str = "sparse") -> Decision:
        """The decision for ``op`` on ``layer_kind`` (falls back to the model-level row)."""
        for d in self.decisions:
            if d.op == op and d.layer_kind in (layer_kind, "model"):
                return d
        raise KeyError(f"no decision for {op!r} on {layer_kind!r}")

    def table(self):
        """One row per decision: op, layer_kind, decision, status, how, path, kernels, shape, conditions,
        decided_by, vllm, note."""
        import pandas as pd
        rows = [{"op": d.op, "layer_kind": d.layer_kind, "decision": d.decision, "status": d.status, "how": d.how,
                 "path": d.path, "kernels": ", ".join(d.kernels), "shape": str(d.shape) if d.shape else "",
                 "conditions": "; ".join(f"{c.name}={c.value}{'' if c.holds else ' (fails)'}" for c in d.checks),
                 "decided_by": str(d.decided_by), "vllm": d.vllm, "note": d.note} for d in self.decisions]
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        d, t = self.deployment, self.platform
        env, args = d.to_vllm()
        return {"deployment": d.name or "custom", "model": d.model.name, "hardware": d.hardware.name,
                "platform": {"kind": t.kind, "arch": t.arch, "emulated": True},
                "plan": d.plan.describe(), "quant": d.quant.name, "kv_dtype": d.quant.kv_dtype,
                "index_dtype": d.quant.index_dtype, "tokens": self.tokens, "phase": self.phase,
                "context": self.context, "vllm_env": env, "vllm_args": args, "ok": self.ok,
                "restated": len(self.restated), "executed": len(self.decisions) - len(self.restated),
                "refused": [x.to_dict() for x in self.refused], "turned_off": [x.to_dict() for x in self.turned_off],
                "decisions": [x.to_dict() for x in self.decisions]}


def resolves(model, quant: str | None = None, hardware=None) -> bool:
    """True for what the resolver builds: vLLM's MiniMax M3 (block-sparse attention), with ``quant`` (a scheme
    name) one of the M3 checkpoints' weight formats, on ``hardware`` (a profile) whose GPU it emulates and builds
    vLLM's model for (not SM100: its kernels compile CuteDSL code at construction). None: not asked."""
    return (model.sparse is not None and model.sparse.style == "block" and quant in (None, *CHECKPOINT_SCHEMES)
            and (hardware is None or hardware.arch in BUILT_ARCHS))


def _check(deployment: Deployment, tokens: int, phase: str, context: int) -> Deployment:
    if not isinstance(tokens, int) or tokens < 1:
        raise M3LabError(f"tokens must be a positive integer, got {tokens!r}", field="--tokens")
    if phase not in PHASES:
        raise M3LabError(f"phase {phase!r} is not one of {', '.join(PHASES)}", field="--phase")
    if not isinstance(context, int) or context < 0:
        raise M3LabError(f"context must be a non-negative integer, got {context!r}", field="--context")
    model = deployment.model
    if not resolves(model):
        raise M3LabError(f"the resolver builds vLLM's MiniMax M3; {model.name!r} is not an M3 model",
                         field="--model", hint="use minimax-m3 or minimax-m3-mxfp8")
    dep = deployment.validate()
    p = dep.plan
    if p.ep > 1 and p.ep != p.tp * p.dp:
        raise M3LabError(f"ep {p.ep}: vLLM's expert parallelism spans all tp x dp = {p.tp * p.dp} GPUs",
                         field="ep", hint=f"use ep={p.tp * p.dp} (--enable-expert-parallel) or ep=1")
    return dep


def resolve(deployment: Deployment, tokens: int = 32, phase: str = "decode",
            context: int = DEFAULT_CONTEXT) -> Resolution:
    """Resolve every op of the deployment for one step of ``tokens`` tokens.

    ``phase="decode"``: ``tokens`` decode rows (requests x (1 + speculative tokens)), each request with
    ``context`` tokens already cached; ``"prefill"``: one prefill chunk of ``tokens`` tokens.

    >>> from m3lab.spec.serving import load_preset
    >>> r = resolve(load_preset("mxfp8-tp4-optimised"), tokens=32)
    >>> r.decision("attention").path
    'aiter_sparse_pa'
    """
    dep = _check(deployment, tokens, phase, context)
    rows = workers.call(Target.of(dep.hardware), decide.decide, dep, tokens, phase, context)
    return Resolution(deployment=dep, tokens=tokens, phase=phase, context=context, decisions=rows)


def _record_key(deployment: Deployment) -> str:
    """The whole deployment record as text (every field, nested)."""
    return json.dumps(dataclasses.asdict(deployment), sort_keys=True, default=str)


class _Opaque:
    """Carries a deployment through lru_cache without hashing it (the key is its record text)."""

    def __init__(self, deployment: Deployment):
        self.deployment = deployment

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other) -> bool:
        return isinstance(other, _Opaque)


@lru_cache(maxsize=256)
def _cached(key: str, tokens: int, phase: str, context: int, holder: _Opaque) -> Resolution:
    return resolve(holder.deployment, tokens, phase, context)


def resolve_cached(deployment: Deployment, tokens: int = 32, phase: str = "decode",
                   context: int = DEFAULT_CONTEXT) -> Resolution:
    """:func:`resolve`, memoised on the whole deployment record and the step (for cost models that ask for
    the same deployment's kernels many times). Treat the result as read-only."""
    return _cached(_record_key(deployment), tokens, phase, context, _Opaque(deployment))


def effective_plan(deployment: Deployment, tokens: int | None = None) -> EffectivePlan:
    """The deployment's plan as vLLM runs it (:class:`~m3lab.spec.plan.EffectivePlan`): with vLLM's answers to
    "is index q replicated" (indexer context parallelism) and "is the shared expert fused", so its local widths
    (:meth:`~m3lab.spec.plan.ParallelPlan.qkv_widths`, the expert rows) are the ones vLLM's model holds.

    Both answers are vLLM's only when asked for (``indexer_cp``, ``fused_shared_expert``): a plan that asks for
    neither runs as it is, without resolving, and so does one the resolver does not build (another model, a
    weight format no M3 checkpoint has, a GPU it does not emulate). ``tokens``: the decode step resolved
    (default one request; the answers are taken while vLLM builds the model, so any step gives them). A
    deployment vLLM refuses raises M3LabError with vLLM's message."""
    d = deployment
    if not (d.plan.indexer_cp or d.plan.fused_shared_expert) or not resolves(d.model, d.quant.name, d.hardware):
        return d.plan.as_run(index_q_replicated=False, shared_expert_fused=d.plan.fuses_shared(d.model))
    res = resolve_cached(d, tokens or d.serving.decode_query_len)
    if not res.ok:
        bad = res.refused[0]
        raise M3LabError(f"vLLM refuses this deployment: {bad.op}: {bad.note}", field=bad.op,
                         hint="see `m3lab fastpaths` for the conditions; change the setting it names")
    return plan_of(res)


def plan_of(res: Resolution) -> EffectivePlan:
    """The effective plan a resolution shows: index q replicated where vLLM runs the MSA indexer context-parallel
    (path ``msa_fp8_cp``: ``msa_indexer_cp_enabled``), the shared expert fused where vLLM's experts hold its rows
    (the experts decision's local rows, checked against the module vLLM built), vLLM's reason where it was asked
    for and turned off (the ``shared_expert_fusion`` row)."""
    d = res.deployment
    plan, model = d.plan, d.model
    rows = {(x.op, x.layer_kind): x for x in res.decisions}
    indexer, experts = rows.get(("indexer", "sparse")), rows.get(("experts", "sparse"))
    off = rows.get(("shared_expert_fusion", "sparse"))
    fused = experts is not None and experts.shape is not None and experts.shape.experts > plan.experts_local(model)
    return plan.as_run(index_q_replicated=indexer is not None and indexer.path == "msa_fp8_cp",
                       shared_expert_fused=fused, fusion_off=off.note if off is not None else "")
