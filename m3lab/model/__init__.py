"""The reference MiniMax M3 decoder in plain PyTorch (one TP/EP rank; every op through the dispatcher).

It reads the one model description, :class:`~m3lab.spec.model.ModelSpec` + :class:`~m3lab.spec.plan.ParallelPlan`
(``ModelSpec.mini()`` is the CPU test model). Public API: :class:`M3Model` (``step(cache, [(seq, tokens)])``,
``new_cache``), :func:`build_model`, :class:`PagedKVCache` / ``LAYOUTS`` (vLLM's Triton and AITER KV layouts),
:func:`dense_mask_logits` (the straightforward dense-mask implementation used as the check).
"""
from m3lab.model.build import build_model, resolve_model
from m3lab.model.decoder import M3Model
from m3lab.model.dense_mask import dense_mask_logits
from m3lab.model.kv_cache import DEFAULT_LAYOUT, LAYOUTS, PagedKVCache

__all__ = ["M3Model", "build_model", "resolve_model", "PagedKVCache", "LAYOUTS", "DEFAULT_LAYOUT",
           "dense_mask_logits"]
