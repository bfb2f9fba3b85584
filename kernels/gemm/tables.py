"""Launch configs for the GEMM kernels and their tuned tables (JSON, one file per problem and device).

A table file is named ``N={N},K={K},w={w_format},device={device}.json`` (after vLLM's fused-MoE
configs) and maps the token count M to a config::

    {"1": {"kernel": "splitk", "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 4, ...}, ...}

At run time the entry with the nearest M is used; without a table, :func:`heuristic_config`.
Tables are written only by the tuner (``m3lab tune gemm``); see kernels/gemm/README.md.
"""
import json
import math
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path

import torch

from ..device import table_device_name
from ..nearest import nearest_key

CONFIG_DIR = Path(__file__).parent / "configs"
KERNELS = ("tiled", "splitk", "gemv", "streamk", "persistent", "mxdec", "mxdec_fp8", "mxdec_fold")
PREFILL_KERNELS = ("tiled", "persistent")       # the kernels tuned for prefill M
# The decode/prefill boundary: decode is M <= DECODE_MAX_M (split-K kernels by default, decode tiles),
# prefill beyond. The tuner tunes decode M with the decode kernels, prefill M with the tiled kernel and
# M in (DECODE_MAX_M, CROSSOVER_MAX_M] with both, so a table may carry either kernel there: the tuned
# tables of kernels/gemm/configs pick split-K at M = 128 for most shapes. What ran is what the launcher
# selected (launcher.launch_config), never inferred from M.
DECODE_MAX_M = 64
CROSSOVER_MAX_M = 2 * DECODE_MAX_M
GEMV_MAX_M = 4          # the gemv kernel's M (and BLOCK_M) bound: it loses to the split-K kernel above
LAYOUT_GEMV_MAX_M = 0   # decode-layout M served by its gemv kernel without a table (the folded-scale MMA kernel won)
FILL_PROGRAMS = 2       # split-K target: programs >= 2 x SMs, so each SM streams two weight slices


@dataclass(frozen=True)
class GemmConfig:
    """One launch: which kernel, its tiles and compiler options (AMD-only options None elsewhere)."""
    kernel: str = "tiled"            # "tiled" (prefill, grouped order) | "splitk" (decode, swapped, split-K)
    #                                  | "gemv" (M <= GEMV_MAX_M: CUDA-core FMAs, split-K; bf16/mxfp8/mxfp4)
    #                                  | "streamk" (decode, swapped, fixed grid of PER_SM x SMs programs)
    #                                  | "persistent" (prefill: one program per SM, TMA, tail split; gemm_persistent.py)
    #                                  | "mxdec" / "mxdec_fp8" / "mxdec_fold" (MX decode layout on tensor cores:
    #                                    fp16 MMA per 32-group / mxfp8 on the fp8 MMA / scales folded into the fp16
    #                                    weights, one MMA per BLOCK_K; layout_launcher.linear_layout, BLOCK_K = 32 x groups)
    BLOCK_M: int = 128
    BLOCK_N: int = 128
    BLOCK_K: int = 64
    GROUP_M: int = 8                 # tiled/persistent: row tiles per column sweep (1 = row-major order)
    SPLIT_K: int = 1                 # splitk; persistent: most K ranges per tile of the last partial wave
    num_warps: int = 4
    num_stages: int = 3
    PER_SM: int | None = None        # streamk only: programs per SM (grid = PER_SM x SMs, at most the K-steps)
    ATOMIC: bool | None = None       # streamk: partials added by fp32 atomics into a zeroed sum (None: stored)
    USE_TMA: bool | None = None      # persistent: tensor-descriptor loads (None: where the GPU has TMA)
    FLATTEN: bool | None = None      # persistent: tile and K loops as one pipelined loop (None: off)
    WARP_SPECIALIZE: bool | None = None  # persistent: the compiler's warp specialisation (None: off)
    waves_per_eu: int | None = None          # AMD: occupancy hint (wave64)
    matrix_instr_nonkdim: int | None = None  # AMD: MFMA 16 or 32
    kpack: int | None = None                 # AMD: K packing of MFMA operands

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel: {self.kernel!r} is not one of {KERNELS}")
        lows = {"BLOCK_M": 1, "BLOCK_N": 4} if self.kernel == "gemv" else {}
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            v, low = getattr(self, name), lows.get(name, 16)
            if v < low or v & (v - 1):
                raise ValueError(f"{name}: {v} must be a power of two >= {low}")
        if self.kernel == "gemv" and self.BLOCK_M > GEMV_MAX_M:
            raise ValueError(f"BLOCK_M: {self.BLOCK_M} must be <= GEMV_MAX_M = {GEMV_MAX_M} for the gemv kernel")
        if (self.PER_SM is not None) != (self.kernel == "streamk") or (self.PER_SM is not None and self.PER_SM < 1):
            raise ValueError("PER_SM: a positive count for the streamk kernel, and only for it")
        if self.ATOMIC is not None and self.kernel != "streamk":
            raise ValueError("ATOMIC: only for the streamk kernel")
        if self.BLOCK_K < 32:
            raise ValueError("BLOCK_K: must be >= 32 (one MX block)")

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> "GemmConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"config: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        return cls(**d)

    def compiler_options(self, is_hip: bool) -> dict:
        """num_warps/num_stages, plus the AMD options when running on ROCm."""
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if is_hip:
            opts.update({k: v for k, v in (("waves_per_eu", self.waves_per_eu), ("kpack", self.kpack),
                                           ("matrix_instr_nonkdim", self.matrix_instr_nonkdim)) if v is not None})
        return opts


def device_name(device: torch.device | str) -> str:
    """'NVIDIA_H200', 'AMD_Instinct_MI355X', ... or 'cpu' (spaces as underscores, as vLLM names tables)."""
    return table_device_name(device)


def table_path(n: int, k: int, w_format: str, device: str, config_dir: Path | None = None) -> Path:
    """configs/N={n},K={k},w={w_format},device={device}.json (config_dir: default CONFIG_DIR)."""
    return Path(config_dir or CONFIG_DIR) / f"N={n},K={k},w={w_format},device={device}.json"


@lru_cache(maxsize=None)
def load_table(path: Path) -> dict[int, GemmConfig]:
    """Table file -> {M: config}; {} when the file does not exist."""
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {int(m): GemmConfig.from_dict(c) for m, c in raw.items()}


def write_table(path: Path, table: dict[int, GemmConfig]) -> Path:
    """Write {M: config} as JSON sorted by M (the tuner's output)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({str(m): table[m].to_dict() for m in sorted(table)}, indent=1) + "\n")
    load_table.cache_clear()
    return path


def nearest(table: dict[int, GemmConfig], m: int) -> GemmConfig | None:
    """The entry with the nearest M (:func:`kernels.nearest.nearest_key`: vLLM's rule), or None for an empty table."""
    key = nearest_key(table, m)
    return None if key is None else table[key]


def heuristic_config(m: int, n: int, k: int, w_format: str = "bf16", regime: str | None = None,
                     sms: int = 132) -> GemmConfig:
    """Fallback when no table covers (N, K, w_format, device).

    decode (M <= DECODE_MAX_M): swapped split-K tiles 64 x 128, SPLIT_K so that about 2 x SMs programs
    stream weights; prefill: 128 x 128 x 64 tiles in groups of 8 row tiles.
    """
    regime = regime or regime_of(m)
    if regime == "decode":
        block_m = max(16, min(64, 1 << max(0, math.ceil(math.log2(max(m, 1))))))
        tiles = math.ceil(n / 64) * math.ceil(m / block_m)
        split = max(1, min(math.ceil(FILL_PROGRAMS * sms / tiles), k // 256))
        split = 1 << int(math.log2(split))
        # 64 x 128 weight tiles, 4 stages: <= 4 x (16 + 16) KiB of shared memory at BLOCK_M 64
        # (H200, 2026-11-29: BLOCK_K 256-512 with 4 stages ran out of the 227 KiB at BLOCK_M 64)
        return GemmConfig("splitk", block_m, 64, 128, 1, split, num_warps=4, num_stages=4)
    block_m = 64 if m <= 256 else 128
    return GemmConfig("tiled", block_m, 128, 64, 8, 1, num_warps=4 if block_m == 64 else 8, num_stages=3)


def regime_of(m: int) -> str:
    """"decode" for M <= DECODE_MAX_M, else "prefill"."""
    return "decode" if m <= DECODE_MAX_M else "prefill"


def select_config(m: int, n: int, k: int, w_format: str, device: torch.device | str,
                  regime: str | None = None) -> GemmConfig:
    """Tuned table entry (nearest M on M's side of CROSSOVER_MAX_M: a table tuned at decode M only never serves
    prefill M, nor the reverse) for this problem and device; the heuristic when none, or when a regime is forced."""
    if regime is None:
        side = m <= CROSSOVER_MAX_M
        table = load_table(table_path(n, k, w_format, device_name(device)))
        cfg = nearest({t: c for t, c in table.items() if (t <= CROSSOVER_MAX_M) == side}, m)
        if cfg is not None:
            return cfg
    sms = torch.cuda.get_device_properties(device).multi_processor_count if torch.device(device).type == "cuda" else 8
    return heuristic_config(m, n, k, w_format, regime, sms)
