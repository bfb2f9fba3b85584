"""Every decision of one deployment and step, taken by vLLM's own code on the emulated target.

:func:`decide` runs in a process bound to the deployment's target (:mod:`m3lab.vllm.workers`): it enters
:func:`~m3lab.vllm.emulate.emulate` with the deployment's environment and group sizes, builds vLLM's model
(:mod:`m3lab.vllm.vllm_build`; a start-up refusal is vLLM's exception, attributed to its op), and reads
every op of a dense layer, a sparse layer that computes its top-k and, under index sharing, one that reuses
it, plus the model-level ops, from the built modules and one recorded step
(:mod:`m3lab.vllm.decide_linear`, ``decide_moe``, ``decide_attention``, ``decide_comm``).

Local shapes come from :class:`~m3lab.spec.plan.ParallelPlan` (the owner of local widths), with vLLM's
answers that change them (index q replicated under indexer CP, the shared expert fused) taken from the
built model; each GEMM row checks the plan's width against the module vLLM built.
"""
from __future__ import annotations

import dataclasses

from m3lab.errors import M3LabError
from m3lab.spec.serving import Deployment
from m3lab.vllm import decide_attention as attn_rules, decide_comm as comm, decide_linear as linear, decide_moe as moe
from m3lab.vllm.attention_step import Step
from m3lab.vllm.emulate import Target, emulate
from m3lab.vllm.fastpath_types import Check, Decision, ExpertShape, GemmShape
from m3lab.vllm.vllm_build import Built, build

DEFAULT_CONTEXT = 8192  # tokens cached per request before a decode step (assumed; resolve(context=...))
# vLLM function on the way to a start-up refusal -> (op, decision label) it belongs to
REFUSAL_OPS = (("specialized_decode_config", "monokernel", "M3"), ("minimax_m3_use_aiter_sparse_pa", "attention", "A1"),
               ("select_main_backend_and_impl_cls", "attention", "A1"), ("select_indexer_impl_cls", "indexer", "A2"),
               ("select_msa_indexer_impl_cls", "indexer", "A2"), ("moe_backend", "experts", "M2"),
               ("experts", "experts", "M2"), ("MiniMaxM3MoE", "experts", "M2"))


def effective_plan(dep: Deployment, built: Built):
    """The deployment's plan with vLLM's answers read off the built model: index q replicated (indexer context
    parallelism) and the shared expert fused."""
    lm = built.model.language_model.model
    moe = next((layer.block_sparse_moe for layer in lm.layers if hasattr(layer, "block_sparse_moe")), None)
    return dep.plan.as_run(index_q_replicated=bool(getattr(lm, "indexer_cp", False)),
                           shared_expert_fused=bool(getattr(moe, "is_fused_shared_expert_enabled", False)))


def step_of(dep: Deployment, tokens: int, phase: str, context: int, vllm_config) -> Step:
    """The uniform step vLLM's scheduler would form (checked against its limits)."""
    sched = vllm_config.scheduler_config
    if tokens > sched.max_num_batched_tokens:
        raise M3LabError(f"--tokens {tokens} exceeds this deployment's max_num_batched_tokens "
                         f"{sched.max_num_batched_tokens} (vLLM's scheduler never forms that step)", field="--tokens")
    if phase == "prefill":
        return Step(1, tokens, 0)
    q = dep.serving.decode_query_len
    if tokens % q:
        raise M3LabError(f"--tokens {tokens} is not a multiple of the {q} rows per request of this deployment "
                         f"(1 + {dep.serving.spec_tokens} speculative)", field="--tokens")
    if tokens // q > sched.max_num_seqs:
        raise M3LabError(f"{tokens // q} requests exceed max_num_seqs {sched.max_num_seqs}", field="--tokens")
    return Step(tokens // q, q, context)


def refusal_rows(built: Built) -> list[Decision]:
    r = built.refusal
    op, label = next(((op, label) for fn, op, label in REFUSAL_OPS if any(fn in f for f in r.frames)),
                     ("model", "-"))
    return [Decision(op, "sparse" if op != "model" else "model", label, "refused", (),
                     (Check("vLLM raised at start-up", r.error, False, r.cite),), r.cite, status="refused",
                     note=f"vLLM raises {r.error}", vllm=r.error)]


def decide(dep: Deployment, tokens: int, phase: str, context: int = DEFAULT_CONTEXT) -> list[Decision]:
    """Every decision for ``dep`` at one step (call in a process bound to the deployment's target)."""
    env, _ = dep.to_vllm()
    p = dep.plan
    with emulate(Target.of(dep.hardware), env=env, tp=p.tp, dp=p.dp, enable_ep=p.ep > 1):
        from vllm.config import set_current_vllm_config  # vLLM is imported only under the emulation
        built = build(dep)
        if built.refusal is not None:
            return refusal_rows(built)
        with set_current_vllm_config(built.vllm_config):
            return _rows(dep, built, tokens, phase, context)


def _rows(dep: Deployment, built: Built, tokens: int, phase: str, context: int) -> list[Decision]:
    vc, model = built.vllm_config, dep.model
    plan = effective_plan(dep, built)
    layers = built.layers()
    step = step_of(dep, tokens, phase, context, vc)
    decode = phase == "decode"
    graph = comm.graphs(vc, built.model, layers, tokens, decode, step.requests)
    if decode and graph.vllm == "FULL":  # captured graphs launch with max_seq_len = max_model_len
        step = dataclasses.replace(step, capture_seq_len=vc.model_config.max_model_len)
    out: list[Decision] = []
    out += _dense_rows(layers["dense"], plan, model, tokens)
    main_md = None
    for kind in ("sparse", "sparse_reuse"):
        if kind in layers:
            rows, main_md = _sparse_rows(kind, layers[kind], built, plan, dep, step, tokens)
            out += rows
    mono = comm.monokernel(built.model, vc, tokens, main_md, _mode(graph.vllm))
    if mono is not None:
        out = _suppressed(out, mono) + [mono]
    out.append(comm.norm(layers["dense"], tokens))
    out.append(graph)
    sampled = step.requests * (step.query_len if decode else 1)  # logits only at the sampled positions
    out.append(linear.lm_head(built.model.language_model.lm_head, GemmShape(sampled, plan.vocab_local(model), model.hidden)))
    return out


def _mode(name: str):
    from vllm.config import CUDAGraphMode
    return CUDAGraphMode[name]


def _dense_rows(layer, plan, model, t: int) -> list[Decision]:
    a, h, hd = layer.self_attn, model.hidden, model.head_dim
    rows = [linear.gemm("qkv_proj", "dense", a.qkv_proj, GemmShape(t, sum(plan.qkv_widths(model, False)), h)),
            attn_rules.qk_norm("dense", a), attn_rules.dense_attention(a),
            linear.gemm("o_proj", "dense", a.o_proj, GemmShape(t, h, plan.heads_q_local(model) * hd)),
            comm.allreduce_norm("dense", layer, t, plan.tp)]
    if not layer.is_moe_layer:
        inter = plan.dense_inter_local(model)
        rows += [linear.gemm("gate_up_proj", "dense", layer.mlp.gate_up_proj, GemmShape(t, 2 * inter, h)),
                 comm.activation("dense", layer.mlp, t, "dense"),
                 linear.gemm("down_proj", "dense", layer.mlp.down_proj, GemmShape(t, h, inter))]
    return rows


def _sparse_rows(kind, layer, built, plan, dep, step, t: int):
    model, a = dep.model, layer.self_attn
    trace, attend = attn_rules.sparse_step(a, built.vllm_config, step)
    lm = built.model.language_model.model
    rows = [linear.gemm("qkv_proj", kind, a.qkv_proj, GemmShape(t, sum(plan.qkv_widths(model, True)), model.hidden),
                        note="fused q|k|v|index_q|index_k" + (" (reuse layers still compute the index columns)"
                                                              if kind == "sparse_reuse" else "")),
            attn_rules.qk_norm(kind, a), attn_rules.indexer(kind, a, lm, trace),
            attn_rules.page_table(kind, a, trace, attend), attn_rules.attention(kind, a, trace, attend),
            linear.gemm("o_proj", kind, a.o_proj, GemmShape(t, model.hidden, plan.heads_q_local(model) * model.head_dim)),
            comm.allreduce_norm(kind, layer, t, plan.tp)]
    block = layer.block_sparse_moe
    fused = bool(getattr(block, "is_fused_shared_expert_enabled", False))
    rows.append(moe.router(kind, block, t))
    if (off := moe.fusion(kind, block, plan.fused_shared_expert)) is not None:
        rows.append(off)
    rows.append(moe.routing(kind, block, t))
    n_shared = model.n_shared if fused else 0
    rows.append(moe.experts(kind, block, ExpertShape(plan.experts_local(model) + n_shared, model.topk + n_shared,
                                                     plan.expert_inter_local(model))))
    if getattr(block, "shared_experts", None) is not None:
        s, inter = block.shared_experts, plan.shared_inter_local(model)
        rows += [linear.gemm("shared_gate_up", kind, s.gate_up_proj, GemmShape(t, 2 * inter, model.hidden),
                             note="separate shared-expert MLP (fusion off)"),
                 comm.activation(kind, s, t, "shared"),
                 linear.gemm("shared_down", kind, s.down_proj, GemmShape(t, model.hidden, inter))]
    main_md = trace.metadata if hasattr(trace, "metadata") else None
    return rows, main_md


# ops the monokernel takes over in a step it runs (runtime/decode.py substitutes the layer after attention)
MONO_REPLACES = ("allreduce_norm", "router", "routing", "experts", "shared_gate_up", "shared_down")


def _suppressed(rows: list[Decision], mono: Decision) -> list[Decision]:
    """The sparse layers' rows with the ops the monokernel replaces marked skipped when it runs."""
    if mono.path != "mono_ffn":
        return rows
    return [dataclasses.replace(r, status="skipped", note="replaced by the monokernel in this step")
            if r.layer_kind.startswith("sparse") and r.op in MONO_REPLACES and r.status == "runs" else r
            for r in rows]
