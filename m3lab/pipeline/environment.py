"""What a run records about where it ran: package versions, git commit, device."""
from __future__ import annotations

import platform
from importlib import metadata

from m3lab.provenance import commit, device_name

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


def describe() -> dict:
    """Everything :mod:`summary.json <m3lab.pipeline.runner>` records about the environment."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "git_commit": commit(),
        "device": device_name(),
    }
