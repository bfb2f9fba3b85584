"""The reference MiniMax M3 decoder (one TP/EP rank), every op through the dispatcher.

Weights are a flat dict with internal names (see ``m3lab.weights.names``): ``embed``, ``lm_head``,
``norm``, and per layer ``layers.{i}.`` + ``input_norm``, ``post_norm``, ``qkv`` (fused
[q | k | v] or, on sparse layers, [q | k | v | index q | index k]), ``indexer_qk`` (only when the
index projections are kept apart, e.g. a BF16 indexer next to an MXFP8 qkv), ``o_proj``,
``q_norm``, ``k_norm``, ``iq_norm``, ``ik_norm``, ``gate_up``/``down`` (dense MLP), ``router``,
``router_bias``, ``w13`` [E, 2I, H], ``w2`` [E, H, I] (+ ``shared_gate_up``/``shared_down`` when the
shared expert is not fused). A ``<name>.scale`` tensor holds MX scales; ``formats[name]`` the format.
"""
from dataclasses import dataclass, field
from typing import Any

import torch

from m3lab.dispatch import Dispatcher
from m3lab.kernels.moe.reference import append_shared_expert, grouped_gemm_ref, swiglu_oai
from m3lab.model.attention import attention_varlen, indexer_varlen, topk_blocks
from m3lab.model.config import LocalDims, M3Config
from m3lab.model.ffn import embedding, moe_down_combine, route
from m3lab.model.kv_cache import PagedKVCache
from m3lab.model.layers import gemma_rms_norm, head_norms, identity_allreduce, linear, rope
from m3lab.model.step import StepMeta, plan_step


@dataclass
class M3Model:
    """Reference decoder for one rank: ``step(cache, [(seq, tokens)])`` runs one engine step."""

    cfg: M3Config
    dims: LocalDims
    weights: dict[str, torch.Tensor]
    formats: dict[str, str] = field(default_factory=dict)
    dispatcher: Dispatcher = field(default_factory=Dispatcher)

    @property
    def device(self) -> torch.device:
        return self.weights["embed"].device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights["embed"].dtype

    def new_cache(self, num_blocks: int, layout: str = "vllm", dtype: torch.dtype | None = None) -> PagedKVCache:
        """A paged cache sized for this rank's layers."""
        c = self.cfg
        return PagedKVCache(num_blocks=num_blocks, block_size=c.block_size, kv_heads=self.dims.kv_heads,
                            head_dim=c.head_dim, index_dim=c.index_dim, sparse=[a == "sparse" for a in c.attn_kinds],
                            layout=layout, dtype=dtype or self.dtype, device=self.device)

    # --- one engine step ------------------------------------------------------------------------
    def step(self, cache: PagedKVCache, requests: list[tuple[int, torch.Tensor]], all_logits: bool = False):
        """Run requests [(seq id, new token ids [n])]; -> logits [T, V_local] (all_logits) or [R, V_local]."""
        tokens = torch.cat([t.reshape(-1) for _, t in requests]).to(self.device)
        meta = plan_step(cache, [(s, t.numel()) for s, t in requests], self.device)
        x = self._call("embedding", -1, "embedding", embedding, {"tokens": tokens, "w": self.weights["embed"]},
                       {"m": meta.tokens}, {"vocab_start": 0})
        x = self._allreduce("allreduce_embed", -1, x)
        shared_blocks = None
        for i in range(self.cfg.layers):
            x, shared_blocks = self._layer(i, x, meta, cache, shared_blocks)
        x = self._norm("final_norm", -1, x, "norm")
        if not all_logits:
            x = x[torch.tensor(meta.cu_q[1:], device=self.device) - 1]
        logits = self._gemm("lm_head", -1, x, "lm_head", kind="lm_head")
        if self.dims.tp > 1:
            logits = self._call("logits_gather", -1, "allgather", identity_allreduce, {"x": logits})
        return logits

    def _layer(self, i: int, x: torch.Tensor, meta: StepMeta, cache: PagedKVCache, shared_blocks):
        a = self._norm("input_norm", i, x, f"layers.{i}.input_norm")
        o, shared_blocks = self._attention(i, a, meta, cache, shared_blocks)
        x = x + self._allreduce("allreduce_attn", i, o)
        b = self._norm("post_attn_norm", i, x, f"layers.{i}.post_norm")
        f = self._moe(i, b) if self.cfg.mlp_kinds[i] == "moe" else self._dense_mlp(i, b)
        return x + self._allreduce("allreduce_ffn", i, f), shared_blocks

    # --- attention ------------------------------------------------------------------------------
    def _attention(self, i: int, a: torch.Tensor, meta: StepMeta, cache: PagedKVCache, shared_blocks):
        c, d, p, t = self.cfg, self.dims, f"layers.{i}.", a.shape[0]
        sparse = c.attn_kinds[i] == "sparse"
        wq, wk, wv, wiq, wik = d.qkv_widths
        qkv = self._gemm("qkv_proj", i, a, p + "qkv")
        if sparse and p + "indexer_qk" in self.weights:
            qkv = torch.cat([qkv, self._gemm("indexer_qk_proj", i, a, p + "indexer_qk")], dim=-1)
        widths = [wq, wk, wv, wiq, wik] if sparse else [wq, wk, wv]
        parts = torch.split(qkv, widths, dim=-1)
        q = parts[0].reshape(t, d.q_heads, c.head_dim)
        k = parts[1].reshape(t, d.kv_heads, c.head_dim)
        v = parts[2].reshape(t, d.kv_heads, c.head_dim)
        idx = {}
        if sparse:
            idx = {"iq": parts[3].reshape(t, d.index_heads, c.index_dim), "ik": parts[4].reshape(t, 1, c.index_dim),
                   "iq_w": self.weights[p + "iq_norm"], "ik_w": self.weights[p + "ik_norm"]}
        normed = self._call("qk_norm", i, "norm", head_norms,
                            {"q": q, "k": k, **idx, "q_w": self.weights[p + "q_norm"], "k_w": self.weights[p + "k_norm"]},
                            {"m": t}, {"eps": c.eps})
        names = ("q", "k", "iq", "ik") if sparse else ("q", "k")
        roped = self._call("rope", i, "rope", rope, {**dict(zip(names, normed)), "pos": meta.positions},
                           {"m": t}, {"rotary_dim": c.rotary_dim, "theta": c.rope_theta})
        q, k = roped[0], roped[1]
        ik = roped[3][:, 0] if sparse else None
        self._call("cache_write", i, "cache_write", cache.write, {"slots": meta.slots, "k": k, "v": v, "ik": ik},
                   {"m": t}, {"layer": i})
        varlen = meta.tensors(cache, self.device)
        lists = {"tables": [cache.tables[s] for s in meta.seqs], "starts": meta.starts, "counts": meta.counts}
        blocks = None
        if sparse and (c.computes_topk(i) or shared_blocks is None):
            scores = self._call("indexer", i, "indexer", indexer_varlen,
                                {"iq": roped[2], "index_cache": cache.index[i], **varlen},
                                {"q_tokens": t, "ctx_tokens": sum(meta.ctx), "heads_q": d.index_heads,
                                 "heads_kv": 1, "head_dim": c.index_dim}, {**lists, "block_size": c.block_size})
            blocks = self._call("topk", i, "topk", topk_blocks, {"scores": scores, "positions": meta.positions},
                                {"q_tokens": t, "heads_kv": d.kv_heads, "topk_blocks": c.topk_blocks},
                                {"block_size": c.block_size, "topk": c.topk_blocks, "local_blocks": c.local_blocks,
                                 "init_blocks": c.init_blocks})
            shared_blocks = blocks
        elif sparse:
            blocks = shared_blocks  # index sharing: reuse the most recent computing layer's selection
        o = self._call("attention", i, "attention", attention_varlen,
                       {"q": q, "k_cache": cache.k_plane(i), "v_cache": cache.v_plane(i), **varlen, "blocks": blocks},
                       {"sparse": sparse, "q_tokens": t, "ctx_tokens": sum(meta.ctx), "heads_q": d.q_heads,
                        "heads_kv": d.kv_heads, "head_dim": c.head_dim, "block_size": c.block_size,
                        "topk_blocks": c.topk_blocks if sparse else 0, "requests": len(meta.seqs)},
                       {**lists, "scale": c.head_dim ** -0.5})
        return self._gemm("o_proj", i, o.reshape(t, -1), p + "o_proj"), shared_blocks

    # --- FFN --------------------------------------------------------------------------------------
    def _dense_mlp(self, i: int, b: torch.Tensor) -> torch.Tensor:
        h = self._gemm("gate_up_proj", i, b, f"layers.{i}.gate_up")
        return self._gemm("down_proj", i, self._act("act", i, h), f"layers.{i}.down")

    def _act(self, op: str, i: int, h: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        return self._call(op, i, "activation", swiglu_oai, {"h": h}, {"m": h.shape[0]},
                          {"alpha": c.swiglu_alpha, "limit": c.swiglu_limit})

    def _moe(self, i: int, b: torch.Tensor) -> torch.Tensor:
        c, d, p, t = self.cfg, self.dims, f"layers.{i}.", b.shape[0]
        w = self.weights
        ep = {"expert_start": 0, "local_experts": d.experts} if d.ep > 1 else {}
        weights, ids = self._call("router", i, "router", route, {"x": b, "w": w[p + "router"], "bias": w[p + "router_bias"]},
                                  {"m": t, "n": c.experts, "k": c.hidden},
                                  {"topk": c.topk, "routed_scaling": c.routed_scaling, **ep})
        if d.fused_shared_expert:
            weights, ids = append_shared_expert(weights, ids, d.experts)
        fmt = self.formats.get(p + "w13", "bf16")
        attrs = {"experts": d.table_experts, "routed_experts": d.experts, "topk": ids.shape[1], "hidden": c.hidden,
                 "inter": d.expert_inter, "routed_tokens": t * ids.shape[1], "m": t * ids.shape[1], "w_format": fmt}
        h = self._call("moe_gate_up", i, "grouped_gemm", grouped_gemm_ref,
                       {"x": b, "w": w[p + "w13"], "ids": ids, "scale": w.get(p + "w13.scale")}, attrs, {"fmt": fmt})
        y = self._call("moe_down", i, "grouped_gemm", moe_down_combine,
                       {"a": self._act("moe_act", i, h), "w": w[p + "w2"], "ids": ids, "weights": weights,
                        "scale": w.get(p + "w2.scale")}, attrs, {"fmt": self.formats.get(p + "w2", "bf16")})
        if not d.fused_shared_expert:
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
                          {"eps": self.cfg.eps})

    def _allreduce(self, op: str, layer: int, x: torch.Tensor) -> torch.Tensor:
        if self.dims.tp == 1:
            return x
        return self._call(op, layer, "allreduce", identity_allreduce, {"x": x}, {"m": x.shape[0]})
