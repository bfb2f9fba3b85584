"""The vLLM launch switches that change which code runs (:class:`ServingConfig`), with vLLM 0.33.0's defaults.

The ROCm AITER environment flags (``vllm/envs.py:138-162,1267-1403``), the shuffled KV-cache layout, the
model-runner choice, ``--monokernel``, ``--moe-backend``, the speculative config (method, draft tokens, draft
checkpoint), the CUDA-graph mode and ``--max-model-len``. A test compares each default with ``vllm.envs`` and
vLLM's config classes. Switches another spec owns stay there (see :mod:`m3lab.spec.serving`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from m3lab.errors import M3LabError

# ServingConfig field -> vLLM environment variable (boolean flags, parsed as vLLM does: "1"/"true" is on).
ENV_FLAGS: Mapping[str, str] = {
    "aiter": "VLLM_ROCM_USE_AITER",
    "aiter_linear": "VLLM_ROCM_USE_AITER_LINEAR",
    "aiter_moe": "VLLM_ROCM_USE_AITER_MOE",
    "aiter_custom_ar": "VLLM_ROCM_USE_AITER_CUSTOM_AR",
    "aiter_mha": "VLLM_ROCM_USE_AITER_MHA",
    "aiter_unified_attention": "VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION",
    "aiter_triton_gemm": "VLLM_ROCM_USE_AITER_TRITON_GEMM",
    "skinny_gemm": "VLLM_ROCM_USE_SKINNY_GEMM",
    "shuffle_kv_cache": "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT",
}
FSE_ENV = "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS"  # rendered from ParallelPlan.fused_shared_expert
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"  # tri-state in vLLM: unset lets VllmConfig decide
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
SPEC_METHODS = ("eagle3", "eagle", "mtp", "ngram", "minimax_m3_mtp")
MOE_BACKENDS = ("auto", "aiter", "triton")  # the values that change M3's expert kernels (config/kernel.py:122)


def env_bool(value: str | None, default: bool) -> bool:
    """vLLM's rule for its boolean flags (``envs.py:1267``): unset -> default, else "1"/"true" (any case)."""
    return default if value is None else value.strip().lower() in ("true", "1")


@dataclass(frozen=True)
class ServingConfig:
    """vLLM launch switches owned by no other m3lab spec; defaults are vLLM 0.33.0's."""

    aiter: bool = False                   # VLLM_ROCM_USE_AITER (envs.py:1267)
    aiter_linear: bool = True             # VLLM_ROCM_USE_AITER_LINEAR (envs.py:1288)
    aiter_moe: bool = True                # VLLM_ROCM_USE_AITER_MOE (envs.py:1296)
    aiter_custom_ar: bool = True          # VLLM_ROCM_USE_AITER_CUSTOM_AR (envs.py:1272)
    aiter_mha: bool = True                # VLLM_ROCM_USE_AITER_MHA (envs.py:1350)
    aiter_unified_attention: bool = False  # VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION (envs.py:1378)
    aiter_triton_gemm: bool = True        # VLLM_ROCM_USE_AITER_TRITON_GEMM (envs.py:1390)
    skinny_gemm: bool = True              # VLLM_ROCM_USE_SKINNY_GEMM (envs.py:1394)
    shuffle_kv_cache: bool = False        # VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT (envs.py:1402)
    model_runner_v2: bool | None = None   # VLLM_USE_V2_MODEL_RUNNER; None: VllmConfig.use_v2_model_runner decides
    monokernel: bool = False              # --monokernel (config/kernel.py:299)
    moe_backend: str = "auto"             # --moe-backend (config/kernel.py:305)
    spec_method: str | None = None        # --speculative-config method
    spec_tokens: int = 0                  # --speculative-config num_speculative_tokens
    spec_model: str | None = None         # --speculative-config model (the draft checkpoint)
    cudagraph_mode: str = "FULL_AND_PIECEWISE"  # -cc cudagraph_mode; the V1 default (config/compilation.py:618)
    max_model_len: int | None = None      # --max-model-len; None: the model's max_position_embeddings

    def validate(self) -> ServingConfig:
        """Raise M3LabError naming the field when a value is not one vLLM accepts; return self."""
        for name in ENV_FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise M3LabError(f"{name} must be true or false, got {getattr(self, name)!r}", field=name)
        if self.moe_backend not in MOE_BACKENDS:
            raise M3LabError(f"moe_backend {self.moe_backend!r} is not one m3lab resolves", field="moe_backend",
                             hint=f"use one of {', '.join(MOE_BACKENDS)}")
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise M3LabError(f"cudagraph_mode {self.cudagraph_mode!r} is unknown", field="cudagraph_mode",
                             hint=f"use one of {', '.join(CUDAGRAPH_MODES)}")
        if self.spec_method is not None and self.spec_method not in SPEC_METHODS:
            raise M3LabError(f"spec_method {self.spec_method!r} is unknown", field="spec_method",
                             hint=f"use one of {', '.join(SPEC_METHODS)}")
        if (self.spec_method is None) != (self.spec_tokens == 0) or self.spec_tokens < 0:
            raise M3LabError("spec_method and spec_tokens go together (a method needs spec_tokens >= 1)",
                             field="spec_tokens", hint="e.g. spec_method=eagle3 spec_tokens=3")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise M3LabError(f"max_model_len must be positive, got {self.max_model_len}", field="max_model_len")
        return self

    @property
    def decode_query_len(self) -> int:
        """Query rows per request in a decode step: 1 + speculative tokens (the verify rows)."""
        return 1 + self.spec_tokens

    def env(self) -> dict[str, str]:
        """The environment variables that differ from vLLM's defaults ("1"/"0")."""
        default = ServingConfig()
        out = {var: "1" if getattr(self, f) else "0" for f, var in ENV_FLAGS.items()
               if getattr(self, f) != getattr(default, f)}
        if self.model_runner_v2 is not None:
            out[V2_RUNNER_ENV] = "1" if self.model_runner_v2 else "0"
        return out
