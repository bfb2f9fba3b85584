"""Capture a timed dispatch trace and a PyTorch profiler (Kineto) trace of the reference model's layers.

Meant for a GPU box (no plotly needed)::

    python -c "from m3lab.capture.gpu import capture; capture('$OUT', commit='abc1234')"

Full M3 width at TP-local shapes (rank 0 of the plan), the first ``layers`` layers (default 5: three
dense layers and two sparse-attention MoE layers), random bf16 weights, the KV cache in vLLM's Triton layout.
Steps: one prefill step of ``prefill`` requests, then ``decodes`` decode steps. On a CUDA device vLLM's own
M3 kernels are the fast paths (``attach_vllm_kernels``: sparse attention, indexer score + top-k, Gemma
RMSNorm, SwiGLU-OAI, the unquantized GEMM); this repo's kernels attach to the paths they implement
(``attach_repo_kernels``). Before tracing, the first two steps run once with the fast paths and once on the
plain-torch references from the same weights and inputs: the logits' relative difference is recorded
(``check_vs_reference``), and a path whose kernel raises is detached. Writes ``<name>.dispatch.jsonl.gz``,
``<name>.kineto.json.gz`` and ``<name>.summary.json`` with ``name = m3_tp{tp}_L0-{layers-1}_{device}_{commit}``.
"""
import gzip
import json
import shutil
import time
from pathlib import Path

import torch

from m3lab.capture.reference import build_traced_model, run_steps
from m3lab.dispatch.dispatcher import plan_dict
from m3lab.dispatch.registry import attach_repo_kernels, m3_registry
from m3lab.kernels.device import device_name as accelerator_name
from m3lab.provenance import commit as provenance_commit
from m3lab.traces.dispatch import DispatchTraceWriter
from m3lab.vllm.reference_kernels import attach_vllm_kernels

LAYOUT = "triton"  # vLLM's Triton KV layout [blocks, kv_heads, 128, 2*head_dim]: its kernels read it in place


def _device_slug(device: str) -> str:
    if device.startswith("cuda"):
        return accelerator_name(device).lower().replace("nvidia ", "").replace(" ", "-")
    return device


def _attach(registry, model, device: str, with_kernels: bool, vllm_kernels: bool) -> dict[str, str]:
    status = attach_repo_kernels(registry) if with_kernels else {}
    if vllm_kernels and device.startswith("cuda"):
        sp = model.model.sparse
        status.update(attach_vllm_kernels(registry, topk=sp.topk_blocks, init_blocks=sp.init_blocks,
                                          local_blocks=sp.local_blocks))
    return status


def _check_vs_reference(model, steps, status: dict[str, str]) -> dict:
    """Run ``steps`` with the fast paths and on the references; detach paths whose kernels raise."""
    registry = model.dispatcher.registry
    failed: dict[str, Exception] = {}

    def guard(name, fn):
        def run(**kwargs):
            try:
                return fn(**kwargs)
            except Exception as err:  # noted, then re-raised so the step stops
                failed[name] = err
                raise
        return run

    impls = {name: p.impl for name, p in registry.paths.items() if p.impl is not None}
    for name, fn in impls.items():
        registry.paths[name].impl = guard(name, fn)
    fast = None
    for _ in range(len(impls) + 1):
        try:
            fast = run_steps(model, steps, layout=LAYOUT, seed=3).float()
            break
        except Exception:  # a failing kernel must not stop the capture: detach its path, run the reference
            if not failed:
                raise
            for name, err in failed.items():
                registry.paths[name].impl, impls[name] = None, None
                status[name] = f"detached: {type(err).__name__}: {str(err)[:300]}"
            failed.clear()
    for name, fn in impls.items():
        registry.paths[name].impl = fn
    model.dispatcher.registry = m3_registry()  # nothing attached: every op on its plain-torch reference
    ref = run_steps(model, steps, layout=LAYOUT, seed=3).float()
    model.dispatcher.registry = registry
    return {"steps": steps, "rel_err_logits": ((fast - ref).norm() / ref.norm()).item(),
            "max_abs_err_logits": (fast - ref).abs().max().item(),
            "note": "last-step logits, fast paths vs plain-torch references, same weights and tokens"}


def capture(out_dir: str, *, model: str = "minimax-m3", plan: dict | None = None, layers: int = 5,
            prefill: tuple[int, ...] = (4096, 1024), decodes: int = 3, device: str = "cuda",
            commit: str | None = None, with_kernels: bool = True, vllm_kernels: bool = True) -> dict:
    """Run the capture; returns the summary dict (also written as JSON)."""
    plan = plan if plan is not None else {"tp": 4, "fused_shared_expert": False}  # vLLM's default (no FSE)
    commit = commit or provenance_commit()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    m = build_traced_model(model, plan, device=device, layers=layers, timed=True)
    m.dispatcher.registry = m3_registry()
    m.dispatcher.keep = False
    steps = [list(prefill)] + [[1] * len(prefill)] * decodes
    kernels = _attach(m.dispatcher.registry, m, device, with_kernels, vllm_kernels)
    check = _check_vs_reference(m, steps[:2], kernels)  # also the warm-up: Triton compilation, allocator growth
    name = f"m3_tp{plan_dict(plan)['tp']}_L0-{layers - 1}_{_device_slug(device)}_{commit}"
    dev_name = accelerator_name(device)
    header = dict(device=dev_name, commit=commit, model=m.model.name, plan=plan_dict(plan), layers=layers, steps=steps,
                  torch=torch.__version__, kernels_attached=kernels, weights=f"random, {str(m.dtype).removeprefix('torch.')}, seed 0",
                  note="m3lab reference decoder, rank 0 of the plan, KV cache in vLLM's Triton layout; t_us per "
                       "dispatched call with a device sync")
    t0 = time.perf_counter()
    with DispatchTraceWriter(out / f"{name}.dispatch.jsonl.gz", **header) as w:
        m.dispatcher.writer = w
        run_steps(m, steps, layout=LAYOUT, seed=1)
    wall_dispatch = time.perf_counter() - t0
    m.dispatcher.writer, m.dispatcher.timed = None, False
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        if hasattr(prof, "add_metadata_json"):  # stored in the trace file's top level under "m3lab"
            prof.add_metadata_json("m3lab", json.dumps({**header, "steps": steps[:2]}))
        run_steps(m, steps[:2], layout=LAYOUT, seed=2)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    raw = out / f"{name}.kineto.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    summary = {**header, "name": name, "wall_s_dispatch_run": wall_dispatch, "check_vs_reference": check,
               "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None}
    (out / f"{name}.summary.json").write_text(json.dumps(summary, indent=1))
    return summary
