"""Local shapes each kernel sees over a workload: histograms and the distinct-shape table a tuner must cover.

Fast by construction (about 10,000 steps in well under a second): the schedule is kept as runs (pure-decode
stretches collapse), GEMM shapes come from one template OpTable (N, K and dtypes do not depend on the step;
M = tokens, or requests for the LM head), step counts are grouped by M, query positions are accumulated
with difference arrays, and per-expert token counts are drawn once per distinct token count from the
routing model, never per step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from m3lab.optable.builder import build_optable
from m3lab.optable.routing import make_routing
from m3lab.spec.model import ModelSpec, load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.quant import load_quant
from m3lab.workload.deployed import fixed_workload, scheduler_config
from m3lab.workload.scheduler import Scheduler, SchedulerConfig, Workload
from m3lab.workload.step import EngineStep

DENSE_KINDS = ("gemm", "router", "lm_head")


@dataclass(frozen=True)
class RunArrays:
    """A schedule as flat arrays. Run r covers ``repeat[r]`` steps; its requests are
    ``new[off[r]:off[r+1]]`` / ``ctx[...]`` at the first step (later steps: one token further each)."""

    repeat: np.ndarray   # [runs]
    tokens: np.ndarray   # [runs] tokens per step (T)
    reqs: np.ndarray     # [runs] requests per step (R)
    off: np.ndarray      # [runs + 1]
    new: np.ndarray      # [sum R]
    ctx: np.ndarray      # [sum R] context after the run's first step
    dec: np.ndarray      # [sum R] bool: the request decodes (scheduler's flag)

    @property
    def num_steps(self) -> int:
        return int(self.repeat.sum())

    def by_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct T, steps with that T)."""
        t, inv = np.unique(self.tokens, return_inverse=True)
        return t, np.bincount(inv, weights=self.repeat).astype(np.int64)

    def by_reqs(self) -> tuple[np.ndarray, np.ndarray]:
        r, inv = np.unique(self.reqs, return_inverse=True)
        return r, np.bincount(inv, weights=self.repeat).astype(np.int64)


def schedule(workload: Workload, config: SchedulerConfig | None = None,
             scheduler: Scheduler | None = None) -> RunArrays:
    """Run the scheduler once and keep the result as :class:`RunArrays`."""
    sched = scheduler or Scheduler(config)
    rep, tok, req, news, ctxs, decs = [], [], [], [], [], []
    for run in sched.runs(workload):
        rep.append(run.repeat)
        tok.append(run.step.num_tokens)
        req.append(run.step.num_reqs)
        news.append(run.step.new_tokens)
        ctxs.append(run.step.context_lens)
        decs.append(run.step.is_decode)
    req_a = np.asarray(req, np.int64)
    return RunArrays(np.asarray(rep, np.int64), np.asarray(tok, np.int64), req_a,
                     np.concatenate([[0], np.cumsum(req_a)]), np.concatenate(news), np.concatenate(ctxs),
                     np.concatenate(decs))


def query_positions(runs: RunArrays) -> tuple[np.ndarray, np.ndarray]:
    """Query tokens per position over the whole schedule: (decode counts [P], prefill counts [P])."""
    rep = np.repeat(runs.repeat, runs.reqs)
    start = runs.ctx - runs.new
    size = int((runs.ctx + rep).max()) + 2
    out = []
    for mask, end in ((runs.dec, start + rep), (~runs.dec, runs.ctx)):  # decode runs advance a position per step
        diff = np.bincount(start[mask], minlength=size) - np.bincount(end[mask], minlength=size)
        out.append(np.cumsum(diff)[:size - 1])
    return out[0], out[1]


@dataclass(frozen=True)
class ShapeReport:
    """Histograms (pandas DataFrames) of what each kernel sees over a workload; see :func:`shape_histograms`."""

    gemm_m: object            # op, kind, n, k, dtype, layers, m, steps, calls
    grouped: object           # op, experts, topk, hidden, inter, dtype, layers, tokens, routed_tokens, steps
    tokens_per_expert: object  # tokens (per expert per step), expert_steps (sampled from the routing model)
    attention_ctx: object     # phase, ctx (keys visible to a query), queries
    selected_blocks: object   # blocks, queries (sparse layers; per query token and KV head)
    distinct_gemms: object    # op, kind, n, k, dtype, layers, m_values, num_m
    distinct_grouped: object  # op, experts, topk, hidden, inter, dtype, tokens_values, num_tokens
    num_steps: int
    meta: dict


def _template(model: ModelSpec, plan: ParallelPlan, quant, routing):
    df = build_optable(model, plan, quant, EngineStep.decode(1, 1), routing)
    key = ["op", "kind", "n", "k", "w_dtype"]
    dense = df[df.kind.isin(DENSE_KINDS)].groupby(key, sort=False).size().reset_index(name="layers")
    gkey = ["op", "experts", "topk", "hidden", "inter", "w_dtype"]
    grouped = df[df.kind == "grouped_gemm"].groupby(gkey, sort=False).size().reset_index(name="layers")
    for col in ("experts", "topk", "hidden", "inter"):
        grouped[col] = grouped[col].astype("int64")
    return dense.rename(columns={"w_dtype": "dtype"}), grouped.rename(columns={"w_dtype": "dtype"})


def shape_histograms(deployment, *, routing=None, seed: int = 0, runs: RunArrays | None = None,
                     plan: ParallelPlan | None = None) -> ShapeReport:
    """Histograms of local shapes over ``deployment``'s fixed-length workload (``num_prompts`` requests at its
    concurrency) scheduled by vLLM-style continuous batching under its scheduler limits. ``runs``: a schedule
    already computed for that workload. ``plan``: the deployment's plan as vLLM runs it
    (``m3lab.vllm.fastpaths.effective_plan``: index q replicated, shared expert fused as vLLM decided); None: the
    deployment's own (what it asks for)."""
    import pandas as pd

    d = deployment.validate()
    model, quant = d.model, d.quant
    plan = d.plan if plan is None else plan.validate(model)
    workload = fixed_workload(d, what="the shape histograms")
    runs = runs if runs is not None else schedule(workload, scheduler_config(d))
    dense, grouped = _template(model, plan, quant, routing)
    t_vals, t_steps = runs.by_tokens()
    r_vals, r_steps = runs.by_reqs()

    frames = []
    for row in dense.itertuples(index=False):
        m, steps = (r_vals, r_steps) if row.kind == "lm_head" else (t_vals, t_steps)
        frames.append(pd.DataFrame({"op": row.op, "kind": row.kind, "n": int(row.n), "k": int(row.k),
                                    "dtype": row.dtype, "layers": row.layers, "m": m, "steps": steps}))
    gemm_m = pd.concat(frames, ignore_index=True)
    gemm_m["calls"] = gemm_m.steps * gemm_m.layers

    rt = make_routing(routing, model.experts, model.topk) if model.is_moe else None
    gframes, tpe = [], pd.DataFrame({"tokens": [], "expert_steps": []})
    if rt is not None:
        shared_rows = model.n_shared if plan.fuses_shared(model) else 0
        routed = rt.routed_tokens(t_vals, plan.ep) + t_vals * shared_rows
        for row in grouped.itertuples(index=False):
            gframes.append(pd.DataFrame({"op": row.op, "experts": row.experts, "topk": row.topk, "hidden": row.hidden,
                                         "inter": row.inter, "dtype": row.dtype, "layers": row.layers,
                                         "tokens": t_vals, "routed_tokens": routed, "steps": t_steps}))
        tpe = _tokens_per_expert(rt, t_vals, t_steps, plan.ep, seed)
    gcols = ["op", "experts", "topk", "hidden", "inter", "dtype", "layers", "tokens", "routed_tokens", "steps"]
    grouped_h = pd.concat(gframes, ignore_index=True) if gframes else pd.DataFrame(columns=gcols)

    att, sel = _attention_histograms(runs, model)
    distinct, dg = _distinct_shapes(gemm_m, grouped_h)
    meta = {"model": model.name, "plan": plan.describe(), "quant": quant.name,
            "shared_expert_fusion": shared_fusion(model, plan), "isl": workload.isl,
            "osl": workload.osl, "concurrency": workload.concurrency, "num_requests": workload.n_requests,
            "routing": rt.name if rt is not None else None, "num_runs": int(runs.repeat.size),
            "kind": "projected (analytic schedule and routing model)"}
    return ShapeReport(gemm_m, grouped_h, tpe, att, sel, distinct, dg, runs.num_steps, meta)


def _attention_histograms(runs: RunArrays, model: ModelSpec):
    """(queries per context length and phase, queries per number of selected KV blocks) over ``runs``; the second
    is empty for a model without sparse attention."""
    import pandas as pd

    dec, pre = query_positions(runs)
    pos = np.arange(dec.size)
    att = pd.concat([pd.DataFrame({"phase": "decode", "ctx": pos[dec > 0] + 1, "queries": dec[dec > 0]}),
                     pd.DataFrame({"phase": "prefill", "ctx": pos[pre > 0] + 1, "queries": pre[pre > 0]})],
                    ignore_index=True)
    sel = pd.DataFrame({"blocks": [], "queries": []})
    if model.sparse is not None:
        blocks = np.minimum(pos // model.sparse.block_size + 1, model.sparse.topk_blocks)
        counts = np.bincount(blocks, weights=dec + pre)
        nz = np.flatnonzero(counts)
        sel = pd.DataFrame({"blocks": nz, "queries": counts[nz].astype(np.int64)})
    return att, sel


def _distinct_shapes(gemm_m, grouped_h):
    """The distinct-shape tables a tuner must cover: the M values of every GEMM shape, the token counts of every
    grouped-GEMM shape."""
    import pandas as pd

    distinct = (gemm_m.groupby(["op", "kind", "n", "k", "dtype", "layers"], sort=False)["m"]
                .agg(lambda s: sorted(int(v) for v in s.unique())).reset_index(name="m_values"))
    distinct["num_m"] = distinct.m_values.map(len)
    if len(grouped_h):
        dg = (grouped_h.groupby(["op", "experts", "topk", "hidden", "inter", "dtype"], sort=False)["tokens"]
              .agg(lambda s: sorted(int(v) for v in s.unique())).reset_index(name="tokens_values"))
        dg["num_tokens"] = dg.tokens_values.map(len)
    else:
        dg = pd.DataFrame(columns=["op", "experts", "topk", "hidden", "inter", "dtype", "tokens_values", "num_tokens"])
    return distinct, dg


def shared_fusion(model: ModelSpec, plan: ParallelPlan) -> dict:
    """Whether the shared expert runs fused into the routed grouped GEMM: asked (the plan), fused, and why not
    (vLLM's answer for an :class:`~m3lab.spec.plan.EffectivePlan`)."""
    reason = plan.shared_fusion_reason(model)
    return {"asked": plan.fused_shared_expert, "fused": reason is None, "reason": reason}


def _tokens_per_expert(rt, t_vals, t_steps, ep: int, seed: int):
    """One multinomial draw of per-expert tokens per distinct T, weighted by its steps (local experts)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    q = rt.local(ep)
    p = np.append(q, max(rt.topk - q.sum(), 0.0)) / rt.topk  # last bin: slots routed to other ranks
    size = int(t_vals.max()) + 1 if len(t_vals) else 1
    hist = np.zeros(size, np.int64)
    for t, w in zip(t_vals, t_steps):
        counts = rng.multinomial(int(t) * rt.topk, p)[:-1]
        hist += np.bincount(np.minimum(counts, size - 1), minlength=size) * int(w)
    nz = np.flatnonzero(hist)
    return pd.DataFrame({"tokens": nz, "expert_steps": hist[nz]})


def sharding_table(model, tps=(1, 2, 4, 8)):
    """Per TP degree: local q/KV/index heads, KV replication, fused projection width (a DataFrame)."""
    import pandas as pd

    model = load_model(model)
    rows = []
    for tp in tps:
        p = ParallelPlan(tp=tp).validate(model)
        row = {"tp": tp, "heads_q": p.heads_q_local(model), "heads_kv": p.heads_kv_local(model),
               "kv_replication": p.kv_replication(model), "vocab_local": p.vocab_local(model)}
        row.update(qkv_dense=sum(p.qkv_widths(model, sparse=False)))
        if model.sparse is not None:
            row.update(index_heads=p.index_heads_local(model), index_key_heads=1, index_key_replication=tp,
                       qkv_sparse=sum(p.qkv_widths(model, sparse=True)))
        rows.append(row)
    return pd.DataFrame(rows)
