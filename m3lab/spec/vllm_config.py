"""MiniMax M3 configs parsed through vLLM's own config class, read the way vLLM 0.33.0's AMD model reads them.

This is m3lab's production parse of MiniMax M3 configs (``m3lab.spec.model.parse_hf_config`` reads through
it whenever vLLM is installed; m3lab's own reader serves only where it is not, and says so
once). :func:`vllm_text_config` returns vLLM's ``MiniMaxM3TextConfig`` for a ``config.json`` dict (through
``MiniMaxM3Config(**config)``, ``vllm/transformers_utils/configs/minimax_m3.py``), so keys the checkpoint omits
take vLLM's defaults; :func:`vllm_reads` reads it with the rules of ``vllm/models/minimax_m3/amd/model.py``
into plain values, of which :func:`m3lab.spec.model.spec_via_vllm` makes the ModelSpec.

That config module imports only ``transformers``: it is loaded from the installed vLLM's file without
importing the ``vllm`` package when nothing has imported vLLM yet (vLLM's import fixes platform state). The
parse costs torch + transformers' import (seconds on a CPU), so its result is kept on disk
(:func:`cached_vllm_reads`, keyed by the config, the vLLM version and this module's source).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from m3lab.atomic import atomic_path
from m3lab.errors import M3LabError
from m3lab.vllm_src import install
from m3lab.vllm_src.imports import vllm_module

CONFIG_MODULE = "vllm.transformers_utils.configs.minimax_m3"
_STANDALONE = "_m3lab_vllm_minimax_m3_config"  # vLLM's config module loaded by file (vllm not imported)


def _config_module() -> Any:
    """vLLM's M3 config module: the imported one, or its file loaded alone (it imports only transformers)."""
    if "vllm" in sys.modules:
        return vllm_module(CONFIG_MODULE, feature="parsing MiniMax M3 configs with vLLM's config class")
    if _STANDALONE in sys.modules:
        return sys.modules[_STANDALONE]
    install.require("parsing MiniMax M3 configs with vLLM's config class")
    root = Path(list(importlib.util.find_spec("vllm").submodule_search_locations)[0])
    spec = importlib.util.spec_from_file_location(_STANDALONE, root / "transformers_utils/configs/minimax_m3.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[_STANDALONE] = module
    return module


def vllm_text_config(config: dict) -> Any:
    """vLLM's ``MiniMaxM3TextConfig`` of a MiniMax M3 ``config.json`` dict (VL wrapper or bare text config)."""
    mod = _config_module()
    if not isinstance(config, dict):
        raise M3LabError("config must be a JSON object (a Hugging Face config.json)", field="config")
    try:
        if "text_config" in config:
            return mod.MiniMaxM3Config(**config).text_config
        return mod.MiniMaxM3TextConfig(**config)
    except (KeyError, ValueError, TypeError) as err:  # transformers' validation of the config's fields
        raise M3LabError(f"vLLM's MiniMaxM3Config rejects this config: {err}", field="config") from None


def vllm_reads(config: dict) -> dict[str, Any]:
    """What vLLM's AMD model reads from vLLM's parse of ``config``, field by field, as plain values
    (layer ids, sizes, the sparse block as ``SparseConfig`` keywords); :func:`m3lab.spec.model.spec_via_vllm`
    makes the ModelSpec of them."""
    t = vllm_text_config(config)
    n = int(t.num_hidden_layers)
    sp_cfg = t.sparse_attention_config or {}
    freq = sp_cfg.get("sparse_attention_freq")
    sparse_ids = [i for i, f in enumerate(freq or []) if f != 0]              # amd/model.py:150-158
    moe_freq = getattr(t, "moe_layer_freq", None)                             # amd/model.py:193-198
    use_cache = bool(getattr(t, "use_index_cache", False))                    # amd/model.py:169-190
    topk_freq = int(getattr(t, "index_topk_freq", 1) or 1) if use_cache else 1
    sparse = None
    if sparse_ids:
        sparse = dict(                                                        # amd/model.py:663-668,788-801
            index_heads=int(sp_cfg["sparse_num_index_heads"]), index_dim=int(sp_cfg["sparse_index_dim"]),
            block_size=int(sp_cfg["sparse_block_size"]), topk_blocks=int(sp_cfg["sparse_topk_blocks"]),
            local_blocks=int(sp_cfg.get("sparse_local_block", 0)), init_blocks=int(sp_cfg.get("sparse_init_block", 0)),
            index_topk_freq=max(topk_freq, 1),
            index_skip_topk_offset=int(getattr(t, "index_skip_topk_offset", 0) or 0) if use_cache else 0)
    scaling = getattr(t, "rope_scaling", None)                                # amd/model.py:216-239
    n_shared = int(getattr(t, "n_shared_experts", 0) or 0)
    return dict(
        layers=n, sparse_layers=sparse_ids, sparse=sparse,
        moe_layers=[i for i in range(n) if moe_freq is None or moe_freq[i] != 0],
        sparse_disable_index_value=sp_cfg.get("sparse_disable_index_value", 1),
        rope_scaling=dict(scaling) if scaling else None, model_type=str(config.get("model_type") or t.model_type),
        hidden=int(t.hidden_size), heads_q=int(t.num_attention_heads),
        heads_kv=int(t.num_key_value_heads), head_dim=int(t.head_dim), vocab=int(t.vocab_size),
        dense_inter=int(t.dense_intermediate_size),
        expert_inter=int(t.intermediate_size), shared_inter=int(t.intermediate_size) * n_shared,  # :437-445
        experts=int(t.num_local_experts), topk=int(t.num_experts_per_tok), n_shared=n_shared,
        rope_theta=float(t.rope_theta), rotary_dim=int(round(int(t.head_dim) * float(t.partial_rotary_factor))),
        norm_eps=float(t.rms_norm_eps), act=str(t.hidden_act), swiglu_alpha=float(t.swiglu_alpha),
        swiglu_limit=float(t.swiglu_limit), swiglu_beta=float(t.swiglu_beta),
        routed_scaling=float(t.routed_scaling_factor), scoring=str(t.scoring_func), router_dtype="fp32",
        router_bias=bool(t.use_routing_bias), qk_norm=str(t.qk_norm_type or "per_head") if t.use_qk_norm else "",
        tie_embeddings=bool(t.tie_word_embeddings), max_position=int(t.max_position_embeddings),
        mtp_modules=int(t.num_mtp_modules))


def _cache_dir() -> Path:
    """Where parsed specs are kept: ``$M3LAB_CACHE_DIR`` or ``~/.cache/m3lab``."""
    return Path(os.environ.get("M3LAB_CACHE_DIR") or Path.home() / ".cache" / "m3lab") / "vllm-config"


def _cache_key(config: dict) -> str:
    parts = [json.dumps(config, sort_keys=True, default=str), str(install.installed_version()),
             Path(__file__).read_text(encoding="utf-8")]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def cached_vllm_reads(config: dict) -> dict[str, Any]:
    """:func:`vllm_reads`, kept on disk (see the module docstring); a damaged entry is re-parsed."""
    path = _cache_dir() / f"{_cache_key(config)}.pkl"
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, TypeError):
        pass
    values = vllm_reads(config)
    try:
        with atomic_path(path) as tmp:
            tmp.write_bytes(pickle.dumps(values))
    except OSError:  # a read-only home: parse every time
        pass
    return values
