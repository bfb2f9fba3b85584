"""Import vLLM's MiniMax M3 code and kernels without its compiled extensions (CPU box or GPU box).

:func:`prepare` runs once, before the first vLLM import, and does what importing vLLM's Python files needs
where its CUDA stack is absent:

- on a machine without a GPU, ``CUDA_VISIBLE_DEVICES=""``: otherwise ``vllm.triton_utils`` finds no active GPU
  driver and swaps Triton for placeholders (the first kernel call then fails on ``triton.next_power_of_2``);
- ``HF_HUB_OFFLINE=1`` (configs are read from local files only);
- empty stand-ins for ``vllm._C`` / ``vllm._C_stable_libtorch`` when the compiled op libraries are absent
  (vLLM's platform module imports them only to register ops that the Triton kernels do not use);
- where those stand-ins are in place on a GPU, vLLM's import-time CUTLASS capability queries
  (``vllm._custom_ops.cutlass_*supported*``) answer False and ``vllm.vllm_flash_attn`` is a stand-in whose
  functions say they need the compiled extensions (vLLM's CUDA branches import both at module level);
- ``vllm.models.minimax_m3`` registered as a bare package, so importing ``.common.ops`` or ``.amd.ops`` runs
  their harmless ``__init__`` files but not the package's, which imports the whole model (and torchvision).

Environment variables that vLLM reads at import (``TRITON_INTERPRET``, ``VLLM_*``) must be set before the first
call. :func:`m3_module` and :func:`vllm_module` are the only ways m3lab imports vLLM code.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from types import ModuleType

from m3lab.vllm_src import install

M3_PACKAGE = "vllm.models.minimax_m3"
_COMPILED = ("vllm._C", "vllm._C_stable_libtorch")
_prepared = False


def _has_gpu() -> bool:
    import torch
    return bool(torch.cuda.is_available())


_CUTLASS_QUERIES = ("cutlass_scaled_mm_supports_fp8", "cutlass_scaled_mm_supports_block_fp8",
                    "cutlass_group_gemm_supported")


def _stand_in_compiled_ops() -> bool:
    """Empty modules for the compiled op libraries that are absent; True if any was stood in."""
    stood_in = False
    for name in _COMPILED:
        if name in sys.modules:
            continue
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            sys.modules[name] = types.ModuleType(name)
            stood_in = True
    return stood_in


_FLASH_ATTN = "vllm.vllm_flash_attn"
_FLASH_ATTN_NAMES = ("compile_flash_attn_varlen_func_from_specs", "flash_attn_varlen_func",
                     "get_scheduler_metadata", "fa_version_unsupported_reason", "is_fa_version_supported")


def _unavailable(name: str):
    def fn(*args, **kwargs):
        raise RuntimeError(f"{name} needs vLLM's compiled extensions, which are not installed here")
    return fn


def _no_compiled_kernels_on_gpu() -> None:
    """CUTLASS capability queries answer False; vLLM's flash-attention package is a stand-in that says so."""
    ops = importlib.import_module("vllm._custom_ops")
    for name in _CUTLASS_QUERIES:
        if hasattr(ops, name):
            setattr(ops, name, lambda *args, **kwargs: False)
    if _FLASH_ATTN not in sys.modules:
        fa = types.ModuleType(_FLASH_ATTN)
        for name in _FLASH_ATTN_NAMES:
            setattr(fa, name, _unavailable(name))
        fa.FA2_AVAILABLE = fa.FA3_AVAILABLE = False
        sys.modules[_FLASH_ATTN] = fa


def _bare_m3_package() -> None:
    if M3_PACKAGE in sys.modules:
        return
    import vllm.models
    pkg = types.ModuleType(M3_PACKAGE)
    pkg.__path__ = [os.path.join(os.path.dirname(vllm.models.__file__), "minimax_m3")]
    pkg.__package__ = M3_PACKAGE
    sys.modules[M3_PACKAGE] = pkg


def prepare(feature: str = "reading vLLM's MiniMax M3 code") -> None:
    """Make vLLM importable here (idempotent); raises M3LabError with the install command if it is missing."""
    global _prepared
    if _prepared:
        return
    install.require(feature)
    if "vllm" not in sys.modules:
        if not _has_gpu():
            os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if _stand_in_compiled_ops() and _has_gpu():
        _no_compiled_kernels_on_gpu()
    _bare_m3_package()
    _prepared = True


def vllm_module(name: str, feature: str | None = None) -> ModuleType:
    """``importlib.import_module(name)`` for a module of vLLM, after :func:`prepare`."""
    prepare(feature or f"importing {name}")
    return importlib.import_module(name)


def m3_module(relative: str, feature: str | None = None) -> ModuleType:
    """A module of vLLM's MiniMax M3 package by its path below it, e.g. ``"common.ops.sparse_attn"``.

    Always the module (``amd/ops/__init__.py`` re-exports functions under their modules' names, so
    ``import ... as`` would bind a function).
    """
    return vllm_module(f"{M3_PACKAGE}.{relative}", feature)
