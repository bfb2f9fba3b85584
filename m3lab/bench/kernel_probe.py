"""Launch-configuration sweep of the sparse-attention and indexer kernels against vLLM's in the same run, and
the two MX decodes of kernels/ timed on the MoE kernel's weight-tile path (GPU only).

``m3lab bench probe --out DIR [--rounds 4]`` writes ``DIR/probe.csv`` (one row per point,
op, variant and round: µs p20/p50/p80 of the graph24 harness, SM clock note) and prints the median over rounds
of each variant with its ratio to vLLM (vLLM µs / ours) and the spread of that ratio over the rounds.

- Sparse attention (``sparse_attn``) and indexer (``sparse_indexer``): M3 TP4 decode points of
  :mod:`m3lab.bench.sparse_attn`; variants set the launchers' module constants (attention: warps, stages,
  warps by blocks per program; indexer: programs per SM, warps, stages, selector warps) before their graph
  is captured; every variant's output is checked against the current one's.
- MX decode (``mx_decode``): one weight-tile GEMM (the MoE kernel's ``weight_tile`` dataflow: MXFP4 codes
  and E8M0 scales dequantised to fp32, scaled, cast to bf16, ``tl.dot``) with kernels/mx's bit-construction
  decode (``e2m1_value``/``e8m0_pow2``, ``bits``) or an arithmetic decode (``arith``, defined here),
  checked against a torch dequantisation.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import pandas as pd
import torch
import triton
import triton.language as tl

from ..kernels.indexer import launcher as il
from ..kernels.mx.triton_mx import e2m1_value, e8m0_pow2
from ..kernels.sparse_attn import launcher as al
from . import sparse_attn as sa
from .peers import timed
from .timing import copies_needed

ATTN = {"w4,s2,w8@2": (4, 2, {2: 8}), "w4,s2": (4, 2, {}), "w8,s2": (8, 2, {}), "w4,s3": (4, 3, {})}
INDEX = {"s2,few16": (4, 4, 2, (4, 256, 16)), "s3,few16": (4, 4, 3, (4, 256, 16)), "s2,few8": (4, 4, 2, (4, 256, 8)),
         "pps8,s2,few16": (8, 4, 2, (4, 256, 16))}
POINTS = tuple((b, ctx) for ctx in (8192, 65536) for b in (1, 32, 128))
MX_SHAPES = ((16, 1536, 6144), (64, 1536, 6144), (16, 6144, 768), (64, 6144, 768))   # (M, N, K): MoE w13, w2


def _set_attn(v):
    al.NUM_WARPS, al.NUM_STAGES, al.WARPS_BY_BLOCKS = v


def _set_index(v):
    il.SCORE_PROGRAMS_PER_SM, il.SCORE_NUM_WARPS, il.SCORE_NUM_STAGES, il.SELECT_FEW = v


def sparse_rows(b, ctx, rnd, log) -> list[dict]:
    mods = sa._vllm()
    p = sa.make_point(b, ctx, 1, torch.device("cuda"))
    saved = ((al.NUM_WARPS, al.NUM_STAGES, al.WARPS_BY_BLOCKS),
             (il.SCORE_PROGRAMS_PER_SM, il.SCORE_NUM_WARPS, il.SCORE_NUM_STAGES, il.SELECT_FEW))
    plan = [("sparse_attn", "vllm", None, None, lambda: sa.attention_calls(p, "vllm", mods)),
            ("sparse_indexer", "vllm", None, None, lambda: sa.indexer_calls(p, "vllm", mods))]
    plan += [("sparse_attn", k, _set_attn, v, lambda: sa.attention_calls(p, "ours")) for k, v in ATTN.items()]
    plan += [("sparse_indexer", k, _set_index, v, lambda: sa.indexer_calls(p, "ours")) for k, v in INDEX.items()]
    rows, ref = [], {}
    try:
        for op, name, setter, v, make in plan:
            if setter:
                setter(v)
            calls = make()
            if setter and rnd == 1:
                got = calls[0]()
                got = got.topk if op == "sparse_indexer" else got
                ref.setdefault(op, got.clone())
                ok = torch.equal(got, ref[op]) if op == "sparse_indexer" else \
                    bool(torch.allclose(got.float(), ref[op].float(), atol=2e-2, rtol=2e-2))
                if not ok:
                    log(f"MISMATCH {op} {name} B={b} ctx={ctx}")
            t = timed("ours" if setter else "vllm", name, calls)
            rows.append({"op": op, "point": f"B={b},ctx={ctx}", "variant": name, "round": rnd,
                         "us_p20": t.timing.us_p20, "us_p50": t.timing.us_p50, "us_p80": t.timing.us_p80,
                         "clock": t.clock})
    finally:
        _set_attn(saved[0])
        _set_index(saved[1])
    del p
    torch.cuda.empty_cache()
    return rows


@triton.jit
def _e2m1_arith(b_c):
    """An arithmetic E2M1 decode: the alternative this probe times against kernels/mx's bit construction."""
    b_c = b_c.to(tl.int32)
    e = (b_c >> 1) & 3
    m = (b_c & 1).to(tl.float32)
    mag = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * ((1 << e) >> 1).to(tl.float32))
    return tl.where((b_c & 8) != 0, -mag, mag)


@triton.jit
def _e8m0_arith(b_s):
    b_s = b_s.to(tl.int32)
    v = (b_s << 23).to(tl.float32, bitcast=True)
    v = tl.where(b_s == 0, 5.877471754111438e-39, v)
    return tl.where(b_s == 255, float("nan"), v)


@triton.jit
def mx_tile_dot_kernel(p_w, p_s, p_x, p_y, M, N, K, BITS: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[M, N] = x[M, K] @ W^T, W MXFP4 (codes [N, K/2] low nibble first, E8M0 [N, K/32]); BITS picks the
    decode. One program per BLOCK_N columns; M <= BLOCK_M."""
    o_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    o_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        o_p = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        b_q = tl.load(p_w + o_n[:, None] * (K // 2) + o_p[None, :]).to(tl.int32)
        o_g = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        b_s = tl.load(p_s + o_n[:, None] * (K // 32) + o_g[None, :])
        if BITS:
            b_v = tl.join(e2m1_value(b_q & 15, tl.float32), e2m1_value(b_q >> 4, tl.float32))
            sc = e8m0_pow2(b_s, tl.float32)
        else:
            b_v = tl.join(_e2m1_arith(b_q & 15), _e2m1_arith(b_q >> 4))
            sc = _e8m0_arith(b_s)
        b_v = tl.reshape(tl.reshape(b_v, (BLOCK_N, BLOCK_K // 32, 32)) * sc[:, :, None], (BLOCK_N, BLOCK_K))
        o_k = k0 + tl.arange(0, BLOCK_K)
        b_x = tl.load(p_x + o_m[:, None] * K + o_k[None, :], mask=o_m[:, None] < M, other=0.0)
        acc = tl.dot(b_v.to(b_x.dtype), tl.trans(b_x), acc)
    tl.store(p_y + o_m[None, :] * N + o_n[:, None], acc.to(p_y.dtype.element_ty), mask=o_m[None, :] < M)


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def mx_rows(rnd, log) -> list[dict]:
    dev = torch.device("cuda")
    lut = torch.tensor(E2M1, device=dev)
    rows = []
    for m, n, k in MX_SHAPES:
        copies = copies_needed(n * k // 2 + n * k // 32, dev)
        ws = [torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev) for _ in range(copies)]
        ss = [torch.randint(118, 136, (n, k // 32), dtype=torch.uint8, device=dev) for _ in range(copies)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        ys = [torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        w0 = torch.stack([lut[(ws[0] & 15).long()], lut[(ws[0] >> 4).long()]], -1).view(n, k)
        w0 = w0 * torch.exp2(ss[0].float() - 127).repeat_interleave(32, 1)
        ref = x.float() @ w0.T
        for bits in (False, True):
            def call(c, bits=bits):
                return lambda: mx_tile_dot_kernel[(n // 64,)](ws[c], ss[c], x, ys[c], m, n, k, BITS=bits,
                                                               BLOCK_M=max(16, m), BLOCK_N=64, BLOCK_K=128,
                                                               num_warps=4, num_stages=3)
            ys[0].fill_(float("nan"))
            call(0)()
            err = float((ys[0].float() - ref).norm() / ref.norm())
            name = "bits" if bits else "arith"
            if not err < 1e-2:
                log(f"MISMATCH mx_decode {name} M={m} N={n} K={k}: rel err {err}")
            t = timed("ours", name, [call(c) for c in range(copies)])
            rows.append({"op": "mx_decode", "point": f"M={m},N={n},K={k}", "variant": name, "round": rnd,
                         "us_p20": t.timing.us_p20, "us_p50": t.timing.us_p50, "us_p80": t.timing.us_p80,
                         "clock": t.clock, "rel_err": err})
    return rows


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Median µs over rounds per (op, point, variant); ratio = vLLM µs / ours per round -> median, min, max."""
    out = []
    for (op, point), g in df.groupby(["op", "point"], sort=False):
        peer = g[g.variant == "vllm"].set_index("round")["us_p50"]
        base = peer if len(peer) else g[g.variant == "arith"].set_index("round")["us_p50"]
        for v, gv in g.groupby("variant", sort=False):
            r = (base / gv.set_index("round")["us_p50"]).dropna()
            out.append({"op": op, "point": point, "variant": v, "us": round(gv.us_p50.median(), 2),
                        "ratio": round(statistics.median(r), 3) if len(r) else None,
                        "lo": round(r.min(), 3) if len(r) else None, "hi": round(r.max(), 3) if len(r) else None})
    return pd.DataFrame(out)


def main(out: str = "out", rounds: int = 4, until_s: float = 400.0, mx: bool = True) -> None:
    t0 = time.time()
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    log = lambda msg: print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)  # noqa: E731
    rows = []
    for rnd in range(1, rounds + 1):
        for b, ctx in POINTS:
            if time.time() - t0 > until_s:
                break
            rows += sparse_rows(b, ctx, rnd, log)
        if mx and time.time() - t0 < until_s:
            rows += mx_rows(rnd, log)
        pd.DataFrame(rows).to_csv(outdir / "probe.csv", index=False)
        log(f"round {rnd} done")
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(summary(pd.DataFrame(rows)).to_string(index=False))

