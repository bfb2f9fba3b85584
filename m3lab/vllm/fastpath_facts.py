"""The inputs of vLLM's M3 dispatch decisions for one deployment and step (shared by the resolver's rules)."""
from __future__ import annotations

import math

from m3lab.spec.serving import Deployment
from m3lab.vllm.fastpath_cites import cite as _c
from m3lab.vllm.fastpath_types import Check, Platform


def vllm(module: str):
    """A vLLM module whose pure deciding functions the rules call."""
    from m3lab.vllm.imports import vllm_module
    return vllm_module(module, "resolving vLLM's fast paths")


class Facts:
    """The inputs of vLLM's decisions for one resolution (derived once)."""

    def __init__(self, d: Deployment, platform: Platform, tokens: int, phase: str):
        self.tokens = tokens
        self.d, self.p, self.s = d, platform, d.serving
        self.model, self.plan, self.quant = d.model, d.plan, d.quant
        self.tp = d.plan.tp
        self.kv_heads = d.plan.heads_kv_local(d.model)
        self.idx_heads = max(1, d.model.sparse.index_heads // self.tp)
        self.kv_cache_dtype = "auto" if d.quant.kv_dtype == "bf16" else d.quant.kv_dtype
        self.index_dtype = d.quant.index_dtype
        self.aiter = self.p.aiter_supported and self.s.aiter
        self.pa_requested = self.aiter and self.s.shuffle_kv_cache
        self.max_model_len = self.s.max_model_len or d.model.max_position
        self.msa_reason = self._msa_reason()
        self.msa = self.msa_reason is None
        self.emits_table = self.msa  # the MSA top-k writes the attend's page table
        self.decode = phase == "decode"
        self.rows_per_req = self.s.decode_query_len if self.decode else tokens
        self.requests = max(1, tokens // self.rows_per_req) if self.decode else 1

    def _msa_reason(self) -> str | None:
        """``msa_indexer_unsupported_reason`` at cp_world 1 (``amd/indexer_msa.py``)."""
        if not self.p.rocm:
            return "needs ROCm for the fp8 MFMA score/top-k"
        if not self.pa_requested:
            return "needs the AITER sparse PA attend (VLLM_ROCM_USE_AITER=1 + VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1)"
        if self.index_dtype != "fp8":
            return f"needs an fp8 e4m3 index cache, got indexer_kv_dtype={self.index_dtype!r}"
        if not self.p.gfx950:
            return "needs gfx950 for the fp8 MFMA"
        sp = self.model.sparse
        if (sp.topk_blocks, sp.block_size, sp.index_dim) != (16, 128, 128):
            return "needs topk_blocks 16, sparse_block_size 128, index_head_dim 128"
        if math.ceil(self.max_model_len / sp.block_size) > 8192:
            return f"max_model_len={self.max_model_len} needs more than the 8192 blocks the top-k is compiled for"
        return None

    def aiter_checks(self) -> list[Check]:
        return [Check("ROCm gfx9 CDNA>=3 with aiter", self.p.aiter_supported, self.p.aiter_supported, _c("aiter_supported")),
                Check("VLLM_ROCM_USE_AITER", int(self.s.aiter), self.s.aiter, _c("aiter_enabled"))]
