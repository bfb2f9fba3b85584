"""GEMM benchmark: our launcher vs cuBLAS (``torch.nn.functional.linear``) side by side.

``m3lab bench gemm [--ms 1,8,...] [--formats bf16,mxfp8,mxfp4,fp8] [--out DIR]`` (:func:`run`, GPU only); the
recorded table is read by m3lab/bench_analysis/gemm.py, the configs are tuned by ``m3lab tune gemm``
(m3lab/tune/gemm.py). Providers: ``cublas`` (bf16 weights), ``triton`` (the launcher: tuned table, nearest M),
``triton-prefill-tiles`` (the same kernel forced to the shape's prefill tile: the decode-vs-prefill
tile comparison) and, for mxfp8, ``vllm-mxfp8`` (vLLM's own ``_mxfp8_dot_scaled_linear``: its activation
quantiser, its ``_select_cfg`` tile and ``_mxfp8_linear_kernel``; a reported peer, not a target — without MX units
its ``tl.dot_scaled`` is emulated) and, at decode M <= READ_ONLY_MAX_M, ``read-only`` (a reduction that only reads
as many bytes as the format's weights and scales, one copy per call: the streaming ceiling of the point) and
``triton-mx-layout`` (MX weights packed once into kernels/mx/decode_layout, ``layout_launcher.linear_layout``; decode M). Timing: :func:`m3lab.bench.timing.graph_time` (every row carries ``harness``). FLOPs and bytes: :func:`m3lab.spec.gemm_cost.gemm_cost` with bf16 activations (the
launcher takes x in bf16 and quantises nothing). Shapes: the OpTable's dense GEMMs (:func:`m3lab.optable.kernel_shapes.model_gemm_shapes`).
"""
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..kernels.gemm import launcher, layout_launcher
from ..kernels.gemm.tables import DECODE_MAX_M, select_config
from ..kernels.gemm.reference import quantize_weight
from ..kernels.mx.decode_layout import pack
from ..optable.kernel_shapes import model_gemm_shapes, rank_dims
from ..spec.dtypes import weight_bytes
from ..spec.gemm_cost import gemm_cost
from ..vllm_src.imports import vllm_module
from .ceilings import Ceilings, measure_ceilings
from .table import BenchRow, append_rows, commit_id, today
from .session_log import session_log
from .timing import HARNESS, Timing, copies_needed, graph_time, profile_check

DEFAULT_MS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
W_FORMATS = ("bf16", "mxfp8", "mxfp4", "fp8")
PROVIDERS = ("cublas", "triton", "triton-prefill-tiles", "vllm-mxfp8", "read-only", "triton-mx-layout")
READ_ONLY_MAX_M = 32          # the streaming ceiling is measured at the MX decode target points
VLLM_MXFP8 = "vllm.model_executor.kernels.linear.mxfp8.rocm_native"
ACT_DTYPE = "bf16"            # the launcher's activations
PREFILL_REF_M = 4096          # the prefill tile of a shape = its tuned config at this M


def gemm_flops_bytes(m: int, n: int, k: int, w_format: str) -> tuple[float, float]:
    """FLOPs and the fewest bytes moved (W with its scales once, x and y in bf16 once) of one launch."""
    c = gemm_cost(m, n, k, w_format, ACT_DTYPE)
    return c.flops, c.bytes


@dataclass
class Operands:
    """Copies of one problem's operands (rotated so a graph replay never reads W from L2)."""
    x: torch.Tensor
    ws: list[tuple[torch.Tensor, torch.Tensor | None]]
    ys: list[torch.Tensor]


def make_operands(m: int, n: int, k: int, w_format: str, device: torch.device) -> Operands:
    """bf16 activations and rotated weight copies on a GPU; one fp16 copy on the CPU (interpreter)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    w0 = torch.randn(n, k, device=device, dtype=dtype) / k**0.5
    w, s = quantize_weight(w0, w_format)
    copies = copies_needed(int(weight_bytes(n * k, w_format)), device) if device.type == "cuda" else 1
    ws = [(w.clone(), None if s is None else s.clone()) for _ in range(copies)]
    x = torch.randn(m, k, device=device, dtype=dtype)
    return Operands(x, ws, [torch.empty(m, n, device=device, dtype=dtype) for _ in range(copies)])


def provider_calls(provider: str, ops: Operands, w_format: str, m: int, n: int, k: int) -> list:
    """One closure per operand copy for a provider."""
    if provider == "cublas":
        return [lambda w=w: torch.nn.functional.linear(ops.x, w) for w, _ in ops.ws]
    if provider == "read-only":
        flat = [torch.empty(int(weight_bytes(n * k, w_format)) // 4, device=ops.x.device, dtype=torch.int32).random_()
                for _ in ops.ws]
        return [lambda b=b: b.amax() for b in flat]
    if provider == "triton-mx-layout":
        dws = [pack(w, s, w_format) for w, s in ops.ws]
        return [lambda dw=dw, y=y: layout_launcher.linear_layout(ops.x, dw, out=y) for dw, y in zip(dws, ops.ys)]
    if provider == "vllm-mxfp8":   # vLLM's own launcher, run as vLLM runs it (its quantiser, tile and kernel)
        linear = vllm_module(VLLM_MXFP8, "vLLM's MXFP8 linear")._mxfp8_dot_scaled_linear
        return [lambda w=w, s=s: linear(ops.x, w, s) for w, s in ops.ws]
    config = None
    if provider == "triton-prefill-tiles":
        config = select_config(PREFILL_REF_M, n, k, w_format, ops.x.device)
    return [lambda w=w, s=s, y=y: launcher.linear(ops.x, w, w_format=w_format, w_scale=s, out=y, config=config)
            for (w, s), y in zip(ops.ws, ops.ys)]


def bench_row(provider: str, m: int, n: int, k: int, w_format: str, timing, ceilings: Ceilings,
              device: str, op: str = "gemm") -> BenchRow:
    flops, nbytes = gemm_flops_bytes(m, n, k, w_format)
    ceiling, value, floor_us = ceilings.limit(flops, nbytes)
    t = timing.us_p50
    return BenchRow(op, provider, f"M={m},N={n},K={k}", w_format, timing.us_p20, t, timing.us_p80,
                    flops / t / 1e6, nbytes / t / 1e6, floor_us / t, ceiling, device, commit_id(), today(),
                    m=m, n=n, k=k, ceiling_value=value, harness=HARNESS)


def bench_point(m: int, n: int, k: int, w_format: str, providers: tuple[str, ...], ceilings: Ceilings,
                rep_ms: float = 60.0) -> list[BenchRow]:
    """Time every provider at one (M, N, K, w_format) on the current CUDA device."""
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device).replace(" ", "_")
    rows = []
    for provider in providers:
        if provider == "cublas" and w_format != "bf16":
            continue
        if provider == "triton-prefill-tiles" and (m > DECODE_MAX_M or w_format != "bf16"):  # the tile ratio: bf16 decode
            continue
        if provider == "vllm-mxfp8" and w_format != "mxfp8":
            continue
        if provider == "read-only" and m > READ_ONLY_MAX_M:
            continue
        if provider == "triton-mx-layout" and (w_format not in ("mxfp8", "mxfp4") or m > DECODE_MAX_M):
            continue
        ops = make_operands(m, n, k, "bf16" if provider == "cublas" else w_format, device)
        timing = graph_time(provider_calls(provider, ops, w_format, m, n, k), rep_ms=rep_ms, warmup_ms=10)
        rows.append(bench_row(provider, m, n, k, w_format, timing, ceilings, name))
        del ops
    return rows


def bench_gemm(shapes=None, ms=DEFAULT_MS, w_formats=W_FORMATS,
               providers=PROVIDERS, ceilings: Ceilings | None = None,
               rep_ms: float = 60.0, log=print, deadline: float | None = None) -> list[BenchRow]:
    """The whole grid, format by format; cuBLAS rows only for bf16 (the baseline every format is compared with).

    ``shapes``: (N, K) pairs, default :func:`model_gemm_shapes`. ``deadline`` (a time.time() value): points
    not started by then are skipped (and logged).
    """
    shapes = model_gemm_shapes() if shapes is None else shapes
    ceilings = ceilings or Ceilings()
    rows = []
    for w_format in w_formats:
        for n, k in shapes:
            for m in ms:
                if deadline is not None and time.time() > deadline:
                    log(f"bench: deadline reached, skipping from M={m} N={n} K={k} {w_format}")
                    return rows
                try:
                    new = bench_point(m, n, k, w_format, tuple(providers), ceilings, rep_ms)
                except Exception as err:  # keep the session going; the log says what failed
                    log(f"bench failed M={m} N={n} K={k} {w_format}: {type(err).__name__}: {str(err)[:300]}")
                    continue
                rows.extend(new)
                log(" ".join(f"{r.provider}:{r.us_p50:.1f}us" for r in new) + f"  M={m} N={n} K={k} {w_format}")
    return rows


def self_check_points(model: str = "minimax-m3", tp: int = 4) -> tuple[tuple[int, int, int, str], ...]:
    """(M, N, K, w_format) of the harness self-check: a sparse layer's fused qkv projection at M 1 and 128, o_proj
    at M 32, a dense layer's qkv projection at M 8 with MXFP4 weights (widths from the ParallelPlan)."""
    d = rank_dims(model, tp)
    return ((1, d.qkv_sparse, d.hidden, "bf16"), (32, d.hidden, d.attn_out, "bf16"),
            (128, d.qkv_sparse, d.hidden, "bf16"), (8, d.qkv_dense, d.hidden, "mxfp4"))


def self_check(points=None, providers=("cublas", "triton"), log=print) -> list[dict]:
    """The harness self-check (:func:`m3lab.bench.timing.profile_check`) at a few (M, N, K, w_format) points
    (default :func:`self_check_points`): one dict per point and provider (cuBLAS only for bf16), ``passed`` when
    the per-call time is within SELF_CHECK_US of the profiler's kernel time."""
    points = self_check_points() if points is None else points
    device = torch.device("cuda")
    out = []
    for m, n, k, w_format in points:
        for provider in providers:
            if provider == "cublas" and w_format != "bf16":
                continue
            ops = make_operands(m, n, k, "bf16" if provider == "cublas" else w_format, device)
            res = profile_check(provider_calls(provider, ops, w_format, m, n, k))
            out.append({"provider": provider, "m": m, "n": n, "k": k, "dtype": w_format, "harness": HARNESS,
                        "commit": commit_id(), **res})
            log(f"self-check {provider} M={m} N={n} K={k} {w_format}: harness {res['harness_us']:.2f} us, "
                f"kernels {res['kernel_us']:.2f} us ({res['kernels_per_call']:.1f}/call), "
                f"span {res['span_us']:.2f} us, checked against {res['checked_against']}: "
                f"{'pass' if res['passed'] else 'FAIL'}")
            del ops
    return out


def time_provider(provider: str, m: int, n: int, k: int, w_format: str, rep_ms: float = 60.0):
    """Graph-replayed Timing of one provider at one point (the perf gates' re-measurement)."""
    device = torch.device("cuda")
    ops = make_operands(m, n, k, "bf16" if provider == "cublas" else w_format, device)
    return graph_time(provider_calls(provider, ops, w_format, m, n, k), rep_ms=rep_ms)


def time_row(row) -> Timing:
    """Re-measure a row of a gemm benchmark table (as :func:`m3lab.bench.table.read_table` gives it)."""
    return time_provider(str(row["provider"]), int(row["m"]), int(row["n"]), int(row["k"]), str(row["dtype"]))


def run(out: str = "out", ms=DEFAULT_MS, formats=W_FORMATS, shapes=None, measure: bool = True,
        deadline_s: float | None = None) -> Path:
    """Benchmark the model's GEMM shapes (default: M3 TP4) against cuBLAS on the GPU, rows appended to
    ``OUT/gemm.csv`` (progress printed and in ``OUT/log.txt``) -> that path. ``measure``: measure the ceilings
    first (else the profile's, :class:`Ceilings`)."""
    Path(out).mkdir(parents=True, exist_ok=True)
    log = session_log(Path(out) / "log.txt")
    ceilings = measure_ceilings(torch.device("cuda")) if measure else Ceilings()
    rows = bench_gemm(shapes, tuple(ms), tuple(formats), ceilings=ceilings, log=log,
                      deadline=None if deadline_s is None else time.time() + deadline_s)
    path = append_rows(Path(out) / "gemm.csv", rows)
    log(f"bench: {len(rows)} rows -> {path}")
    return path
