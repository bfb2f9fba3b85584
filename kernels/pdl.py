"""Programmatic dependent launch (PDL) on NVIDIA Hopper and later, as vLLM launches its decode kernels.

A kernel launched with ``launch_pdl=True`` may be scheduled while the kernel before it in the stream is
still running; it calls ``tl.extra.cuda.gdc_wait()`` before touching any memory (which returns once that
kernel has finished and its writes are visible), and ``tl.extra.cuda.gdc_launch_dependents()`` once its
own dependents may be scheduled. Inside a CUDA graph the launch overlap is kept. Kernels take a
``USE_PDL`` constexpr; elsewhere (CPU interpreter, AMD, older NVIDIA) it is False and nothing changes.
"""
import torch


def pdl_enabled(device: torch.device) -> bool:
    """True on NVIDIA GPUs of compute capability >= 9 (vLLM's ``is_arch_support_pdl``)."""
    if device.type != "cuda" or torch.version.hip:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def pdl_launch(enabled: bool) -> dict:
    """The launch keywords: ``{"launch_pdl": True}`` when enabled (other backends reject the keyword)."""
    return {"launch_pdl": True} if enabled else {}
