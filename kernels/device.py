"""The accelerator's name, one rule for table file names and provenance stamps alike."""
from __future__ import annotations

import torch


def device_name(device: torch.device | str | None = None) -> str:
    """torch's name of the accelerator (``"NVIDIA H200"``, ``"AMD Instinct MI355X"``) for a ``cuda`` device
    (default ``"cuda"``), else the device type (``"cpu"``, ``"meta"``)."""
    device = torch.device(device if device is not None else "cuda")
    if device.type != "cuda":
        return device.type
    return torch.cuda.get_device_name(device)


def table_device_name(device: torch.device | str | None = None) -> str:
    """The name as vLLM spells it in table file names, spaces as ``_`` (``"NVIDIA_H200"``; ``"cpu"``)."""
    return device_name(device).replace(" ", "_")
