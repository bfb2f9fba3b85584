"""``linear(x, w, w_format=...)``: the shape-aware launcher for the GEMM kernels.

Picks a config from the tuned tables (:func:`launch_config`: the kernel and its tiles), checks the
operands, and launches; each launch is reported to :mod:`kernels.launches`, so a caller can see which
kernel ran. ``out`` may be passed (e.g. poisoned by the gates). MX weights packed into the decode layout
have their own launcher (:mod:`.layout_launcher`).
"""
from dataclasses import dataclass

import torch
import triton

from ..counters import zeroed as _zeroed
from ..launches import launch
from ..mx.triton_mx import dequantize as dequantize_mx
from .tables import PREFILL_KERNELS, GemmConfig, select_config
from .gemm_persistent import gemm_persistent_kernel
from .gemm_splitk import gemm_splitk_kernel
from .gemm_streamk import gemm_streamk_kernel
from .gemm_tiled import gemm_tiled_kernel
from .dequant import dequantize_fp8
from .gemv_splitk import gemv_splitk_kernel
from .reference import FP8_BLOCK, W_FORMATS

MX_FORMATS = ("mxfp8", "mxfp4")
GEMV_FORMATS = ("bf16", "mxfp8", "mxfp4")
# MX weights with the tiled (prefill) kernel and no native MX: dequantise W to x's dtype once (kernels/mx),
# then run the bf16 GEMM with the bf16 table's config. Converting in the GEMM's inner loop would convert
# every weight element once per row tile (H200, 2026-11-29: MXFP4 prefill 3-8x slower than bf16 that way).
DEQUANT_PREFILL = True
_LOCKS: dict[torch.device, torch.Tensor] = {}   # split-K arrival counters, zeroed once per device
_SUMS: dict[torch.device, torch.Tensor] = {}    # stream-K ATOMIC tile sums (fp32), zero at rest
CPU_PROGRAMS = 4                                 # the SM count the persistent and stream-K kernels assume on the CPU


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
    forced ``config``, else the tuned table's (:func:`tables.select_config`); on a prefill kernel fp8 weights,
    and MX weights without native MX (the persistent kernel: always), are dequantised first
    (``DEQUANT_PREFILL``) and run with the bf16 table's config."""
    chosen = config or select_config(m, n, k, w_format, device, regime)
    native = (native_mx(device) if use_native_mx is None else use_native_mx) and w_format in MX_FORMATS
    if DEQUANT_PREFILL and chosen.kernel in PREFILL_KERNELS and (
            w_format == "fp8" or (w_format in MX_FORMATS and (not native or chosen.kernel == "persistent"))):
        return config or select_config(m, n, k, "bf16", device, regime), "bf16"
    return chosen, w_format


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


def _launch_persistent(x, w, s, y, config: GemmConfig, w_format: str, scale_args: tuple, opts: dict) -> None:
    """x [M, K], w [N, K] (x's dtype, or fp8 codes with per-channel [N] or per-block scales s) -> y [M, N];
    scale_args: (s_sn, s_sk, SB_N, SB_K) of :func:`_scale_args`."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    s_sn, s_sk, sb_n, sb_k = scale_args
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
           x.stride(0), x.stride(1), w.stride(0), w.stride(1), s_sn, s_sk, y.stride(0), y.stride(1),
           W_FORMAT=w_format, SB_N=sb_n, SB_K=sb_k, USE_TMA=use_tma, FLATTEN=bool(config.FLATTEN),
           WARP_SPECIALIZE=bool(config.WARP_SPECIALIZE), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
           GROUP_M=config.GROUP_M, **opts)


def _dequantized(w, w_format: str, w_scale, n: int, k: int, config: GemmConfig, dtype) -> torch.Tensor:
    """fp8 or MX weights dequantised to ``dtype`` (kernels/gemm/dequant.py, kernels/mx): DEQUANT_PREFILL."""
    if w_format == "fp8":
        return dequantize_fp8(w, *_scale_args(w, w_format, w_scale, n, k, config), dtype=dtype)
    return dequantize_mx(w, w_scale, w_format, dtype=dtype)


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
    if kernel_format != w_format:                        # prefill: dequantise W once, then the bf16 GEMM
        w, w_format, w_scale = _dequantized(w, w_format, w_scale, n, k, config, x.dtype), kernel_format, None
    if config.kernel == "gemv" and w_format not in GEMV_FORMATS:
        raise ValueError(f"config: the gemv kernel takes w_format in {GEMV_FORMATS}, not {w_format!r}")
    s, s_sn, s_sk, sb_n, sb_k = _scale_args(w, w_format, w_scale, n, k, config)
    if config.kernel == "persistent" and w_format not in ("bf16", "fp8"):
        raise ValueError(f"config: the persistent kernel takes floating or fp8 weights, not {w_format!r}; use the "
                         "tiled kernel")
    y = torch.empty(m, n, device=x.device, dtype=x.dtype) if out is None else out
    opts = config.compiler_options(bool(torch.version.hip))
    tiles = dict(BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K)
    common = dict(W_FORMAT=w_format, SB_N=sb_n, SB_K=sb_k, NATIVE_MX=native,
                  X_FMT={torch.bfloat16: "bf16", torch.float16: "fp16"}.get(x.dtype, "fp32"), **tiles, **opts)
    strides = (x.stride(0), x.stride(1), w.stride(0), w.stride(1), s_sn, s_sk, y.stride(0), y.stride(1))
    if config.kernel == "persistent":
        _launch_persistent(x, w, s, y, config, w_format, (s_sn, s_sk, sb_n, sb_k), opts)
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
