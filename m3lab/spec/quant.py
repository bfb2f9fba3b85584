"""Quantisation schemes: which dtype each weight group uses, plus the KV and index-key cache dtypes.

Weight groups (``MODULES``): attention q/k/v and o projections, the indexer q/k projections, the dense MLP,
the shared expert, the routed experts, the router gate, the embedding and the LM head. On MiniMax M3 the index
q/k projections are part of the one fused q/k/v/index GEMM and take ``attn_qkv``'s format (vLLM builds one
``MinimaxM3QKVParallelLinearWithIndexer`` with one quant method, ``vllm/models/minimax_m3/amd/model.py:686-698``);
``indexer_qk`` is the separate indexer projections of DeepSeek sparse attention (GLM). Presets follow the
MiniMax M3 checkpoints: ``mxfp8`` = MiniMaxAI/MiniMax-M3-MXFP8 (every linear but the router,
embedding and LM head: its ``ignored_layers`` do not list the index projections), ``mxfp4`` =
amd/MiniMax-M3-MXFP4 (only routed + shared experts MXFP4).
Bytes per element and block scales: :mod:`m3lab.spec.dtypes`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from m3lab.errors import M3LabError
# Bytes per dtype live in m3lab.spec.dtypes; re-exported for the modules that read them with the presets.
from m3lab.spec.dtypes import DTYPE_BYTES, MX_BLOCK, NVFP4_BLOCK, QUANTIZED, dtype_bytes, gemm_act_dtype, weight_bytes  # noqa: F401

# fp8 is vLLM's default fp8 cache format, e4m3 ("fp8" / "fp8_e4m3"); fp8_e5m2 is another format with other
# kernels (e.g. no AITER fused QK-norm + insert, vllm/_aiter_ops.py fused_qknorm_idxrqknorm_enabled), kept apart.
CACHE_DTYPES = ("bf16", "fp16", "fp8", "fp8_e5m2")
_CACHE_ALIASES = {"auto": "bf16", "bfloat16": "bf16", "float16": "fp16", "fp8_e4m3": "fp8",
                  "float8_e4m3fn": "fp8", "e4m3": "fp8", "float8_e5m2": "fp8_e5m2", "e5m2": "fp8_e5m2"}

MODULES = ("attn_qkv", "attn_o", "indexer_qk", "dense_mlp", "shared_expert", "routed_expert", "router",
           "embedding", "lm_head")


def normalize_cache_dtype(dtype: str, field_name: str = "kv_dtype") -> str:
    d = _CACHE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    if d not in CACHE_DTYPES:
        raise M3LabError(f"{field_name} {dtype!r} is not supported", field=field_name,
                         hint=f"use one of {', '.join(CACHE_DTYPES)}")
    return d


@dataclass(frozen=True)
class QuantScheme:
    """Per-module weight dtypes plus cache dtypes. Missing modules default to ``bf16``."""

    name: str
    weights: Mapping[str, str] = field(default_factory=dict)
    kv_dtype: str = "bf16"
    index_dtype: str = "bf16"   # index-key cache; vLLM's default is bf16 (indexer_kv_dtype)
    act_dtype: str = "bf16"     # residual stream / attention activations
    source: str = ""

    def weight_dtype(self, module: str) -> str:
        if module not in MODULES:
            raise M3LabError(f"unknown weight group {module!r}", field="module", hint=f"one of {', '.join(MODULES)}")
        return self.weights.get(module, "fp32" if module == "router" else "bf16")

    def with_cache(self, kv_dtype: str | None = None, index_dtype: str | None = None) -> QuantScheme:
        """The same weights with other KV / index-key cache dtypes."""
        return dataclasses.replace(
            self,
            kv_dtype=normalize_cache_dtype(kv_dtype, "kv_dtype") if kv_dtype else self.kv_dtype,
            index_dtype=normalize_cache_dtype(index_dtype, "index_dtype") if index_dtype else self.index_dtype)


def _all(dtype: str, *modules: str) -> dict:
    return {m: dtype for m in modules}


_LINEARS = ("attn_qkv", "attn_o", "indexer_qk", "dense_mlp", "shared_expert", "routed_expert")
QUANT_SCHEMES: Mapping[str, QuantScheme] = MappingProxyType({
    "bf16": QuantScheme("bf16", {}, source="MiniMaxAI/MiniMax-M3 (BF16 weights, fp32 router)"),
    "fp8": QuantScheme("fp8", _all("fp8", *_LINEARS),
                       source="FP8 e4m3 per-channel checkpoints (e.g. EmbeddedLLM/MiniMax-M3-FP8-dynamic): every "
                              "linear except router, embedding and LM head; fused qkv+indexer as AITER tunes it"),
    "mxfp8": QuantScheme("mxfp8", _all("mxfp8", *_LINEARS),
                         source="MiniMaxAI/MiniMax-M3-MXFP8 (its quantization_config ignored_layers): "
                                "every linear incl. the index q/k projections of the fused qkv GEMM is MXFP8; "
                                "router, embedding and LM head unquantised"),
    "mxfp4": QuantScheme("mxfp4", _all("mxfp4", "shared_expert", "routed_expert"),
                         source="amd/MiniMax-M3-MXFP4 (its Quark exclude list): Quark excludes self_attn, router, LM head and "
                                "the dense MLP; routed and shared experts MXFP4"),
})


def load_quant(name: str | QuantScheme) -> QuantScheme:
    """A named scheme: bf16, fp8, mxfp8, mxfp4."""
    if isinstance(name, QuantScheme):
        return name
    key = str(name).strip().lower()
    if key not in QUANT_SCHEMES:
        raise M3LabError(f"unknown quantisation {name!r}", field="quant",
                         hint=f"use one of {', '.join(QUANT_SCHEMES)}")
    return QUANT_SCHEMES[key]
