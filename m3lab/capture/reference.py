"""Capture dispatch traces (and PyTorch profiler traces) of the reference model running engine steps.

``capture_dispatch_trace("minimax-m3", {"tp": 4}, [[2048], [1]], "out.jsonl.gz", device="meta",
layers=6)`` builds the model for rank 0 of the plan (random weights; ``meta`` allocates nothing),
runs each step (a list of new-token counts, one per request; request r continues across steps) and
writes every dispatched call through ``m3lab.traces.dispatch.DispatchTraceWriter``.
"""
from pathlib import Path
from typing import Any

import torch

from m3lab.arith import ceil_div
from m3lab.kernels.device import device_name as accelerator_name
from m3lab.provenance import commit as provenance_commit
from m3lab.dispatch.dispatcher import Dispatcher, plan_dict
from m3lab.model.build import build_model, resolve_model
from m3lab.traces.dispatch import DispatchTraceWriter


def build_traced_model(model: Any = None, plan: Any = None, *, device: str = "cpu", dtype=None, layers: int | None = None,
                       seed: int = 0, timed: bool = False, registry: Any = None):
    """A reference model (rank 0 of ``plan``) whose dispatcher keeps records; ``layers`` keeps the first n;
    ``registry``: the dispatcher's (default ``m3_registry()``)."""
    spec = resolve_model(model)
    if layers is not None:
        spec = spec.with_layers(layers)
    dtype = dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
    return build_model(spec, plan, dtype=dtype, device=device, seed=seed,
                       dispatcher=Dispatcher(plan=plan, timed=timed, registry=registry))


def run_steps(model, steps: list[list[int]], *, num_blocks: int | None = None, layout: str = "triton", seed: int = 0):
    """Run engine steps (new-token counts per request) on a fresh cache; returns the last step's logits."""
    c = model.model
    totals = [0] * max(len(s) for s in steps)
    for s in steps:
        for r, n in enumerate(s):
            totals[r] += n
    need = sum(ceil_div(t, c.sparse.block_size) for t in totals)
    cache = model.new_cache(num_blocks or need + len(totals), layout=layout)
    gen = torch.Generator().manual_seed(seed)
    logits = None
    for s in steps:
        reqs = [(r, torch.randint(0, c.vocab, (n,), generator=gen)) for r, n in enumerate(s) if n > 0]
        logits = model.step(cache, reqs)
    return logits


def capture_dispatch_trace(model: Any, plan: Any, steps: list[list[int]], path: str | Path, *, device: str = "meta",
                           layers: int | None = None, commit: str | None = None, timed: bool = False,
                           registry: Any = None, **header: Any) -> Path:
    """Run ``steps`` on the reference model and write the dispatch trace to ``path`` (.gz compresses)."""
    m = build_traced_model(model, plan, device=device, layers=layers, timed=timed, registry=registry)
    dev_name = accelerator_name(device)
    with DispatchTraceWriter(path, device=dev_name, commit=commit or provenance_commit(),
                             model=m.model.name, plan=plan_dict(plan), layers=m.model.layers, steps=steps,
                             torch=torch.__version__, **header) as w:
        m.dispatcher.writer = w
        run_steps(m, steps)
        m.dispatcher.writer = None
    return Path(path)
