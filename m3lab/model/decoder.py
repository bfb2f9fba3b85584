"""The reference MiniMax M3 decoder (one TP/EP rank), every op through the dispatcher.

The model is a :class:`~m3lab.spec.model.ModelSpec` and a :class:`~m3lab.spec.plan.ParallelPlan` (rank-local
widths come from the plan). Weights are a flat dict with internal names (see ``m3lab.weights.names``):
``embed``, ``lm_head``, ``norm``, and per layer ``layers.{i}.`` + ``input_norm``, ``post_norm``, ``qkv`` (fused
[q | k | v], on sparse layers [q | k | v | index q | index k]: ONE GEMM, as vLLM's
``MinimaxM3QKVParallelLinearWithIndexer``), ``o_proj``, ``q_norm``, ``k_norm``, ``iq_norm``, ``ik_norm``,
``gate_up``/``down`` (dense MLP), ``router``, ``router_bias``, ``w13`` [E, 2I, H], ``w2`` [E, H, I] (+
``shared_gate_up``/``shared_down`` when the shared expert is not fused). A ``<name>.scale`` tensor holds MX
scales; ``formats[name]`` the format.

Layer order as on AMD (``vllm/models/minimax_m3/amd/model.py:1360-1385``): input norm (the fused residual add +
Gemma RMSNorm after the first layer), attention, o_proj, the post-attention all-reduce fused with the
post-attention norm (``fused_allreduce_gemma_rms_norm``), FFN, the FFN all-reduce (explicit: FusedMoE and the
dense down_proj reduce their results), then the next layer's fused add + norm. Index-sharing reuse layers skip
the index norm, index RoPE and index-cache write but still compute the index columns of the fused GEMM.

The MoE experts are one op, ``moe_experts`` (alignment, gate_up + SwiGLU-OAI, down + routing weights + combine: what
vLLM's fused-MoE call runs), with the shared expert as the last row of a top-(k+1) table when it is fused
(``ParallelPlan.shared_fusion_reason``: asked for, no EP, routed and shared experts in one format), else routed
only and the shared expert as its own MLP; the record's ``shared_expert`` attribute says which and why. The
OpTable splits the op into its two grouped GEMMs (``moe_gate_up``, ``moe_down``; ``m3lab.capture.crosscheck``).
"""
from dataclasses import dataclass, field
from typing import Any

import torch

from m3lab.dispatch import Dispatcher
from m3lab.kernels.moe.reference import append_shared_expert, fused_moe_ref, swiglu_oai
from m3lab.model.attention import attention_varlen, indexer_varlen, topk_blocks
from m3lab.model.ffn import embedding, route
from m3lab.model.kv_cache import DEFAULT_LAYOUT, PagedKVCache
from m3lab.model.layers import gemma_rms_norm, head_norms, identity_allreduce, linear, rope
from m3lab.model.step import StepMeta, plan_step
from m3lab.spec.model import ATTN_SPARSE, MLP_MOE, ModelSpec
from m3lab.spec.plan import ParallelPlan


@dataclass
class M3Model:
    """Reference decoder for one rank: ``step(cache, [(seq, tokens)])`` runs one engine step."""

    model: ModelSpec
    plan: ParallelPlan
    weights: dict[str, torch.Tensor]
    formats: dict[str, str] = field(default_factory=dict)
    dispatcher: Dispatcher = field(default_factory=Dispatcher)
    rank: int = 0   # TP rank (its vocabulary shard; under EP also its experts)

    @property
    def device(self) -> torch.device:
        return self.weights["embed"].device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights["embed"].dtype

    @property
    def fused_shared(self) -> bool:
        """True when the shared expert is the last row of the routed expert table (no separate weights)."""
        moe = self.model.moe_layers
        return bool(moe) and self.model.n_shared > 0 and f"layers.{moe[0]}.shared_gate_up" not in self.weights

    @property
    def shared_expert(self) -> str:
        """"fused" (the last row of the expert table), else why the shared expert runs as its own MLP."""
        if self.fused_shared:
            return "fused"
        why = self.plan.shared_fusion_reason(self.model)
        moe = self.model.moe_layers
        if why is None and moe:
            fmt = [self.formats.get(f"layers.{moe[0]}.{n}", "bf16") for n in ("w13", "shared_gate_up")]
            if fmt[0] != fmt[1]:
                why = f"routed and shared experts in different formats ({fmt[0]} / {fmt[1]}): vLLM keeps them apart"
        return f"separate MLP: {why or 'not fused by the weights'}"

    def new_cache(self, num_blocks: int, layout: str = DEFAULT_LAYOUT, dtype: torch.dtype | None = None,
                  index_dtype: torch.dtype | None = None) -> PagedKVCache:
        """A paged cache sized for this rank's layers (an index-key cache on every sparse layer); K/V in ``dtype``
        (default: the weights'), index keys in ``index_dtype`` (default: ``dtype``)."""
        m = self.model
        return PagedKVCache(num_blocks=num_blocks, block_size=m.sparse.block_size,
                            kv_heads=self.plan.heads_kv_local(m), head_dim=m.head_dim, index_dim=m.sparse.index_dim,
                            sparse=[a == ATTN_SPARSE for a in m.attn_types], layout=layout,
                            dtype=dtype or self.dtype, index_dtype=index_dtype, device=self.device)

    # --- one engine step ------------------------------------------------------------------------
    def step(self, cache: PagedKVCache, requests: list[tuple[int, torch.Tensor]], all_logits: bool = False):
        """Run requests [(seq id, new token ids [n])]; -> logits [T, V_local] (all_logits) or [R, V_local]."""
        tokens = torch.cat([t.reshape(-1) for _, t in requests]).to(self.device)
        meta = plan_step(cache, [(s, t.numel()) for s, t in requests], self.device)
        x = self._call("embedding", -1, "embedding", embedding, {"tokens": tokens, "w": self.weights["embed"]},
                       {"m": meta.tokens}, {"vocab_start": self.rank * self.plan.vocab_local(self.model)})
        x = self._allreduce("allreduce_embed", -1, x)
        shared_blocks = None
        for i in range(self.model.layers):
            x, shared_blocks = self._layer(i, x, meta, cache, shared_blocks)
        x = self._norm("final_norm", -1, x, "norm")
        if not all_logits:
            x = x[torch.tensor(meta.cu_q[1:], device=self.device) - 1]
        logits = self._gemm("lm_head", -1, x, "lm_head", kind="lm_head")
        if self.plan.tp > 1:
            logits = self._call("logits_gather", -1, "allgather", identity_allreduce, {"x": logits})
        return logits

    def _layer(self, i: int, x: torch.Tensor, meta: StepMeta, cache: PagedKVCache, shared_blocks):
        a = self._norm("input_norm", i, x, f"layers.{i}.input_norm")
        o, shared_blocks = self._attention(i, a, meta, cache, shared_blocks)
        x = x + self._allreduce("allreduce_attn", i, o)
        b = self._norm("post_attn_norm", i, x, f"layers.{i}.post_norm")
        f = self._moe(i, b) if self.model.mlp_types[i] == MLP_MOE else self._dense_mlp(i, b)
        return x + self._allreduce("allreduce_ffn", i, f), shared_blocks

    # --- attention ------------------------------------------------------------------------------
    def _attention(self, i: int, a: torch.Tensor, meta: StepMeta, cache: PagedKVCache, shared_blocks):
        m, pl, p, t = self.model, self.plan, f"layers.{i}.", a.shape[0]
        sparse = m.attn_types[i] == ATTN_SPARSE
        widths = pl.qkv_widths(m, sparse)
        qkv = self._gemm("qkv_proj", i, a, p + "qkv")   # one GEMM, index q/k columns included on sparse layers
        parts = torch.split(qkv, list(widths), dim=-1)
        hq, hkv, hd = pl.heads_q_local(m), pl.heads_kv_local(m), m.head_dim
        q, k, v = parts[0].reshape(t, hq, hd), parts[1].reshape(t, hkv, hd), parts[2].reshape(t, hkv, hd)
        own_index = sparse and (m.computes_topk(i) or shared_blocks is None)
        idx = {}
        if own_index:  # reuse layers skip the index norm, RoPE and index-cache write (amd/model.py:1024-1101)
            d = m.sparse.index_dim
            idx = {"iq": parts[3].reshape(t, pl.index_heads_local(m), d), "ik": parts[4].reshape(t, 1, d),
                   "iq_w": self.weights[p + "iq_norm"], "ik_w": self.weights[p + "ik_norm"]}
        normed = self._call("qk_norm", i, "norm", head_norms,
                            {"q": q, "k": k, **idx, "q_w": self.weights[p + "q_norm"], "k_w": self.weights[p + "k_norm"]},
                            {"m": t}, {"eps": m.norm_eps})
        names = ("q", "k", "iq", "ik") if own_index else ("q", "k")
        roped = self._call("rope", i, "rope", rope, {**dict(zip(names, normed)), "pos": meta.positions},
                           {"m": t}, {"rotary_dim": m.rotary_dim, "theta": m.rope_theta})
        q, k = roped[0], roped[1]
        ik = roped[3][:, 0] if own_index else None
        self._call("cache_write", i, "cache_write", cache.write, {"slots": meta.slots, "k": k, "v": v, "ik": ik},
                   {"m": t}, {"layer": i})
        varlen = meta.tensors(cache, self.device)
        lists = {"tables": [cache.tables[s] for s in meta.seqs], "starts": meta.starts, "counts": meta.counts}
        blocks, sp = None, m.sparse
        if own_index:
            scores = self._call("indexer", i, "indexer", indexer_varlen,
                                {"iq": roped[2], "index_cache": cache.index[i], **varlen},
                                {"q_tokens": t, "ctx_tokens": sum(meta.ctx), "heads_q": pl.index_heads_local(m),
                                 "heads_kv": 1, "head_dim": sp.index_dim},
                                {**lists, "block_size": sp.block_size, "topk": sp.topk_blocks,
                                 "init_blocks": sp.init_blocks, "local_blocks": sp.local_blocks})
            blocks = self._call("topk", i, "topk", topk_blocks, {"scores": scores, "positions": meta.positions},
                                {"q_tokens": t, "heads_kv": hkv, "topk_blocks": sp.topk_blocks},
                                {"block_size": sp.block_size, "topk": sp.topk_blocks, "local_blocks": sp.local_blocks,
                                 "init_blocks": sp.init_blocks})
            shared_blocks = blocks
        elif sparse:
            blocks = shared_blocks  # index sharing: reuse the most recent computing layer's selection
        o = self._call("attention", i, "attention", attention_varlen,
                       {"q": q, "k_cache": cache.k_plane(i), "v_cache": cache.v_plane(i), **varlen, "blocks": blocks},
                       {"sparse": sparse, "q_tokens": t, "ctx_tokens": sum(meta.ctx), "heads_q": hq,
                        "heads_kv": hkv, "head_dim": hd, "block_size": sp.block_size,
                        "topk_blocks": sp.topk_blocks if sparse else 0, "requests": len(meta.seqs)},
                       {**lists, "scale": hd ** -0.5})
        return self._gemm("o_proj", i, o.reshape(t, -1), p + "o_proj"), shared_blocks

    # --- FFN --------------------------------------------------------------------------------------
    def _dense_mlp(self, i: int, b: torch.Tensor) -> torch.Tensor:
        h = self._gemm("gate_up_proj", i, b, f"layers.{i}.gate_up")
        return self._gemm("down_proj", i, self._act("act", i, h), f"layers.{i}.down")

    def _act(self, op: str, i: int, h: torch.Tensor) -> torch.Tensor:
        m = self.model
        return self._call(op, i, "activation", swiglu_oai, {"h": h}, {"m": h.shape[0]},
                          {"alpha": m.swiglu_alpha, "limit": m.swiglu_limit, "beta": m.swiglu_beta})

    def _moe(self, i: int, b: torch.Tensor) -> torch.Tensor:
        m, pl, p, t = self.model, self.plan, f"layers.{i}.", b.shape[0]
        w, local = self.weights, pl.experts_local(m)
        ep = {"expert_start": self.rank * local, "local_experts": local} if pl.ep > 1 else {}
        weights, ids = self._call("router", i, "router", route, {"x": b, "w": w[p + "router"], "bias": w[p + "router_bias"]},
                                  {"m": t, "n": m.experts, "k": m.hidden},
                                  {"topk": m.topk, "routed_scaling": m.routed_scaling, **ep})
        fused = self.fused_shared
        if fused:
            weights, ids = append_shared_expert(weights, ids, local)
        fmt = self.formats.get(p + "w13", "bf16")
        attrs = {"experts": w[p + "w13"].shape[0], "routed_experts": local, "topk": ids.shape[1], "hidden": m.hidden,
                 "inter": pl.expert_inter_local(m), "routed_tokens": t * ids.shape[1], "m": t * ids.shape[1],
                 "w_format": fmt, "shared_expert": self.shared_expert}
        y = self._call("moe_experts", i, "moe", fused_moe_ref,
                       {"x": b, "w13": w[p + "w13"], "w2": w[p + "w2"], "weights": weights, "ids": ids,
                        "w13_scale": w.get(p + "w13.scale"), "w2_scale": w.get(p + "w2.scale")}, attrs,
                       {"alpha": m.swiglu_alpha, "limit": m.swiglu_limit, "beta": m.swiglu_beta, "fmt": fmt})
        if not fused and m.n_shared:
            s = self._gemm("shared_gate_up", i, b, p + "shared_gate_up")
            y = y + self._gemm("shared_down", i, self._act("shared_act", i, s), p + "shared_down")
        return y

    # --- dispatch helpers ---------------------------------------------------------------------------
    def _call(self, op: str, layer: int, kind: str, ref, tensors: dict, attrs: dict | None = None,
              params: dict | None = None) -> Any:
        return self.dispatcher.call(op, layer, kind, ref, tensors, attrs, params)

    def _gemm(self, op: str, layer: int, x: torch.Tensor, name: str, kind: str = "gemm") -> torch.Tensor:
        w, fmt = self.weights[name], self.formats.get(name, "bf16")
        n = w.shape[0]
        return self._call(op, layer, kind, linear, {"x": x, "w": w, "w_scale": self.weights.get(name + ".scale")},
                          {"m": x.shape[0], "n": n, "k": x.shape[1], "w_format": fmt}, {"w_format": fmt})

    def _norm(self, op: str, layer: int, x: torch.Tensor, name: str) -> torch.Tensor:
        return self._call(op, layer, "norm", gemma_rms_norm, {"x": x, "w": self.weights[name]}, {"m": x.shape[0]},
                          {"eps": self.model.norm_eps})

    def _allreduce(self, op: str, layer: int, x: torch.Tensor) -> torch.Tensor:
        if self.plan.tp == 1:
            return x
        return self._call(op, layer, "allreduce", identity_allreduce, {"x": x}, {"m": x.shape[0]})
