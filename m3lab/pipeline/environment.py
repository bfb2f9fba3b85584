"""What a run records about where it ran: package versions, git commit, device."""
from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("m3lab", "torch", "triton", "numpy", "pandas", "pyarrow", "plotly", "papermill", "nbformat", "vllm")


def package_versions(names=PACKAGES) -> dict[str, str | None]:
    """Installed versions of the packages that matter for reproducing a run (None: not installed)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(repo: Path | None = None) -> str:
    """``$GIT_COMMIT`` if set, else ``git rev-parse HEAD`` of the repo (``-dirty`` when changed), else 'unknown'."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    repo = repo or Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name() -> str:
    """The accelerator torch sees ('NVIDIA H200', 'AMD Instinct MI355X', …) or 'cpu (<processor>)'."""
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # torch missing or broken: still record the CPU
        pass
    return f"cpu ({platform.processor() or platform.machine()})"


def describe() -> dict:
    """Everything :mod:`summary.json <m3lab.pipeline.runner>` records about the environment."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "git_commit": git_commit(),
        "device": device_name(),
    }
