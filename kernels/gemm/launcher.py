"""``linear(x, w, w_format=...)``: the shape-aware launcher for the GEMM kernels.

Picks a config from the tuned tables (:func:`launch_config`: the kernel and its tiles), checks the
operands, and launches; each launch is reported to :mod:`kernels.launches`, so a caller can see which
kernel ran. ``out`` may be passed (e.g. poisoned by the gates).
"""
from dataclasses import dataclass

import torch
import triton

from ..launches import launch
from .tables import PREFILL_KERNELS, GemmConfig, select_config
from .gemm_persistent import gemm_persistent_kernel
from .gemm_splitk import gemm_splitk_kernel
from .gemm_streamk import gemm_streamk_kernel
from .gemm_tiled import gemm_tiled_kernel
from .gemv_splitk import gemv_splitk_kernel
from .gemv_mx_layout import gemv_mx_layout_kernel
from .gemm_mx_layout import gemm_mx_fold_kernel, gemm_mx_layout_kernel
from ..mx.decode_layout import C_SHIFT, DecodeWeights
from .reference import FP8_BLOCK, W_FORMATS

MX_FORMATS = ("mxfp8", "mxfp4")
GEMV_FORMATS = ("bf16", "mxfp8", "mxfp4")
# MX weights with the tiled (prefill) kernel and no native MX: dequantise W to x's dtype once (kernels/mx),
# then run the bf16 GEMM with the bf16 table's config. Converting in the GEMM's inner loop would convert
# every weight element once per row tile (H200, 2026-11-29: MXFP4 prefill 3-8x slower than bf16 that way).
DEQUANT_PREFILL = True
_LOCKS: dict[torch.device, torch.Tensor] = {}   # split-K arrival counters, zeroed once per device
_SUMS: dict[torch.device, torch.Tensor] = {}    # stream-K ATOMIC tile sums (fp32), zero at rest
CPU_PROGRAMS = 4                                 # the SM count the persistent and stream-K kernels assume in the CPU interpreter
LAYOUT_BLOCK_N, LAYOUT_BLOCK_K = 32, 256         # decode-layout gemv tiles (untuned)
LAYOUT_KERNELS = ("gemv", "mxdec", "mxdec_fp8", "mxdec_fold")   # the kernels linear_layout launches
# Decode-layout fallback without a tuned table (H200, graph24, traces/bench/gemm_mx_layout_sweep_NVIDIA_H200.csv at
# e2d9a2a): the folded-scale tensor-core kernel won 64 of 70 points at M 1-64 (mxfp8 and mxfp4, the seven M3 TP4 shapes); the gemv kernel won M 1 on four shapes
# by 3-12% and the per-group fp8 MMA two mxfp8 M 64 points, both reached through tables. Tiles of the winners:
# 16-32 x 64-128 x 128, 4 warps, 3 stages.
LAYOUT_TILES = (4, 4, 3)                         # mxdec_fold fallback (groups per step, num_warps, num_stages)


def native_mx(device: torch.device) -> bool:
    """True where tl.dot_scaled runs on MX hardware: AMD gfx950, NVIDIA compute capability >= 10."""
    if device.type != "cuda":
        return False
    if torch.version.hip:
        return "gfx950" in torch.cuda.get_device_properties(device).gcnArchName
    return torch.cuda.get_device_capability(device)[0] >= 10


def launch_config(m: int, n: int, k: int, w_format: str, device: torch.device, *, config: GemmConfig | None = None,
                  regime: str | None = None, use_native_mx: bool | None = None) -> tuple[GemmConfig, str]:
    """The config :func:`linear` launches for this problem and the weight format its kernel reads: the
    forced ``config``, else the tuned table's (:func:`tables.select_config`); MX weights on the tiled kernel
    without native MX (the persistent kernel: always) are dequantised first (``DEQUANT_PREFILL``) and run with
    the bf16 table's config."""
    chosen = config or select_config(m, n, k, w_format, device, regime)
    native = (native_mx(device) if use_native_mx is None else use_native_mx) and w_format in MX_FORMATS
    if (DEQUANT_PREFILL and chosen.kernel in PREFILL_KERNELS and w_format in MX_FORMATS
            and (not native or chosen.kernel == "persistent")):
        return config or select_config(m, n, k, "bf16", device, regime), "bf16"
    return chosen, w_format


def _zeroed(pool: dict, device: torch.device, n: int, dtype: torch.dtype) -> torch.Tensor:
    """A per-device buffer of at least n elements, zero when made; the kernels leave it zero after each call."""
    buf = pool.get(device)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=dtype, device=device)
        pool[device] = buf
    return buf


def _locks(device: torch.device, n: int) -> torch.Tensor:
    return _zeroed(_LOCKS, device, n, torch.int32)


def _scale_args(w: torch.Tensor, w_format: str, w_scale: torch.Tensor | None, n: int, k: int, config: GemmConfig):
    """(scale tensor, s_sn, s_sk, SB_N, SB_K) for the kernels; a dummy pointer when unscaled."""
    if w_format == "bf16":
        return w, 0, 0, 1, config.BLOCK_K
    if w_scale is None:
        raise ValueError(f"w_scale: required for w_format={w_format!r}")
    if w_format == "fp8" and w_scale.dim() == 1:            # per channel [N]
        if w_scale.shape[0] != n:
            raise ValueError(f"w_scale: per-channel fp8 scales must be [N={n}], got {list(w_scale.shape)}")
        return w_scale.float().contiguous(), 1, 0, 1, 0                 # SB_K = 0: one scale per output row
    if w_format == "fp8":                                    # per 128 x 128 block
        shape = [triton.cdiv(n, FP8_BLOCK), triton.cdiv(k, FP8_BLOCK)]
        if list(w_scale.shape) != shape:
            raise ValueError(f"w_scale: block fp8 scales must be {shape}, got {list(w_scale.shape)}")
        s = w_scale.float().contiguous()
        return s, s.stride(0), s.stride(1), FP8_BLOCK, FP8_BLOCK
    if list(w_scale.shape) != [n, k // 32] or w_scale.dtype != torch.uint8:
        raise ValueError(f"w_scale: MX scales must be uint8 [N={n}, K/32={k // 32}], got {w_scale.dtype} {list(w_scale.shape)}")
    return w_scale, w_scale.stride(0), w_scale.stride(1), 1, 1


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
    """The ``w=`` name of a decode-layout table: "mxfp8" -> "mxfp8_layout" (the tuner writes it, layout_config reads it)."""
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


def _sm_count(device: torch.device) -> int:
    """SMs (CUs) of a GPU; CPU_PROGRAMS in the CPU interpreter."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else CPU_PROGRAMS


def _streamk(x, w, s, y, m, n, k, strides, config: GemmConfig, common: dict) -> torch.Tensor:
    """Launch gemm_streamk_kernel: PER_SM x SMs programs (at most one per K-step), partial slots [P, 2, tile]."""
    tiles = triton.cdiv(n, config.BLOCK_N) * triton.cdiv(m, config.BLOCK_M)
    iters = triton.cdiv(k, config.BLOCK_K)
    programs = min(config.PER_SM * _sm_count(x.device), tiles * iters)
    if config.ATOMIC:
        part = _zeroed(_SUMS, x.device, tiles * config.BLOCK_N * config.BLOCK_M, torch.float32)
    else:
        part = torch.empty(programs * 2 * config.BLOCK_N * config.BLOCK_M, device=x.device, dtype=torch.float32)
    launch(gemm_streamk_kernel, (programs,), x, w, s, y, part, _locks(x.device, tiles), m, n, k, iters,
           tiles * iters, *strides, ATOMIC=bool(config.ATOMIC), **common)
    return y


@dataclass(frozen=True)
class PersistentPlan:
    """The persistent kernel's work split: ``programs`` programs; tiles [0, n_whole) over the whole K (whole
    waves), then ``n_tail`` tiles (the last partial wave) in ``tail_split`` ranges of ``k_split`` columns."""
    programs: int
    n_whole: int
    n_tail: int
    tail_split: int
    k_split: int


def persistent_plan(m: int, n: int, k: int, config: GemmConfig, sms: int) -> PersistentPlan:
    """One program per SM (fewer when there are fewer tiles). The tiles of the last partial wave are split
    along K into at most ``config.SPLIT_K`` ranges, as many as the idle programs allow (one range each)
    and never an empty range; SPLIT_K 1, or a problem of whole waves, computes every tile whole."""
    tiles = triton.cdiv(m, config.BLOCK_M) * triton.cdiv(n, config.BLOCK_N)
    programs = min(sms, tiles)
    left = tiles % programs
    steps = triton.cdiv(k, config.BLOCK_K)
    split = min(config.SPLIT_K, programs // left, steps) if left else 1
    if split > 1:
        k_split = triton.cdiv(steps, split) * config.BLOCK_K
        split = triton.cdiv(k, k_split)
    if split <= 1:
        return PersistentPlan(programs, tiles, 0, 1, k)
    return PersistentPlan(programs, tiles - left, left, split, k_split)


def tma_capable(device: torch.device) -> bool:
    """True where tensor descriptors become bulk tensor copies (NVIDIA compute capability >= 9) and in the
    CPU interpreter (which runs them as plain loads); AMD keeps the pointer path."""
    if device.type != "cuda":
        return True
    return not torch.version.hip and torch.cuda.get_device_capability(device)[0] >= 9


def _tma_aligned(*ts: torch.Tensor) -> bool:
    """Tensor descriptors need 16-byte aligned bases and row strides and unit column strides."""
    return all(t.data_ptr() % 16 == 0 and t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0
               for t in ts)


def _launch_persistent(x, w, s, y, config: GemmConfig, w_format: str, opts: dict) -> None:
    """x [M, K], w [N, K] (x's dtype, or fp8 codes with per-channel scales s [N]) -> y [M, N]."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    (m, k), n = x.shape, w.shape[0]
    bm, bn, bk = config.BLOCK_M, config.BLOCK_N, config.BLOCK_K
    p = persistent_plan(m, n, k, config, _sm_count(x.device))
    use_tma = (tma_capable(x.device) if config.USE_TMA is None else config.USE_TMA) and _tma_aligned(x, w, y)
    descs = ((TensorDescriptor(x, [m, k], [x.stride(0), 1], [bm, bk]),
              TensorDescriptor(w, [n, k], [w.stride(0), 1], [bn, bk]),
              TensorDescriptor(y, [m, n], [y.stride(0), 1], [bm, bn])) if use_tma else (x, w, y))
    part = torch.empty(max(1, p.n_tail * p.tail_split * bm * bn), device=x.device, dtype=torch.float32)
    launch(gemm_persistent_kernel, (p.programs,), *descs, x, w, s, y, part, _locks(x.device, max(1, p.n_tail)),
           m, n, k, p.programs, p.n_whole, p.n_tail, p.tail_split, p.k_split,
           x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0), y.stride(1),
           W_FORMAT=w_format, USE_TMA=use_tma, FLATTEN=bool(config.FLATTEN),
           WARP_SPECIALIZE=bool(config.WARP_SPECIALIZE), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
           GROUP_M=config.GROUP_M, **opts)


def linear(x: torch.Tensor, w: torch.Tensor, *, w_format: str = "bf16", w_scale: torch.Tensor | None = None,
           config: GemmConfig | None = None, regime: str | None = None, out: torch.Tensor | None = None,
           use_native_mx: bool | None = None) -> torch.Tensor:
    """x [M, K] (bf16; fp16/fp32 for CPU tests), w [N, K] (mxfp4: uint8 [N, K/2]) -> y [M, N] in x.dtype.

    config: force a launch config; regime: "decode" | "prefill" forces the heuristic of that regime;
    use_native_mx: force tl.dot_scaled on (interpreter tests) or off (default: where the GPU has MX).
    """
    if w_format not in W_FORMATS:
        raise ValueError(f"w_format: {w_format!r} is not one of {W_FORMATS}")
    if x.dim() != 2:
        raise ValueError(f"x: expected [M, K], got shape {list(x.shape)}")
    m, k = x.shape
    n = w.shape[0]
    k_w = w.shape[1] * (2 if w_format == "mxfp4" else 1)
    if k_w != k:
        raise ValueError(f"w: K={k_w} does not match x's K={k}")
    if w_format == "bf16" and w.dtype != x.dtype:
        raise ValueError(f"w: unquantised weights must have x's dtype {x.dtype}, got {w.dtype}")
    if w_format in MX_FORMATS and k % 32:
        raise ValueError(f"x: K={k} must be a multiple of 32 for {w_format}")
    config, kernel_format = launch_config(m, n, k, w_format, x.device, config=config, regime=regime,
                                          use_native_mx=use_native_mx)
    native = (native_mx(x.device) if use_native_mx is None else use_native_mx) and w_format in MX_FORMATS
    if kernel_format != w_format:                        # MX prefill: dequantise W once, then the bf16 GEMM
        from ..mx.triton_mx import dequantize
        w = dequantize(w, w_scale, w_format, dtype=x.dtype)
        w_format, w_scale = kernel_format, None
    if config.kernel == "gemv" and w_format not in GEMV_FORMATS:
        raise ValueError(f"config: the gemv kernel takes w_format in {GEMV_FORMATS}, not {w_format!r}")
    s, s_sn, s_sk, sb_n, sb_k = _scale_args(w, w_format, w_scale, n, k, config)
    if config.kernel == "persistent" and (w_format not in ("bf16", "fp8") or (w_format == "fp8" and sb_k != 0)):
        raise ValueError("config: the persistent kernel takes floating weights or fp8 with per-channel scales, "
                         f"not {w_format!r}" + (" with block scales" if w_format == "fp8" else "")
                         + "; use the tiled kernel")
    y = torch.empty(m, n, device=x.device, dtype=x.dtype) if out is None else out
    opts = config.compiler_options(bool(torch.version.hip))
    tiles = dict(BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K)
    common = dict(W_FORMAT=w_format, SB_N=sb_n, SB_K=sb_k, NATIVE_MX=native,
                  X_FMT={torch.bfloat16: "bf16", torch.float16: "fp16"}.get(x.dtype, "fp32"), **tiles, **opts)
    strides = (x.stride(0), x.stride(1), w.stride(0), w.stride(1), s_sn, s_sk, y.stride(0), y.stride(1))
    if config.kernel == "persistent":
        _launch_persistent(x, w, s, y, config, w_format, opts)
        return y
    if config.kernel == "tiled":
        grid = (triton.cdiv(m, config.BLOCK_M) * triton.cdiv(n, config.BLOCK_N),)
        launch(gemm_tiled_kernel, grid, x, w, s, y, m, n, k, *strides, GROUP_M=config.GROUP_M, **common)
        return y
    if config.kernel == "streamk":
        return _streamk(x, w, s, y, m, n, k, strides, config, common)
    split = max(1, min(config.SPLIT_K, triton.cdiv(k, config.BLOCK_K)))
    k_split = triton.cdiv(triton.cdiv(k, split), config.BLOCK_K) * config.BLOCK_K
    split = triton.cdiv(k, k_split)                      # no empty splits
    grid = (triton.cdiv(n, config.BLOCK_N), triton.cdiv(m, config.BLOCK_M), split)
    n_tiles = grid[0] * grid[1]
    part = torch.empty(split * n_tiles * config.BLOCK_N * config.BLOCK_M if split > 1 else 1,
                       device=x.device, dtype=torch.float32)
    args = (x, w, s, y, part, _locks(x.device, n_tiles), m, n, k, k_split, *strides)
    if config.kernel == "gemv":
        launch(gemv_splitk_kernel, grid, *args, W_FORMAT=w_format, SPLIT_K=split, **tiles, **opts)
    else:
        launch(gemm_splitk_kernel, grid, *args, SPLIT_K=split, **common)
    return y
