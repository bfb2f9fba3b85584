"""``fused_moe(...)``: the MoE fast path — alignment, gate_up + SwiGLU-OAI, down + routing weights + combine.

Takes what ``reference.fused_moe_ref`` takes (the model's MoE call), never syncs with the host, and is
CUDA-graph capturable. Launches: the alignment (one program at decode sizes; none when T·k·4 <= E, vLLM's
naive assignment: one block per slot), the two grouped GEMMs, and the combine — a zero-fill and a cast around
fp32 atomic adds (``COMBINE="atomic"``), or ``combine_kernel`` over per-slot outputs (``"store"``).
"""
import dataclasses

import torch
import triton
import triton.language as tl

from ..launches import launch
from .align import align
from .grouped import ORDERS, combine_kernel, down_kernel, gate_up_kernel
from .tables import MoeConfig, select_config

W_FORMATS = ("bf16", "mxfp8", "mxfp4")
ACT_FORMATS = ("bf16", "mxfp8")        # "bf16": the activation in x's dtype
_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
_X_FMT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
NAIVE_FACTOR = 4                       # naive assignment when T·k·NAIVE_FACTOR <= E (vLLM fused_moe.py:1569-1575)
COMBINE_BLOCK_H = 1024


def native_mx(device: torch.device) -> bool:
    """tl.dot_scaled on MX hardware: AMD gfx950, NVIDIA compute capability >= 10."""
    from ..gemm.launcher import native_mx as gemm_native_mx
    return gemm_native_mx(device)


def _check(x, w13, w2, weights, ids, fmt, act_format, w13_scale, w2_scale):
    if fmt not in W_FORMATS:
        raise ValueError(f"fmt: {fmt!r} is not one of {W_FORMATS}")
    if act_format not in ACT_FORMATS:
        raise ValueError(f"act_format: {act_format!r} is not one of {ACT_FORMATS}")
    if x.dim() != 2 or x.dtype not in _TL:
        raise ValueError(f"x: expected [T, H] bf16/fp16/fp32, got {x.dtype} {list(x.shape)}")
    t, h = x.shape
    pack = 2 if fmt == "mxfp4" else 1
    if w13.dim() != 3 or w13.shape[2] * pack != h or w13.shape[1] % 2:
        raise ValueError(f"w13: expected [E, 2I, H={h}{'/2' if pack == 2 else ''}], got {list(w13.shape)}")
    e, i = w13.shape[0], w13.shape[1] // 2
    if w2.dim() != 3 or w2.shape[0] != e or w2.shape[1] != h or w2.shape[2] * pack != i:
        raise ValueError(f"w2: expected [E={e}, H={h}, I={i}{'/2' if pack == 2 else ''}], got {list(w2.shape)}")
    if ids.dim() != 2 or ids.shape[0] != t or weights.shape != ids.shape:
        raise ValueError(f"ids/weights: expected [T={t}, k], got {list(ids.shape)} / {list(weights.shape)}")
    if fmt == "bf16" and (w13.dtype != x.dtype or w2.dtype != x.dtype):
        raise ValueError(f"w13/w2: unquantised weights must have x's dtype {x.dtype}")
    if fmt != "bf16":
        if h % 32 or i % 32:
            raise ValueError(f"x: H={h} and I={i} must be multiples of 32 for {fmt} weights")
        for name, s, rows, k in (("w13_scale", w13_scale, 2 * i, h), ("w2_scale", w2_scale, h, i)):
            if s is None or s.dtype != torch.uint8 or list(s.shape) != [e, rows, k // 32]:
                raise ValueError(f"{name}: expected uint8 [{e}, {rows}, {k // 32}], got "
                                 f"{None if s is None else (s.dtype, list(s.shape))}")
    if act_format == "mxfp8" and i % 32:
        raise ValueError(f"act_format: mxfp8 activations need I={i} to be a multiple of 32")
    return t, h, e, i, ids.shape[1]


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *,
              alpha: float, limit: float, beta: float, w13_scale: torch.Tensor | None = None,
              w2_scale: torch.Tensor | None = None, fmt: str = "bf16", act_format: str = "bf16",
              expert_map: torch.Tensor | None = None, output_scale: float = 1.0, config: MoeConfig | None = None,
              order: str | None = None, out: torch.Tensor | None = None, use_native_mx: bool | None = None,
              align_impl: str | None = None) -> torch.Tensor:
    """Routed MoE: x [T, H], w13 [E, 2I, H] = [gate rows; up rows], w2 [E, H, I], weights fp32 / ids int [T, k]
    -> [T, H] in x.dtype: Σ_j weights[t, j] · output_scale · down_e(SwiGLU-OAI(gate_up_e(x_t))), e = ids[t, j].

    ids < 0 (or mapped to -1 by ``expert_map`` [E_global], for global ids) are skipped: experts of another
    rank. A fused shared expert is one more row of w13/w2 and one more column of ids (routing.py).
    fmt: weight format (mxfp8/mxfp4 with E8M0 scales [E, N, K/32]); act_format "mxfp8": the activation is
    quantised per 32 in the gate_up epilogue and read as MXFP8 by the down GEMM. config/order: force tiles or
    the program order; use_native_mx: force tl.dot_scaled on/off; out: write here (e.g. poisoned by the gates).
    """
    t, h, e, i, k = _check(x, w13, w2, weights, ids, fmt, act_format, w13_scale, w2_scale)
    cfg = _config(config, order, act_format, t, e, i, k, fmt, x.device)
    native = (native_mx(x.device) if use_native_mx is None else use_native_mx) and fmt != "bf16"
    x = x.contiguous()
    dev, bm, slots = x.device, cfg.BLOCK_SIZE_M, t * k
    ids_flat = ids.reshape(-1).contiguous()
    emap = ids_flat if expert_map is None else expert_map.contiguous()
    naive = slots * NAIVE_FACTOR <= e
    if naive:      # one block per slot: the kernels read each block's expert from ids (+ the map)
        al, num_m = (ids_flat, ids_flat, ids_flat), slots
    else:
        al = align(ids, bm, e, expert_map, align_impl)
        num_m = al.expert_ids.numel()
    w13_s, s13 = (w13, (0, 0, 0)) if w13_scale is None else (w13_scale, w13_scale.stride())
    w2_s, s2 = (w2, (0, 0, 0)) if w2_scale is None else (w2_scale, w2_scale.stride())
    if act_format == "mxfp8":
        act = torch.empty(slots, i, device=dev, dtype=torch.float8_e4m3fn)
        act_s = torch.empty(slots, i // 32, device=dev, dtype=torch.uint8)
    else:
        act = torch.empty(slots, i, device=dev, dtype=x.dtype)
        act_s = act
    x_fmt = _X_FMT[x.dtype]
    rows = dict(NAIVE=naive, HAS_MAP=expert_map is not None)
    launch(gate_up_kernel, (num_m * triton.cdiv(i, cfg.BLOCK_SIZE_N),),
        x, w13, w13_s, act, act_s, *al, ids_flat, emap,
        slots, num_m, i, h, k, e,
        x.stride(0), x.stride(1), *w13.stride(), *s13, act.stride(0), act.stride(1), act_s.stride(0), act_s.stride(1),
        float(alpha), float(limit), float(beta),
        W_FORMAT=fmt, NATIVE_MX=native, X_FMT=x_fmt, OUT_MX=act_format == "mxfp8", ORDER=cfg.ORDER,
        BLOCK_M=bm, BLOCK_N=cfg.BLOCK_SIZE_N, BLOCK_K=cfg.BLOCK_SIZE_K, GROUP_M=cfg.GROUP_SIZE_M, **rows,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    store = cfg.COMBINE == "store"
    acc = torch.empty(slots, h, device=dev, dtype=x.dtype) if store else torch.zeros(t, h, device=dev,
                                                                                       dtype=torch.float32)
    w_flat = weights.to(torch.float32).contiguous().reshape(-1)
    launch(down_kernel, (num_m * triton.cdiv(h, cfg.DOWN_BLOCK_SIZE_N),),
        act, act_s, w2, w2_s, acc, w_flat, *al, ids_flat, emap,
        slots, num_m, h, i, k, e, float(output_scale),
        act.stride(0), act.stride(1), act_s.stride(0), act_s.stride(1), *w2.stride(), *s2, acc.stride(0), acc.stride(1),
        W_FORMAT=fmt, NATIVE_MX=native, X_FMT=x_fmt, X_MX=act_format == "mxfp8", CT=_TL[x.dtype], ORDER=cfg.ORDER,
        BLOCK_M=bm, BLOCK_N=cfg.DOWN_BLOCK_SIZE_N, BLOCK_K=cfg.DOWN_BLOCK_SIZE_K, GROUP_M=cfg.GROUP_SIZE_M, **rows,
        COMBINE_STORE=store, num_warps=cfg.DOWN_num_warps, num_stages=cfg.DOWN_num_stages)
    if not store:
        return acc.to(x.dtype) if out is None else out.copy_(acc)
    return _combine(acc, ids_flat, emap, out, t, h, k, e, expert_map is not None)


def _config(config, order, act_format, t, e, i, k, fmt, device) -> MoeConfig:
    """The forced or tuned config, with the program order forced and BLOCK_SIZE_N >= 32 for MXFP8 activations."""
    cfg = (config or select_config(t, e, i, k, fmt, device)).check_launchable()
    if order is not None:
        if order not in ORDERS:
            raise ValueError(f"order: {order!r} is not one of {ORDERS}")
        cfg = dataclasses.replace(cfg, ORDER=order)
    if act_format == "mxfp8" and cfg.BLOCK_SIZE_N < 32:
        cfg = dataclasses.replace(cfg, BLOCK_SIZE_N=32)
    return cfg


def _combine(y, ids_flat, emap, out, t, h, k, e, has_map: bool) -> torch.Tensor:
    """Sum each token's per-slot outputs y [T·k, H] into out [T, H] (combine_kernel)."""
    out = torch.empty(t, h, device=y.device, dtype=y.dtype) if out is None else out
    launch(combine_kernel, (t, triton.cdiv(h, COMBINE_BLOCK_H)), y, ids_flat, emap, out, t * k, h, k, e,
           y.stride(0), y.stride(1), out.stride(0), out.stride(1), HAS_MAP=has_map,
           TOPK_P2=triton.next_power_of_2(k), BLOCK_H=COMBINE_BLOCK_H, num_warps=4)
    return out
