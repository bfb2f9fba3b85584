"""Where one decode step's time goes: per op, the kernel vLLM runs, its calls, bytes, FLOPs, µs and share.

``decode_step_breakdown(deployment, *, batch=None, context=None, calibration="default") -> DataFrame`` (stable
signature) builds one decode step of ``batch`` requests at mean KV length ``context`` with the kernels vLLM runs
for the deployment (its Dispatch, :mod:`m3lab.serving.dispatch`), costs it (:mod:`m3lab.cost.model`) and groups
the OpTable rows by the vLLM op whose decision picks their kernel (:data:`m3lab.optable.dispatch.OP_DECISION`)
and its path: the view a performance engineer compares with a profiler's phase table. Defaults: ``batch`` =
the workload's concurrency (at most ``max_num_seqs``), ``context`` = ``isl + osl // 2`` (the mean KV length over a
request's decode); :func:`run_decode_point` gives the run's own mean batch and context from an estimate.

Columns (one row per (op, path), largest time first):

| column | meaning |
|---|---|
| ``op`` | the vLLM op (``m3lab fastpaths`` names: qkv_proj, indexer, attention, experts, allreduce_norm, ...); an OpTable op where no decision covers it (embedding, logits_gather) |
| ``layer_kinds`` | the layer kinds it runs on (dense, sparse, sparse_reuse, model) |
| ``decision``, ``path``, ``kernel`` | the resolver's label, path id and kernels |
| ``optable_ops`` | the OpTable rows it covers |
| ``calls`` | layers it runs in per step (1 for the model-level ops) |
| ``bytes`` | HBM bytes read and written per step (the OpTable's bytes_compute + bytes_weight + bytes_kv) |
| ``comm_bytes`` | bytes on the GPU link per step |
| ``flops`` | FLOPs per step |
| ``us``, ``share`` | time per step and its share of the step (shares sum to 1) |
| ``source`` | the cost source(s) (:mod:`m3lab.cost.sources`) |

A speculative deployment's step verifies 1 + k rows per request; its draft model is one more row (``draft_model``,
``acceptance.draft_cost`` x the plain decode step per draft token).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from m3lab.cost.model import cost_optable, resolve_calibration
from m3lab.errors import M3LabError
from m3lab.optable import build_optable
from m3lab.optable.builder import topk_sources
from m3lab.optable.dispatch import OP_DECISION, layer_kind
from m3lab.serving.dispatch import dispatch_for
from m3lab.spec.model import ATTN_SPARSE
from m3lab.workload.step import EngineStep

COLUMNS = ("op", "layer_kinds", "decision", "path", "kernel", "optable_ops", "calls", "bytes", "comm_bytes", "flops",
           "us", "share", "source")
BYTE_COLUMNS = ("bytes_compute", "bytes_weight", "bytes_kv")
LINE_WIDTH = 80


def default_point(deployment) -> tuple[int, int]:
    """(batch, context) of a steady decode step of the deployment's workload (see the module docstring)."""
    d = deployment
    limits = d.scheduler_limits()
    return max(1, min(int(d.workload.concurrency), int(limits.max_num_seqs))), int(d.workload.isl + d.workload.osl // 2)


def run_decode_point(estimate) -> tuple[int, int]:
    """The run's mean decode batch (decode-only steps, weighted by how many there are) and mean context."""
    steps = estimate.steps
    dec = steps[(steps["prefill_tokens"] == 0) & (steps["decodes"] > 0)]
    c = estimate.config
    if dec.empty:
        return max(1, int(c["concurrency"])), int(c["isl"] + c["osl"] // 2)
    batch = float((dec["decodes"] * dec["repeat"]).sum() / dec["repeat"].sum())
    return max(1, int(round(batch))), int(c["isl"] + c["osl"] // 2)


def decode_step(deployment, batch: int, context: int) -> EngineStep:
    """``batch`` decode requests at KV length ``context``, each verifying 1 + k rows under speculation."""
    k = deployment.serving.spec_tokens
    return EngineStep(np.full(batch, 1 + k), np.full(batch, context + k), decode_mask=np.ones(batch, bool))


def decode_step_breakdown(deployment, *, batch: int | None = None, context: int | None = None,
                          calibration="default", op_overrides=()) -> pd.DataFrame:
    """Per (vLLM op, path) of one decode step of ``deployment``: kernel, calls, bytes, FLOPs, µs and share (see
    the module docstring). ``calibration``, ``op_overrides``: as for :func:`m3lab.serving.estimate.estimate`
    (calibration None: the ceiling)."""
    d = deployment.validate()
    b0, c0 = default_point(d)
    batch, context = int(batch or b0), int(context or c0)
    if batch < 1 or context < 1:
        raise M3LabError(f"batch={batch} and context={context} must be positive", field="batch")
    disp = dispatch_for(d)
    if disp is not None:
        disp.check_serves()
    cal = resolve_calibration(d.hardware, calibration)
    step = decode_step(d, batch, context)
    ov = tuple(op_overrides) if cal is not None else ()
    costed = cost_optable(build_optable(d.model, d.plan, d.quant, step, None, disp), d.hardware, cal, ov)
    out = _group(costed, d)
    k = d.serving.spec_tokens
    if k:
        plain = cost_optable(build_optable(d.model, d.plan, d.quant, EngineStep.decode(batch, context), None, disp),
                             d.hardware, cal, ov)
        draft = {"op": "draft_model", "layer_kinds": "", "decision": "", "path": d.serving.spec_method,
                 "kernel": "the draft model's decode steps", "optable_ops": "", "calls": k, "bytes": np.nan,
                 "comm_bytes": np.nan, "flops": np.nan,
                 "us": k * d.acceptance.draft_cost * float(plain["t_us"].sum()), "source": "draft_cost (assumed)"}
        out = pd.concat([out, pd.DataFrame([draft])], ignore_index=True)
    out["share"] = out["us"] / out["us"].sum()
    return out.sort_values("us", ascending=False, kind="stable").reset_index(drop=True)[list(COLUMNS)]


def _layer_kind(costed: pd.DataFrame, d) -> np.ndarray:
    src = topk_sources(d.model, dispatch_for(d))
    kinds = {layer: layer_kind(a, ATTN_SPARSE, src.get(layer) == layer) for layer, a in enumerate(d.model.attn_types)}
    return np.array([kinds.get(int(x), "model") for x in costed["layer"]], dtype=object)


def _group(costed: pd.DataFrame, d) -> pd.DataFrame:
    df = costed.assign(group=[OP_DECISION.get(o, o) if isinstance(p, str) else o
                              for o, p in zip(costed["op"], costed["path"])],
                       path=costed["path"].fillna(""), kernel=costed["kernel"].fillna(""),
                       decision=costed["decision"].fillna(""), layer_kind=_layer_kind(costed, d),
                       mem=costed[list(BYTE_COLUMNS)].fillna(0).sum(axis=1), comm=costed["bytes_comm"].fillna(0))
    rows = []
    for (group, path), g in df.groupby(["group", "path"], sort=False):
        layers = g["layer"].unique()
        rows.append({"op": group, "layer_kinds": ", ".join(dict.fromkeys(g["layer_kind"])),
                     "decision": g["decision"].iloc[0], "path": path, "kernel": g["kernel"].iloc[0],
                     "optable_ops": ", ".join(dict.fromkeys(g["op"])),
                     "calls": int(len(layers)) if (layers >= 0).any() else 1, "bytes": float(g["mem"].sum()),
                     "comm_bytes": float(g["comm"].sum()), "flops": float(g["flops"].fillna(0).sum()),
                     "us": float(g["t_us"].sum()), "source": ", ".join(dict.fromkeys(g["source"]))})
    return pd.DataFrame(rows)


MAIN_KERNEL_WORDS = ("gemm", "linear", "fused_moe", "attn", "attention", "gluon", "score", "all-reduce", "tgemm")


def main_kernel(kernels: str) -> str:
    """The kernel that does an op's main work, from the resolver's comma-separated list (for a narrow table)."""
    names = [k.strip() for k in str(kernels or "").split(", ") if k.strip()]
    for name in names:
        if any(w in name.lower() for w in MAIN_KERNEL_WORDS):
            return name
    return names[0] if names else ""


def format_breakdown(table: pd.DataFrame, title: str = "", top: int | None = None) -> str:
    """The breakdown as plain text at most 80 columns wide: op, kernel, calls, MB, GFLOP, µs, share."""
    head = f"{'op':<16} {'kernel':<24} {'calls':>5} {'MB':>8} {'GFLOP':>7} {'us':>8} {'share':>6}"
    lines = [title[:LINE_WIDTH]] if title else []
    lines += [head, "-" * len(head)]
    for r in (table.head(top) if top else table).itertuples():
        kernel = main_kernel(r.kernel) or r.path or "-"
        kernel = kernel if len(kernel) <= 24 else kernel[:23] + "~"
        mb = "" if not np.isfinite(r.bytes) else f"{r.bytes / 1e6:8.1f}"
        gf = "" if not np.isfinite(r.flops) else f"{r.flops / 1e9:7.2f}"
        lines.append(f"{str(r.op)[:16]:<16} {kernel:<24} {int(r.calls):>5} {mb:>8} {gf:>7} {r.us:8.1f} "
                     f"{r.share:6.1%}")
    lines.append(f"{'total':<16} {'':<24} {'':>5} {table['bytes'].sum() / 1e6:8.1f} "
                 f"{table['flops'].sum() / 1e9:7.2f} {table['us'].sum():8.1f} {1:6.1%}")
    return "\n".join(lines)
