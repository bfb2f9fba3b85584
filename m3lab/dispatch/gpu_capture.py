"""Capture a timed dispatch trace and a PyTorch profiler (Kineto) trace of the reference model's layers.

Meant for a GPU box (no plotly needed)::

    python -c "from m3lab.dispatch.gpu_capture import capture; capture('$OUT', commit='abc1234')"

Full M3 width at TP-local shapes (rank 0 of the plan), the first ``layers`` layers (default 5: three
dense layers and two sparse-attention MoE layers), random bf16 weights. Steps: one prefill step of
``prefill`` requests, then ``decodes`` decode steps. This repo's kernels that implement declared paths
(``attach_repo_kernels``) are attached after a correctness smoke check against the reference; the
trace header says which. Writes ``<name>.dispatch.jsonl.gz``, ``<name>.kineto.json.gz`` and
``<name>.summary.json`` with ``name = m3_tp{tp}_L0-{layers-1}_{device}_{commit}``.
"""
import gzip
import json
import os
import shutil
import time
from pathlib import Path

import torch

from m3lab.dispatch.capture import build_traced_model, run_steps
from m3lab.dispatch.dispatcher import plan_dict
from m3lab.dispatch.registry import attach_repo_kernels, m3_registry


def _device_slug(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name().lower().replace("nvidia ", "").replace(" ", "-")
    return device


def _smoke_check(registry, model) -> dict[str, str]:
    """Attach repo kernels; keep each only if it matches the reference on this model's GEMM shapes (M = 4 and 300)."""
    from m3lab.kernels.gemm.reference import linear_ref
    status = attach_repo_kernels(registry)
    for name, m in (("gemm.decode_tile_table", 4), ("gemm.prefill_tile_table", 300)):
        path = registry.paths[name]
        if path.impl is None:
            continue
        try:
            for wname in ("layers.0.qkv", "layers.0.o_proj", "layers.0.down", "lm_head"):
                w = model.weights[wname]
                x = torch.randn(m, w.shape[1], device=w.device, dtype=w.dtype)
                got, ref = path.impl(x=x, w=w, w_scale=None, w_format="bf16"), linear_ref(x, w)
                err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
                if not err < 2e-2:
                    raise ValueError(f"{wname}: relative error {err:.3g}")
        except Exception as err:  # a failing kernel must not stop the capture: record it, run the reference
            path.impl = None
            status[name] = f"detached after smoke check: {type(err).__name__}: {err}"
    return status


def capture(out_dir: str, *, model: str = "minimax-m3", plan: dict | None = None, layers: int = 5,
            prefill: tuple[int, ...] = (4096, 1024), decodes: int = 3, device: str = "cuda",
            commit: str | None = None, with_kernels: bool = True) -> dict:
    """Run the capture; returns the summary dict (also written as JSON)."""
    from m3lab.traces.dispatch import DispatchTraceWriter
    plan = plan if plan is not None else {"tp": 4, "fused_shared_expert": True}
    commit = commit or os.environ.get("GIT_COMMIT", "unknown")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    m = build_traced_model(model, plan, device=device, layers=layers, timed=True)
    m.dispatcher.registry = m3_registry()
    kernels = _smoke_check(m.dispatcher.registry, m) if with_kernels else {}
    m.dispatcher.keep = False
    steps = [list(prefill)] + [[1] * len(prefill)] * decodes
    run_steps(m, steps[:2])  # warm-up on the same shapes: Triton compilation, allocator growth
    name = f"m3_tp{plan_dict(plan)['tp']}_L0-{layers - 1}_{_device_slug(device)}_{commit}"
    dev_name = torch.cuda.get_device_name() if device.startswith("cuda") else device
    header = dict(device=dev_name, commit=commit, model=m.model.name, plan=plan_dict(plan), layers=layers, steps=steps,
                  torch=torch.__version__, kernels_attached=kernels, weights=f"random, {str(m.dtype).removeprefix('torch.')}, seed 0",
                  note="m3lab reference decoder, rank 0 of the plan; t_us per dispatched call with a device sync")
    t0 = time.perf_counter()
    with DispatchTraceWriter(out / f"{name}.dispatch.jsonl.gz", **header) as w:
        m.dispatcher.writer = w
        run_steps(m, steps, seed=1)
    wall_dispatch = time.perf_counter() - t0
    m.dispatcher.writer, m.dispatcher.timed = None, False
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        if hasattr(prof, "add_metadata_json"):  # stored in the trace file's top level under "m3lab"
            prof.add_metadata_json("m3lab", json.dumps({**header, "steps": steps[:2]}))
        run_steps(m, steps[:2], seed=2)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    raw = out / f"{name}.kineto.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    summary = {**header, "name": name, "wall_s_dispatch_run": wall_dispatch,
               "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None}
    (out / f"{name}.summary.json").write_text(json.dumps(summary, indent=1))
    return summary
