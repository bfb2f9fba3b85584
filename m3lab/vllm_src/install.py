"""Which vLLM m3lab reads, whether it is here, and what to run when it is not.

m3lab reads vLLM 0.33.0's MiniMax M3 code (``vllm/models/minimax_m3``), its config class, its kernels and its
prefix-cache classes. On a CPU box vLLM is installed without its CUDA stack (``--no-deps`` plus the pure-Python
packages pinned in ``cpu_requirements.txt`` beside this file); on a GPU box the vLLM already installed is used.
"""
from __future__ import annotations

import warnings
from importlib import metadata
from pathlib import Path

from m3lab.errors import M3LabError

VLLM_VERSION = "0.33.0"
CPU_REQUIREMENTS = Path(__file__).with_name("cpu_requirements.txt")
INSTALL_COMMAND = (f"pip install --no-deps vllm=={VLLM_VERSION} && "
                   f"pip install --no-deps -r {CPU_REQUIREMENTS}")
_told: set[str] = set()


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def installed_version() -> str | None:
    """The installed vLLM's version (from its package metadata), or None."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def problem() -> str | None:
    """None when a usable vLLM (>= VLLM_VERSION) is installed, else what is wrong with the install command."""
    have = installed_version()
    if have is None:
        return f"vLLM is not installed; install it with: {INSTALL_COMMAND}"
    if _version_tuple(have) < _version_tuple(VLLM_VERSION):
        return f"vLLM {have} is older than {VLLM_VERSION}; upgrade with: {INSTALL_COMMAND}"
    return None


def available() -> bool:
    """Whether a usable vLLM is installed (no import is attempted)."""
    return problem() is None


def require(feature: str) -> str:
    """The vLLM version, or raise M3LabError naming ``feature`` and the install command."""
    why = problem()
    if why is not None:
        raise M3LabError(f"{feature} needs vLLM {VLLM_VERSION}: {why}", field="vllm")
    return installed_version()


def tell_once(feature: str) -> bool:
    """For optional features: True when vLLM is usable; else warn once per feature (with the command), False."""
    why = problem()
    if why is None:
        return True
    if feature not in _told:
        _told.add(feature)
        warnings.warn(f"{feature} is skipped: {why}", stacklevel=2)
    return False
