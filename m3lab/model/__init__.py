"""The reference MiniMax M3 decoder in plain PyTorch (one TP/EP rank; every op through the dispatcher).

Public API: :class:`M3Config` (``M3Config()`` = full M3, ``M3Config.mini()``, :func:`from_spec`),
:class:`LocalDims` (per-rank widths for a plan), :class:`M3Model` (``step(cache, [(seq, tokens)])``,
``new_cache``), :func:`build_model`, :class:`PagedKVCache` / ``LAYOUTS``, :func:`dense_mask_logits`
(the straightforward dense-mask implementation used as the check).
"""
from m3lab.model.build import build_model
from m3lab.model.config import LocalDims, M3Config, from_spec
from m3lab.model.decoder import M3Model
from m3lab.model.dense_mask import dense_mask_logits
from m3lab.model.kv_cache import LAYOUTS, PagedKVCache

__all__ = ["M3Config", "LocalDims", "from_spec", "M3Model", "build_model", "PagedKVCache", "LAYOUTS",
           "dense_mask_logits"]
