"""``linear_layout(x, dw)``: the launcher for MX weights packed once into the decode layout (kernels/mx/decode_layout).

At decode M (<= tables.DECODE_MAX_M) it picks one of the layout kernels from the tuned table
``w={format}_layout`` (:func:`layout_config`; the tuner writes it: ``m3lab tune gemm --formats mxfp8_layout``),
else :func:`layout_heuristic`; beyond, the weights are unpacked to OCP MX and served by :func:`launcher.linear`.
"""
import torch
import triton

from ..launches import launch
from ..mx.decode_layout import C_SHIFT, DecodeWeights
from .gemm_mx_layout import gemm_mx_fold_kernel, gemm_mx_layout_kernel
from .gemv_mx_layout import gemv_mx_layout_kernel
from .launcher import _locks, _sm_count, linear
from .tables import GemmConfig

LAYOUT_BLOCK_N, LAYOUT_BLOCK_K = 32, 256         # decode-layout gemv tiles (untuned)
LAYOUT_KERNELS = ("gemv", "mxdec", "mxdec_fp8", "mxdec_fold")   # the kernels linear_layout launches
# Decode-layout fallback without a tuned table (H200, graph24, traces/bench/gemm_mx_layout_sweep_NVIDIA_H200.csv at
# e2d9a2a): the folded-scale tensor-core kernel won 64 of 70 points at M 1-64 (mxfp8 and mxfp4, the seven M3 TP4
# shapes); the gemv kernel won M 1 on four shapes by 3-12% and the per-group fp8 MMA two mxfp8 M 64 points, both
# reached through tables. Tiles of the winners:
# 16-32 x 64-128 x 128, 4 warps, 3 stages.
LAYOUT_TILES = (4, 4, 3)                         # mxdec_fold fallback (groups per step, num_warps, num_stages)


def layout_config(m: int, n: int, k: int, w_format: str, device: torch.device) -> GemmConfig:
    """The decode-layout launch for M <= DECODE_MAX_M: the tuned table ``w={w_format}_layout`` (nearest M), else
    :func:`layout_heuristic`."""
    from .tables import load_table, nearest, table_path, device_name
    cfg = nearest(load_table(table_path(n, k, layout_table_format(w_format), device_name(device))), m)
    if cfg is not None:
        return cfg
    return layout_heuristic(m, n, k, w_format, _sm_count(device))


LAYOUT_SUFFIX = "_layout"


def layout_table_format(w_format: str) -> str:
    """The ``w=`` name of a decode-layout table: "mxfp8" -> "mxfp8_layout" (the tuner writes it, layout_config
    reads it)."""
    return w_format + LAYOUT_SUFFIX


def layout_gemv_config(m: int, n: int, k: int, sms: int = 132) -> GemmConfig:
    """The decode-layout gemv kernel's launch (gemv_mx_layout.py): LAYOUT_BLOCK_N x LAYOUT_BLOCK_K tiles, SPLIT_K so
    that programs >= FILL_PROGRAMS x SMs."""
    from .tables import FILL_PROGRAMS, GEMV_MAX_M
    block_k = min(LAYOUT_BLOCK_K, triton.next_power_of_2(k))
    tiles = triton.cdiv(n, LAYOUT_BLOCK_N) * triton.cdiv(m, GEMV_MAX_M)
    split = max(1, min(triton.cdiv(FILL_PROGRAMS * sms, tiles), triton.cdiv(k, block_k)))
    return GemmConfig("gemv", min(GEMV_MAX_M, triton.next_power_of_2(m)), LAYOUT_BLOCK_N, block_k, SPLIT_K=split)


def layout_heuristic(m: int, n: int, k: int, w_format: str, sms: int = 132) -> GemmConfig:
    """M <= LAYOUT_GEMV_MAX_M: the gemv kernel (gemv_mx_layout); above, the folded-scale tensor-core kernel
    (gemm_mx_layout.gemm_mx_fold_kernel) with LAYOUT_TILES, BLOCK_N 128 where N >= 4096 (else 64), SPLIT_K so
    that programs >= FILL_PROGRAMS x SMs."""
    from .tables import FILL_PROGRAMS, LAYOUT_GEMV_MAX_M
    if m <= LAYOUT_GEMV_MAX_M:
        return layout_gemv_config(m, n, k, sms)
    block_m = max(16, min(64, triton.next_power_of_2(m)))
    groups, warps, stages = LAYOUT_TILES
    block_n = 128 if n >= 4096 else 64
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split = max(1, min(triton.next_power_of_2(triton.cdiv(FILL_PROGRAMS * sms, tiles)), k // (32 * groups)))
    return GemmConfig("mxdec_fold", block_m, block_n, 32 * groups, SPLIT_K=split, num_warps=warps, num_stages=stages)


def layout_kernel(m: int, n: int, k: int, w_format: str, device: torch.device,
                  config: GemmConfig | None = None) -> str | None:
    """The layout kernel :func:`linear_layout` launches for this problem (the forced ``config``'s, else the table's
    or the heuristic's), or None where it hands the weights to :func:`linear` (M > DECODE_MAX_M, no config)."""
    from .tables import DECODE_MAX_M
    if m > DECODE_MAX_M and config is None:
        return None
    return (config or layout_config(m, n, k, w_format, device)).kernel


def layout_linear_ref(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, w_format: str,
                      kernel: str | None) -> torch.Tensor:
    """fp32 reference [M, N] of a decode-layout launch by ``kernel`` (:func:`layout_kernel`): linear_ref on x as
    given, except the fp8-MMA kernel ("mxdec_fp8"), which multiplies x quantised to MXFP8 per token and 32-group
    (vLLM's activation rule, decode_layout.quantize_x_mxfp8). w, w_scale: the OCP MX weights that were packed."""
    from ..mx.decode_layout import quantize_x_mxfp8
    from .reference import linear_ref
    xr = quantize_x_mxfp8(x) if kernel == "mxdec_fp8" else x.float()
    return linear_ref(xr, w, w_format=w_format, w_scale=w_scale)


def linear_layout(x: torch.Tensor, dw: DecodeWeights, *, config: GemmConfig | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (bf16; fp16/fp32 for CPU tests), MX weights in the decode layout -> y [M, N] in x.dtype.

    M <= tables.DECODE_MAX_M: :func:`layout_config` picks the kernel: "mxdec_fold" (gemm_mx_layout.py: scales
    folded into fp16 weights, one fp16 MMA per BLOCK_K; the default), "mxdec" (one fp16 MMA per 32-group),
    "mxdec_fp8" (mxfp8 only: fp8 MMA per 32-group, x quantised per token and 32-group as vLLM does) or "gemv"
    (gemv_mx_layout.py, CUDA cores). Beyond, the weights are unpacked to OCP MX and served by :func:`linear` (prefill
    keeps its own path).
    """
    from .tables import DECODE_MAX_M
    if x.dim() != 2 or x.shape[1] != dw.k:
        raise ValueError(f"x: expected [M, K={dw.k}], got shape {list(x.shape)}")
    m, k = x.shape
    n = dw.codes.shape[0]
    if m > DECODE_MAX_M and config is None:
        from ..mx.decode_layout import unpack
        q, s = unpack(dw)
        return linear(x, q, w_format=dw.w_format, w_scale=s, out=out)
    config = config or layout_config(m, n, k, dw.w_format, x.device)
    if config.kernel not in LAYOUT_KERNELS or (config.kernel == "mxdec_fp8" and dw.w_format != "mxfp8"):
        raise ValueError(f"config: kernel {config.kernel!r} does not read {dw.w_format} in the decode layout "
                         f"(kernels: {LAYOUT_KERNELS}; mxdec_fp8: mxfp8 only)")
    y = torch.empty(m, n, device=x.device, dtype=x.dtype) if out is None else out
    groups = k // 32
    per_step = config.BLOCK_K // 32
    g_split = triton.cdiv(triton.cdiv(groups, config.SPLIT_K), per_step) * per_step
    split = triton.cdiv(groups, g_split)
    grid = (triton.cdiv(n, config.BLOCK_N), triton.cdiv(m, config.BLOCK_M), split)
    n_tiles = grid[0] * grid[1]
    part = torch.empty(split * n_tiles * config.BLOCK_N * config.BLOCK_M if split > 1 else 1,
                       device=x.device, dtype=torch.float32)
    opts = config.compiler_options(bool(torch.version.hip))
    if config.kernel == "gemv":
        words = dw.codes.view(torch.int32)
        launch(gemv_mx_layout_kernel, grid, x, words, dw.scales, y, part, _locks(x.device, n_tiles), m, n, k,
               g_split, x.stride(0), x.stride(1), words.stride(0), dw.scales.stride(0), y.stride(0), y.stride(1),
               W_FORMAT=dw.w_format, BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K,
               SPLIT_K=split, **opts)
        return y
    codes = dw.codes.view(torch.int32 if dw.w_format == "mxfp4" else torch.float8_e4m3fn)
    even = n % config.BLOCK_N == 0 and groups % g_split == 0
    if config.kernel == "mxdec_fold":
        if dw.row_exp is None:
            raise ValueError("dw: row_exp is missing (pack the weights with kernels.mx.decode_layout.pack)")
        launch(gemm_mx_fold_kernel, grid, x, codes, dw.scales, dw.row_exp, y, part, _locks(x.device, n_tiles), m, n, k,
               g_split, x.stride(0), x.stride(1), codes.stride(0), dw.scales.stride(0), y.stride(0), y.stride(1),
               W_FORMAT=dw.w_format, C_SHIFT=C_SHIFT[dw.w_format], BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N,
               GROUPS=per_step, SPLIT_K=split, EVEN=even, **opts)
        return y
    launch(gemm_mx_layout_kernel, grid, x, codes, dw.scales, y, part, _locks(x.device, n_tiles), m, n, k, g_split,
           x.stride(0), x.stride(1), codes.stride(0), dw.scales.stride(0), y.stride(0), y.stride(1),
           W_FORMAT=dw.w_format, MMA="fp8" if config.kernel == "mxdec_fp8" else "fp16",
           C_SHIFT=C_SHIFT[dw.w_format], ROUND_X=x.device.type != "cuda", BLOCK_M=config.BLOCK_M,
           BLOCK_N=config.BLOCK_N, GROUPS=per_step, SPLIT_K=split,
           EVEN=even, **opts)
    return y
