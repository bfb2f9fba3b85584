"""Build a reference model for one rank from a ModelSpec, a plan and random or checkpoint weights."""
from typing import Any

import torch

from m3lab.dispatch import Dispatcher
from m3lab.errors import M3LabError
from m3lab.model.decoder import M3Model
from m3lab.spec.model import ModelSpec, load_model
from m3lab.spec.plan import ParallelPlan, as_plan


def resolve_model(model: Any = None) -> ModelSpec:
    """A ModelSpec from a ModelSpec, a name or config path for ``m3lab.spec.model.load_model``, or None (the
    mini model). The reference decoder runs MiniMax M3 (block-sparse attention with an indexer)."""
    spec = ModelSpec.mini() if model is None else load_model(model)
    if spec.family != "minimax_m3" or spec.sparse is None:
        raise M3LabError(f"the reference decoder runs MiniMax M3 models; {spec.name} is {spec.family}",
                         field="model", hint="use minimax-m3, minimax-m3-mini or an M3 config.json")
    return spec


def build_model(model: Any = None, plan: Any = None, *, checkpoint: str | None = None, rank: int = 0,
                dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", seed: int | None = 0,
                dispatcher: Dispatcher | None = None) -> M3Model:
    """A reference M3 model.

    model: a ModelSpec, a name or config path for ``m3lab.spec.model.load_model`` or None (the mini model);
    plan: a ParallelPlan/dict (None: one GPU, shared expert not fused, vLLM's default); checkpoint: a
    safetensors checkpoint (else random weights, ``seed``); device "meta" builds shapes only.
    """
    spec = resolve_model(model)
    pl: ParallelPlan = as_plan(plan).validate(spec)
    if checkpoint is not None:
        from m3lab.weights.loader import load_weights  # local: pulls in safetensors
        weights, formats = load_weights(checkpoint, spec, pl, rank=rank, dtype=dtype, device=device)
    else:
        from m3lab.weights.random_init import random_weights  # local: pulls in safetensors
        weights, formats = random_weights(spec, pl, dtype=dtype, device=device, seed=seed), {}
    return M3Model(spec, pl, weights, formats, dispatcher or Dispatcher(plan=pl), rank=rank)
