"""The declared target image: what the vLLM image on the GPU has that this CPU box does not.

vLLM asks its environment questions that a CPU box answers for itself, not for the serving image: is AITER
installed (``importlib.util.find_spec("aiter")``), does ``aiter.fused_moe.fused_moe`` take ``gate_mode``
(``rocm_aiter_ops.fused_moe_supports_gate_mode`` probes the signature), how many MFMA columns the MSA
score pass has (``aiter.ops.msa_block_select.SCORE_MFMA_COLS``), is ``amd-quark`` importable
(``vllm.utils.import_utils.has_quark``), does the AITER custom all-reduce take a message of this size
(``CustomAllreduce.should_custom_ar``). :mod:`m3lab.vllm.emulate` answers them from this profile, so they are
declared once, here, with where each answer comes from. Everything else vLLM decides with its own code.

An AITER module listed in :attr:`TargetImage.aiter_modules` exists and every attribute of it is a callable
stand-in that raises when called (nothing AITER runs here); names in :attr:`aiter_absent` do not exist;
:attr:`aiter_signatures` gives the parameters vLLM inspects; :attr:`library_values` the constants it reads
and the answers of the device queries it makes while building (functions of the emulated device).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

# Public AITER source (github.com/ROCm/aiter): aiter/fused_moe.py fused_moe(), whose parameters include
# gate_mode (ROCm/aiter#3123, aiter >= 0.1.14) and not quant_dtype_a (ROCm/aiter#5439, unreleased).
_FUSED_MOE_PARAMS = (
    "hidden_states", "w1", "w2", "topk_weight", "topk_ids", "expert_mask", "activation", "quant_type",
    "doweight_stage1", "w1_scale", "w2_scale", "a1_scale", "a2_scale", "block_size_M", "num_local_tokens",
    "moe_sorting_dispatch_policy", "dtype", "hidden_pad", "intermediate_pad", "bias1", "bias2", "splitk",
    "swiglu_limit", "beta", "linear_beta", "gate_mode", "shared_w1", "shared_w2", "shared_w1_scale",
    "shared_w2_scale", "shared_expert_id", "stage2_scatter")

# AITER's own custom all-reduce size rule (aiter/dist/device_communicators/custom_all_reduce.py,
# CustomAllreduce._fits_custom_ar_size with AITER_CUSTOM_AR_MAX_SIZE / _MIN_SIZE unset): a message of
# n bytes takes the custom kernel when n % 16 == 0, 0 < n <= 64 MiB, on 2 GPUs or a fully connected
# (XGMI) group. The only AITER rule m3lab states in its own words.
AITER_CAR_MAX_BYTES = 8192 * 8192
AITER_CAR_MIN_BYTES = 0


def aiter_should_custom_ar(nbytes: int, world_size: int, fully_connected: bool) -> bool:
    """``CustomAllreduce.should_custom_ar`` of the target image's AITER for a contiguous message."""
    if nbytes % 16 or nbytes <= AITER_CAR_MIN_BYTES or AITER_CAR_MAX_BYTES <= 0:
        return False
    return (world_size == 2 or fully_connected) and nbytes <= AITER_CAR_MAX_BYTES


def _numel(world: int, heads: int, rows: int, topk: int) -> int:
    """A buffer size for AITER's CP candidate exchange (any positive size serves: nothing reads it here)."""
    return world * heads * rows * topk


def aiter_should_custom_ag(nbytes: int, world_size: int, fully_connected: bool, max_size: int) -> bool:
    """AITER's all-gather rule (``CustomAllreduce.should_custom_ag``, same file): a 16-byte multiple, 2 GPUs
    or fully connected, and the gathered output within the registered buffer."""
    return nbytes % 16 == 0 and (world_size == 2 or fully_connected) and nbytes <= max_size / (world_size * 2)


@dataclass(frozen=True)
class TargetImage:
    """What the serving image answers to vLLM's environment probes (see the module docstring)."""

    name: str
    packages: tuple[str, ...]                    # optional packages importable there (``has_<pkg>()``)
    aiter_modules: tuple[str, ...] = ()          # AITER modules that exist (each attribute a stand-in)
    aiter_absent: tuple[str, ...] = ()           # AITER attributes that do not exist on the image
    aiter_signatures: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    library_values: Mapping[str, object] = field(default_factory=dict)  # constants and queries' answers
    fully_connected: bool = True                 # XGMI / NVLink: every GPU one hop from every other
    flash_attn_versions: tuple[int, ...] = ()    # vllm.vllm_flash_attn versions available (CUDA)
    compiled_ops: tuple[str, ...] = ()           # vLLM's compiled ops bound at import ("_C.rotary_embedding")
    source: str = ""

    def with_packages(self, *add: str, drop: tuple[str, ...] = ()) -> TargetImage:
        """The same image with optional packages added or removed (what-if questions)."""
        kept = tuple(p for p in self.packages if p not in drop)
        return TargetImage(**{**self.__dict__, "packages": tuple(dict.fromkeys(kept + add))})


ROCM_IMAGE = TargetImage(
    name="vLLM 0.33.0 ROCm image (MI300X / MI355X)",
    packages=("aiter", "quark"),   # amd-quark: vLLM's requirements/rocm.txt pins amd-quark==0.12.post1
    aiter_modules=(
        "aiter", "aiter.fused_moe", "aiter.ops", "aiter.ops.shuffle", "aiter.ops.triton",
        "aiter.ops.triton.quant", "aiter.ops.triton.gemm_a16w16", "aiter.ops.triton.unified_attention",
        "aiter.ops.triton.gluon",
        "aiter.ops.triton.gluon.pa_decode_gluon", "aiter.ops.msa_attention", "aiter.ops.msa_block_select",
        "aiter.ops.flydsl", "aiter.ops.flydsl.moe_common", "aiter.tuned_gemm", "aiter.utility",
        "aiter.utility.fp4_utils", "aiter.dist", "aiter.dist.device_communicators",
        "aiter.dist.device_communicators.custom_all_reduce", "aiter.jit", "aiter.jit.core"),
    aiter_signatures=MappingProxyType({"aiter.fused_moe.fused_moe": _FUSED_MOE_PARAMS}),
    # aiter/ops/msa_block_select.py: the fp8 MFMA score pass holds 16 query columns; the CP top-k merge 64
    # candidates (public AITER source of the MSA indexer; this repository holds no copy)
    # The CP merge's buffer sizes (CP_MAX_BLOCKS, topk_cp_candidate_numel) only size allocations nothing
    # reads here: any positive size serves.
    library_values=MappingProxyType({"aiter.ops.msa_block_select.SCORE_MFMA_COLS": 16,
                                      "aiter.ops.msa_block_select.TOPK_CP_MAX_CAND": 64,
                                      "aiter.ops.msa_block_select.CP_MAX_BLOCKS": 8192,
                                      "aiter.ops.msa_block_select.topk_cp_candidate_numel": _numel}),
    fully_connected=True,
    source="public AITER source (github.com/ROCm/aiter) for signatures, constants and the custom-AR size "
           "rule; package set: the image ships AITER, and amd-quark (vLLM's requirements/rocm.txt pins "
           "amd-quark==0.12.post1; the image installs that file)")

def _buffer_bytes(*args, **kwargs) -> int:
    """A buffer size (any positive size serves: nothing reads the buffer here)."""
    return 4096


def _sm_count(*args, **kwargs) -> int:
    """flashinfer's SM-count query, answered from the emulated device's properties."""
    import torch
    return torch.cuda.get_device_properties(0).multi_processor_count


CUDA_IMAGE = TargetImage(
    name="vLLM 0.33.0 CUDA image (H200 / B200)",
    # vLLM 0.33.0's metadata requires flashinfer-python==0.7.2.post1. Not declared: the CuteDSL stack
    # (nvidia-cutlass-dsl): vLLM's CuteDSL paths (the H200 router's <= 16-token tier, SM100's fmha_sm100,
    # which compiles CUDA C++ while the model is built) are not emulated, so they count as absent.
    # flashinfer_cubin: the pre-downloaded TRT-LLM cubins (assumed in the image; without it vLLM would probe
    # NVIDIA's artifactory over the network to decide whether TRT-LLM attention kernels are available)
    packages=("flashinfer", "flashinfer_cubin"),
    # device queries answered from the emulated device; buffer sizes only size allocations nothing reads here
    library_values=MappingProxyType({"flashinfer.utils.get_device_sm_count": _sm_count,
                                     "flashinfer.utils.get_trtllm_gen_multi_ctas_kv_counter_bytes": _buffer_bytes}),
    fully_connected=True,
    flash_attn_versions=(2, 3),
    # the CUDA wheel's vllm._C: ops vLLM's compilation passes bind at import (they exist in every build)
    compiled_ops=tuple(f"_C.{op}" for op in (
        "rotary_embedding", "static_scaled_fp8_quant", "dynamic_scaled_fp8_quant",
        "dynamic_per_token_scaled_fp8_quant", "per_token_group_fp8_quant", "silu_and_mul", "fused_add_rms_norm",
        "fused_qk_norm_rope", "rms_norm", "rms_norm_static_fp8_quant", "fused_add_rms_norm_static_fp8_quant",
        "rms_norm_dynamic_per_token_quant", "rms_norm_per_block_quant", "silu_and_mul_with_clamp")),
    source="vLLM 0.33.0 wheel metadata (flashinfer-python); vllm_flash_attn FA2/FA3 assumed built in")


def image_for(kind: str) -> TargetImage:
    """The declared image of a platform kind ("rocm" | "cuda")."""
    return ROCM_IMAGE if kind == "rocm" else CUDA_IMAGE
