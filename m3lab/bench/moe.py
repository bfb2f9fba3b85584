"""Grouped-MoE benchmark on the GPU: our kernel vs vLLM's own MoE kernels, torch._grouped_mm and a per-expert loop.

``m3lab bench moe --out DIR`` (:func:`run`) appends long-format rows (m3lab.bench.table) to ``DIR/moe.csv``; the
launch table is tuned by ``m3lab tune moe`` (m3lab/tune/moe.py); the recorded table is read by
m3lab/bench_analysis/moe.py.

Problem: MiniMax M3 on one TP4 rank (:func:`m3lab.optable.kernel_shapes.moe_problem`: hidden ``H``, ``I``
intermediate columns per rank, ``ROUTED`` routed experts + the shared one fused as the last expert (top-``TOPK``
+ 1, vLLM's "scaled weights" convention), T tokens. Routing per call:
``balanced`` (each expert the same load, a fresh permutation per call) or ``zipf`` (expert popularity
∝ 1/rank, a fresh ranking per call). Each timed graph holds ``CALLS`` calls, each on its own x and
routing and on one of ``WEIGHT_COPIES`` weight copies (3 × 3.65 GB bf16), so no call finds its weights in
the L2 left by the previous one (the shared expert included).

Providers (same operands, same graph replay):
- ``m3lab`` (tuned table or heuristic), ``m3lab-order=token`` / ``m3lab-order=expert`` (program orders),
  ``m3lab-separate-shared`` (routed top-4 on 128 experts, then the shared expert as its own launch, added);
  weights bf16, mxfp8, mxfp4 (activations bf16);
- ``vllm-triton``: vLLM's ``fused_moe_kernel`` bf16 path (m3lab/gates/moe.vllm_fused_moe: vLLM's config lookup,
  its SwiGLU-OAI kernel; our alignment, since vLLM's is a compiled op);
- ``vllm-mxfp8``: vLLM's ``fused_moe_mxfp8_native`` (``_mxfp8_grouped_gemm_kernel`` + its fused SwiGLU-MXFP8
  quant), with our alignment and our MXFP8 input quantiser in place of its two compiled ops. On Hopper
  Triton emulates ``dot_scaled`` (no MX units): reported, not a target;
- ``torch-grouped-mm``: ``torch._grouped_mm`` over expert-sorted rows (sort, two grouped GEMMs, SwiGLU in
  torch, weighted index_add);
- ``torch-loop``: one matmul pair per touched expert (routing known on the host, T ≤ LOOP_MAX_T).

Figures: µs per call (p20/p50/p80), TB/s over the expert-weight bytes the call touches (distinct experts ×
bytes per expert incl. scales), TFLOP/s (2·T·k·3·H·I), fraction of the measured ceiling that bounds it.
"""
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ..gates import inputs
from ..gates.moe import vllm_fused_moe
from ..kernels.moe.align import align
from ..kernels.moe.launcher import fused_moe
from ..kernels.moe.reference import swiglu_oai
from ..kernels.moe.tables import vllm_device_name
from ..kernels.mx import triton_mx
from ..optable.kernel_shapes import moe_problem
from ..spec.dtypes import weight_bytes
from ..spec.model import load_model
from ..vllm_src.imports import m3_module, vllm_module
from .ceilings import Ceilings, measure_ceilings
from .table import BenchRow, append_rows, commit_id, today
from .timing import graph_time

M3 = moe_problem("minimax-m3", tp=4)       # one TP4 rank of MiniMax M3
H, I, ROUTED, TOPK = M3.hidden, M3.inter, M3.routed, M3.topk
EXPERTS = ROUTED + M3.shared              # the shared expert fused as the last expert
TS = (1, 8, 32, 128, 512, 2048, 8192)
ROUTINGS = ("balanced", "zipf")
CALLS = 24
WEIGHT_COPIES = 3
LOOP_MAX_T = 32
FORMATS = ("bf16", "mxfp8", "mxfp4")


@lru_cache(maxsize=1)
def act() -> dict:
    """SwiGLU-OAI constants of MiniMax M3 (alpha, limit, beta), from its ModelSpec (the one place they live)."""
    return load_model("minimax-m3").swiglu


def expert_bytes(fmt: str) -> float:
    """Bytes of one expert's w13 + w2 (incl. E8M0 scales)."""
    return weight_bytes(3 * H * I, fmt)


def moe_flops(t: int, k: int = TOPK + 1) -> float:
    return 2.0 * t * k * 3 * H * I


# --- operands -------------------------------------------------------------------------------------------
def route_call(t: int, routing: str, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One call's routing with the shared slot: (weights fp32 [t, 5] in the scaled-weights convention, ids int32)."""
    if routing == "balanced":
        perm = torch.randperm(ROUTED, device=device)
        slot = torch.arange(t * TOPK, device=device).reshape(t, TOPK)
        ids = perm[(slot + (slot // ROUTED)) % ROUTED]          # t·4 consecutive picks: distinct per token
    else:
        rank = torch.randperm(ROUTED, device=device)
        p = 1.0 / (1.0 + torch.arange(ROUTED, device=device, dtype=torch.float32))
        ids = rank[torch.multinomial(p.expand(t, ROUTED), TOPK, replacement=False)]
    w = torch.rand(t, TOPK, device=device) + 0.1
    w = 2.0 * w / w.sum(1, keepdim=True)
    ids = torch.cat([ids, torch.full((t, 1), ROUTED, device=device)], 1).to(torch.int32)
    return torch.cat([w, torch.ones(t, 1, device=device)], 1).contiguous(), ids.contiguous()


@dataclass
class Operands:
    weights: dict                 # fmt -> list of WEIGHT_COPIES dicts (w13, w2, scales)
    xs: list                      # CALLS x [t, H] bf16
    routes: list                  # CALLS (weights, ids)
    touched: list                 # CALLS distinct experts touched

    def w(self, fmt: str, call: int) -> dict:
        return self.weights[fmt][call % len(self.weights[fmt])]


_WEIGHTS: dict = {}


def weights(fmt: str, device) -> list:
    """WEIGHT_COPIES copies of the 129-expert weights in fmt (cached across points)."""
    if fmt not in _WEIGHTS:
        base = inputs.make_weights(EXPERTS, H, I, fmt, torch.bfloat16, device)
        _WEIGHTS[fmt] = [base] + [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in base.items()}
                                  for _ in range(WEIGHT_COPIES - 1)]
    return _WEIGHTS[fmt]


def operands(t: int, routing: str, fmts, device) -> Operands:
    routes = [route_call(t, routing, device) for _ in range(CALLS)]
    return Operands({f: weights(f, device) for f in fmts},
                    [torch.randn(t, H, device=device, dtype=torch.bfloat16) for _ in range(CALLS)],
                    routes, [int(torch.unique(ids).numel()) for _, ids in routes])


# --- providers ------------------------------------------------------------------------------------------
def ours(fmt: str, **kw):
    def call(x, w, weights_, ids):
        return fused_moe(x, w["w13"], w["w2"], weights_, ids, **act(), w13_scale=w.get("w13_scale"),
                         w2_scale=w.get("w2_scale"), fmt=fmt, **kw)
    return call


def _separate_shared(x, w, weights_, ids):
    routed = fused_moe(x, w["w13"][:ROUTED], w["w2"][:ROUTED], weights_[:, :TOPK], ids[:, :TOPK], **act())
    shared = fused_moe(x, w["w13"][ROUTED:], w["w2"][ROUTED:], weights_[:, TOPK:], torch.zeros_like(ids[:, TOPK:]),
                       **act())
    return routed + shared


def _vllm_triton(x, w, weights_, ids):
    return vllm_fused_moe(x, w["w13"], w["w2"], weights_, ids, **act())


_VLLM_MX = {}


def _vllm_mxfp8(x, w, weights_, ids):
    """vLLM's fused_moe_mxfp8_native with its two compiled ops replaced (module attributes, patched once)."""
    if not _VLLM_MX:
        m3_module("amd.ops.swiglu_oai")
        mod = vllm_module("vllm.model_executor.layers.fused_moe.experts.mxfp8_native_moe")
        mod.moe_align_block_size = lambda ids_, block_m, e, emap=None, ignore_invalid_experts=False: \
            align(ids_, block_m, e, emap)
        mod.mxfp8_e4m3_quantize = lambda a: triton_mx.quantize(a, "mxfp8")
        _VLLM_MX["mod"] = mod
    return _VLLM_MX["mod"].fused_moe_mxfp8_native(
        x, w["w13"], w["w13_scale"], w["w2"], w["w2_scale"], weights_, ids, alpha=act()["alpha"], beta=act()["beta"],
        limit=act()["limit"], global_num_experts=ROUTED, expert_map=None)


def _grouped_mm(x, w, weights_, ids):
    t, k = ids.shape
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(EXPERTS, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    rows = order // k
    h = torch._grouped_mm(x[rows], w["w13"].transpose(-2, -1), offs=offs)
    a = swiglu_oai(h, **act())
    y = torch._grouped_mm(a, w["w2"].transpose(-2, -1), offs=offs)
    out = torch.zeros(t, H, device=x.device, dtype=torch.float32)
    out.index_add_(0, rows, y.float() * weights_.reshape(-1)[order, None])
    return out.to(x.dtype)


def _loop_calls(ops: Operands):
    """Per-expert loop: the routing of each call is read on the host before capture."""
    calls = []
    for c, (x, (wts, ids)) in enumerate(zip(ops.xs, ops.routes)):
        w = ops.w("bf16", c)
        plan = []
        for e in torch.unique(ids).tolist():
            rows, slots = torch.nonzero(ids == e, as_tuple=True)
            plan.append((e, rows, wts[rows, slots][:, None]))

        def call(x=x, w=w, plan=plan):
            out = torch.zeros(x.shape[0], H, device=x.device, dtype=torch.float32)
            for e, rows, wt in plan:
                a = swiglu_oai(x[rows] @ w["w13"][e].T, **act())
                out.index_add_(0, rows, (a @ w["w2"][e].T).float() * wt)
            return out.to(x.dtype)
        calls.append(call)
    return calls


PROVIDERS = {   # name -> (weight format, call factory)
    "m3lab": ("bf16", lambda: ours("bf16")),
    "m3lab-order=token": ("bf16", lambda: ours("bf16", order="token")),
    "m3lab-order=expert": ("bf16", lambda: ours("bf16", order="expert")),
    "m3lab-separate-shared": ("bf16", lambda: _separate_shared),
    "m3lab-mxfp8": ("mxfp8", lambda: ours("mxfp8")),
    "m3lab-mxfp4": ("mxfp4", lambda: ours("mxfp4")),
    "vllm-triton": ("bf16", lambda: _vllm_triton),
    "vllm-mxfp8": ("mxfp8", lambda: _vllm_mxfp8),
    "torch-grouped-mm": ("bf16", lambda: _grouped_mm),
    "torch-loop": ("bf16", None),
}


def provider_calls(name: str, ops: Operands) -> list:
    fmt, factory = PROVIDERS[name]
    if name == "torch-loop":
        return _loop_calls(ops)
    fn = factory()
    return [lambda c=c: fn(ops.xs[c], ops.w(fmt, c), *ops.routes[c]) for c in range(CALLS)]


def row(name: str, t: int, routing: str, timing, ops: Operands, ceilings, device_name: str) -> BenchRow:
    fmt = PROVIDERS[name][0]
    nbytes = expert_bytes(fmt) * sum(ops.touched) / len(ops.touched)
    flops = moe_flops(t)
    ceiling, value, floor_us = ceilings.limit(flops, nbytes)
    us = timing.us_p50
    return BenchRow("moe", name, f"T={t},H={H},I={I},E={EXPERTS},k={TOPK + 1},routing={routing}", fmt,
                    timing.us_p20, us, timing.us_p80, flops / us / 1e6, nbytes / us / 1e6, floor_us / us, ceiling,
                    device_name, commit_id(), today(), ceiling_value=value)


def bench(providers, ts=TS, routings=ROUTINGS, ceilings=None, log=print, deadline: float | None = None,
          rep_ms: float = 40.0) -> list[BenchRow]:
    device = torch.device("cuda")
    name = vllm_device_name(device)
    ceilings = ceilings or Ceilings()
    rows = []
    for routing in routings:
        for t in ts:
            if deadline is not None and time.time() > deadline:
                log(f"bench: deadline reached before T={t} {routing}")
                return rows
            provs = [p for p in providers if not (p == "torch-loop" and t > LOOP_MAX_T)
                     and not (p == "m3lab-separate-shared" and t not in (1, 128))]
            ops = operands(t, routing, sorted({PROVIDERS[p][0] for p in provs}), device)
            line = []
            for p in provs:
                try:
                    timing = graph_time(provider_calls(p, ops), rep_ms=rep_ms, warmup_ms=10)
                except Exception as err:  # keep going; the log says what failed
                    log(f"bench {p} T={t} {routing} failed: {type(err).__name__}: {str(err)[:300]}")
                    continue
                rows.append(row(p, t, routing, timing, ops, ceilings, name))
                line.append(f"{p}:{timing.us_p50:.1f}")
            log(f"T={t} {routing}: " + " ".join(line))
            del ops
    return rows


def run(out: str = "out", providers=tuple(PROVIDERS), ts=TS, routings=ROUTINGS, deadline_s: float = 520.0,
        rep_ms: float = 40.0, log=print) -> Path:
    """Every provider side by side at ``ts`` x ``routings`` on the GPU (points not started within ``deadline_s``
    are skipped and logged), rows appended to ``OUT/moe.csv`` -> that path."""
    t0 = time.time()
    ceilings = measure_ceilings(torch.device("cuda"))
    log(f"ceilings: copy {ceilings.copy_tbps:.2f} TB/s, mm {ceilings.mm_tflops:.0f} TFLOP/s")
    rows = bench(list(providers), tuple(ts), tuple(routings), ceilings=ceilings, log=log,
                 deadline=t0 + deadline_s, rep_ms=rep_ms)
    path = append_rows(Path(out) / "moe.csv", rows)
    log(f"bench: {len(rows)} rows -> {path}")
    return path
