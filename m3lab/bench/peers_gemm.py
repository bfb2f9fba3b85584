"""The GEMM part of the peers run (m3lab.bench.peers): ours vs cuBLAS, ``torch._scaled_mm`` and triton_kernels'
``matmul_ogs``, one point at a time (GPU only).

Providers per weight format at (M, N, K):

- bf16: ``triton`` (launcher + table), ``cublas`` (``F.linear``);
- fp8: ``triton`` (bf16 x, e4m3 W with per-channel scales; config ``per-channel``; at prefill M also
  ``block-128`` scales), ``scaled-mm`` (``torch._scaled_mm``: e4m3 x with per-token scales (quantised outside
  the timed call), e4m3 W with per-channel scales, bf16 out; M padded to 16 rows below 16, as cuBLASLt needs);
- mxfp8 / mxfp4: ``triton`` (OCP weights as stored), ``triton-mx-layout`` (the decode layout, M <= 64);
  mxfp4 at M in OGS_MS also ``ogs`` in every variant (:mod:`m3lab.bench.ogs_peer`), each checked once against
  ``linear_ref`` (a variant off by more than OGS_CHECK is logged and not timed).
"""
from __future__ import annotations

import torch

from ..arith import ceil_div
from ..kernels.gemm import launcher
from ..kernels.gemm.reference import FP8_BLOCK, linear_ref
from . import ogs_peer
from .ceilings import Ceilings
from .gemm import gemm_flops_bytes, make_operands, provider_calls
from .peers import OGS_MS, Timed, make_row, timed

OGS_CHECK = 0.05                 # rel-RMS vs linear_ref above which a peer variant is called wrong
SCALED_MM_MIN_M = 16


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-30))


def scaled_mm_calls(m: int, n: int, k: int, device) -> list:
    """torch._scaled_mm on fp8 operands (see the module docstring), one call per weight copy."""
    ops = make_operands(m, n, k, "fp8", device)
    rows = max(m, SCALED_MM_MIN_M)
    x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
    xs = (x.float().abs().amax(dim=1, keepdim=True) / 448.0).clamp(min=1e-12)
    xq = (x.float() / xs).to(torch.float8_e4m3fn)
    return [lambda w=w, s=s: torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=s.float()[None, :],
                                              out_dtype=torch.bfloat16) for w, s in ops.ws]


def block_fp8_calls(m: int, n: int, k: int, device) -> list:
    """Our launcher on e4m3 weights with one fp32 scale per 128 x 128 block (the table's kernel)."""
    ops = make_operands(m, n, k, "fp8", device)
    scale = torch.rand(ceil_div(n, FP8_BLOCK), ceil_div(k, FP8_BLOCK), device=device) * 0.02 + 0.005
    return [lambda w=w, y=y: launcher.linear(ops.x, w, w_format="fp8", w_scale=scale, out=y)
            for (w, _), y in zip(ops.ws, ops.ys)]


def ogs_cases(m: int, n: int, k: int, device, log) -> list[tuple[str, object, list]]:
    """(variant label, variant, calls) of every matmul_ogs variant that computes the right answer."""
    ops = make_operands(m, n, k, "mxfp4", device)
    ref = linear_ref(ops.x.float(), ops.ws[0][0], w_format="mxfp4", w_scale=ops.ws[0][1])
    out = []
    for nw in ogs_peer.WARPS:
        try:
            ws = [ogs_peer.ogs_weights(w, s, nw) for w, s in ops.ws]
        except Exception as err:
            log(f"ogs weights warps={nw} M={m} N={n} K={k} failed: {type(err).__name__}: {str(err)[:200]}")
            continue
        for v in (v for v in ogs_peer.VARIANTS if v.num_warps == nw):
            try:
                with ogs_peer.variant_flags(v):
                    err = _rel(ogs_peer.ogs_linear(ops.x, *ws[0]), ref)
            except Exception as exc:
                log(f"ogs {v.label} M={m} N={n} K={k} failed: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            if not err <= OGS_CHECK:
                log(f"ogs {v.label} M={m} N={n} K={k}: rel-RMS {err:.3g} vs linear_ref, not timed")
                continue
            out.append((v.label, v, [lambda w=w: ogs_peer.ogs_linear(ops.x, *w) for w in ws]))
    return out


def _cases(m: int, n: int, k: int, fmt: str, device, log) -> list[tuple[str, str, list, object]]:
    """(provider, config, calls, variant-or-None) to time at one point."""
    out = []
    if fmt == "bf16":
        ops = make_operands(m, n, k, "bf16", device)
        out += [("triton", "table", provider_calls("triton", ops, fmt, m, n, k), None),
                ("cublas", "", provider_calls("cublas", ops, fmt, m, n, k), None)]
        return out
    ops = make_operands(m, n, k, fmt, device)
    out.append(("triton", "per-channel" if fmt == "fp8" else "table", provider_calls("triton", ops, fmt, m, n, k),
                None))
    if fmt == "fp8":
        if m > 128:
            out.append(("triton", "block-128", block_fp8_calls(m, n, k, device), None))
        out.append(("scaled-mm", f"per-token x{', M padded to 16' if m < SCALED_MM_MIN_M else ''}, per-channel W",
                    scaled_mm_calls(m, n, k, device), None))
        return out
    if m <= 64:
        out.append(("triton-mx-layout", "table", provider_calls("triton-mx-layout", ops, fmt, m, n, k), None))
    if fmt == "mxfp4" and m in OGS_MS:
        out += [("ogs", label, calls, v) for label, v, calls in ogs_cases(m, n, k, device, log)]
    return out


def gemm_point(m: int, n: int, k: int, fmt: str, rnd: int, keep, ceilings: Ceilings, device_name: str,
               log) -> tuple[list, list[Timed]]:
    """Rows of every provider (``keep``: the (provider, config) pairs to time; None = all) at one point."""
    device = torch.device("cuda")
    results = []
    for prov, cfg, calls, variant in _cases(m, n, k, fmt, device, log):
        if keep is not None and (prov, cfg) not in keep:
            continue
        try:
            if variant is not None:
                with ogs_peer.variant_flags(variant):
                    results.append(timed(prov, cfg, calls, rep_ms=10.0))
            else:
                results.append(timed(prov, cfg, calls, rep_ms=10.0))
        except Exception as err:
            log(f"gemm M={m} N={n} K={k} {fmt} {prov} {cfg} failed: {type(err).__name__}: {str(err)[:200]}")
    flops, nbytes = gemm_flops_bytes(m, n, k, fmt)
    rows = [make_row("gemm", f"M={m},N={n},K={k}", fmt, r, rnd, flops, nbytes, ceilings, device_name, (m, n, k))
            for r in results]
    log(f"gemm M={m} N={n} K={k} {fmt} round {rnd}: "
        + " ".join(f"{r.provider}[{r.config}]:{r.timing.us_p50:.1f}" for r in results))
    return rows, results
