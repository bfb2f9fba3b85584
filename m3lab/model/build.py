"""Build a reference model for one rank from a config/spec, a plan and random or checkpoint weights."""
from typing import Any

import torch

from m3lab.dispatch import Dispatcher
from m3lab.model.config import LocalDims, M3Config, from_spec
from m3lab.model.decoder import M3Model


def model_config(model: Any = None) -> M3Config:
    """An M3Config from an M3Config, a ModelSpec, a name for ``m3lab.spec.model.load_model``, or None (mini)."""
    if model is None:
        return M3Config.mini()
    if isinstance(model, M3Config):
        return model
    if isinstance(model, str):
        from m3lab.spec.model import load_model
        return from_spec(load_model(model))
    return from_spec(model)


def build_model(model: Any = None, plan: Any = None, *, checkpoint: str | None = None, rank: int = 0,
                dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", seed: int | None = 0,
                dispatcher: Dispatcher | None = None) -> M3Model:
    """A reference M3 model.

    model: an M3Config, a ModelSpec, a name for ``m3lab.spec.model.load_model`` or None (the mini model);
    plan: a ParallelPlan/dict (None: one GPU, shared expert separate); checkpoint: a safetensors
    checkpoint (else random weights, ``seed``); device "meta" builds shapes only.
    """
    cfg = model_config(model)
    dims = LocalDims.from_plan(cfg, plan)
    if checkpoint is not None:
        from m3lab.weights.loader import load_weights
        weights, formats = load_weights(checkpoint, dims, rank=rank, dtype=dtype, device=device)
    else:
        from m3lab.weights.random_init import random_weights
        weights, formats = random_weights(dims, dtype=dtype, device=device, seed=seed), {}
    return M3Model(cfg, dims, weights, formats, dispatcher or Dispatcher(plan=plan))
