"""Checks of a deployment before ``m3lab vllm plan`` prints its commands: what would stop the server from starting.
"""
from __future__ import annotations

from m3lab.errors import M3LabError
from m3lab.spec.memory import weight_bytes_per_gpu
from m3lab.spec.serving import Deployment


def check_weights_fit(dep: Deployment) -> None:
    """Raise M3LabError when the weights one GPU holds (:func:`m3lab.spec.memory.weight_bytes_per_gpu`) exceed
    the HBM of the deployment's GPU: such a server cannot start, so no command is printed for it."""
    per_gpu = weight_bytes_per_gpu(dep.model, dep.plan, dep.quant)
    hbm = dep.hardware.hbm_bytes
    if per_gpu > hbm:
        raise M3LabError(f"{dep.name or dep.model.name}: the {dep.quant.name} weights take {per_gpu / 1e9:,.0f} GB per "
                         f"GPU at TP{dep.plan.tp} EP{dep.plan.ep}, more than the {hbm / 1e9:,.0f} GB of one "
                         f"{dep.hardware.name}", field="--tp",
                         hint="raise --tp or --ep, or quantise the weights (--quant mxfp8 or mxfp4)")
