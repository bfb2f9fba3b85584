"""Launch configs of the grouped MoE kernels, stored as vLLM fused-MoE tables (and read from vLLM's own).

A table is vLLM's file, with vLLM's name and keys (vLLM ``fused_moe.py:get_config_file_name``)::

    E={experts},N={intermediate per shard},device_name={device}[,dtype={dtype}].json
    {"<M>": {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}, ...}

keyed by the token count M, nearest M used at run time (vLLM ``try_get_optimal_moe_config``). E counts
the fused shared expert (M3: ``E=129,N=768`` at TP4). bf16 tables carry no dtype (as vLLM's); our MX
tables add ``,dtype=mxfp8|mxfp4`` (vLLM looks up none for OCP MX). vLLM's keys configure our gate_up
kernel (its BLOCK_SIZE_N tiles the intermediate dimension, gate and up rows together); what vLLM's kernel
does not take (program order, the down kernel's tiles) is in a file beside it, same stem,
``.m3lab.json``, same M keys. vLLM's shipped tables carry AMD options (``waves_per_eu``,
``matrix_instr_nonkdim``, ``kpack``, ``SPLIT_K``), kept as read; tables of other backends (file names
ending ``,backend=flydsl``: ``tile_m`` … keys) are read raw by :func:`read_vllm_table`.
"""
import json
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path

import torch

from ..device import table_device_name
from ..nearest import nearest_key

CONFIG_DIR = Path(__file__).parent / "configs"
VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
META_SUFFIX = ".m3lab.json"
COMBINES = ("atomic", "store")


@dataclass(frozen=True)
class MoeConfig:
    """Tiles of both grouped GEMMs; the first six fields are vLLM's keys (gate_up kernel)."""
    BLOCK_SIZE_M: int = 64           # rows (token slots) per block; the alignment pads each expert to it
    BLOCK_SIZE_N: int = 64           # gate_up: intermediate columns per program (gate and up rows each)
    BLOCK_SIZE_K: int = 64
    GROUP_SIZE_M: int = 8            # ORDER "token": row blocks per column sweep (1 = row by row)
    num_warps: int = 4
    num_stages: int = 3
    ORDER: str = "token"             # "token" | "expert" (see grouped.py)
    DOWN_BLOCK_SIZE_N: int = 64      # down: hidden columns per program
    DOWN_BLOCK_SIZE_K: int = 64
    DOWN_num_warps: int = 4
    DOWN_num_stages: int = 3
    COMBINE: str = "atomic"          # "atomic": fp32 atomic adds per token | "store": per slot + combine_kernel
    extra: dict = field(default_factory=dict, compare=False)   # keys of other kernels/backends, kept as read

    def __post_init__(self):
        if self.ORDER not in ("token", "expert"):
            raise ValueError(f"ORDER: {self.ORDER!r} is not 'token' or 'expert'")
        if self.COMBINE not in COMBINES:
            raise ValueError(f"COMBINE: {self.COMBINE!r} is not one of {COMBINES}")
        for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "DOWN_BLOCK_SIZE_N", "DOWN_BLOCK_SIZE_K"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name}: {v} must be a power of two")

    def check_launchable(self) -> "MoeConfig":
        """Our kernels' limits (tl.dot needs 16 on every side); vLLM's tables also hold 8-row blocks."""
        for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "DOWN_BLOCK_SIZE_N", "DOWN_BLOCK_SIZE_K"):
            if getattr(self, name) < 16:
                raise ValueError(f"config: {name}={getattr(self, name)} must be >= 16 for the m3lab MoE kernels")
        return self

    def vllm_dict(self) -> dict:
        """The entry as vLLM's table holds it (vLLM's keys, then any extra keys read)."""
        return {**{k: getattr(self, k) for k in VLLM_KEYS}, **self.extra}

    def meta_dict(self) -> dict:
        names = [f.name for f in fields(self) if f.name not in VLLM_KEYS and f.name != "extra"]
        return {k: getattr(self, k) for k in names}

    @classmethod
    def from_dicts(cls, vllm_entry: dict, meta: dict | None = None) -> "MoeConfig":
        known = {f.name for f in fields(cls)} - {"extra"}
        missing = [k for k in VLLM_KEYS if k not in vllm_entry]
        if missing:
            raise ValueError(f"entry: missing {missing} (not a table of vLLM's Triton fused_moe_kernel; other "
                             "backends' tables, e.g. ',backend=flydsl', are read by read_vllm_table only)")
        entry = {**vllm_entry, **(meta or {})}
        unknown = sorted(set(meta or {}) - known)
        if unknown:
            raise ValueError(f"meta: unknown keys {unknown} (known: {sorted(known - set(VLLM_KEYS))})")
        return cls(**{k: v for k, v in entry.items() if k in known},
                   extra={k: v for k, v in vllm_entry.items() if k not in known})

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        return d


def vllm_device_name(device: torch.device | str | None = None, name: str | None = None) -> str:
    """vLLM's device part of the file name: the GPU name with spaces as '_', any H200 variant -> NVIDIA_H200."""
    if name is None:
        name = table_device_name(device)
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def file_name(experts: int, n: int, device: str, w_format: str = "bf16") -> str:
    """vLLM's table name: ``E={experts},N={n},device_name={device}[,dtype=...].json``."""
    dtype = "" if w_format == "bf16" else f",dtype={w_format}"
    return f"E={experts},N={n},device_name={device}{dtype}.json"


def meta_path(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".json") + META_SUFFIX)


def read_vllm_table(path: Path | str) -> dict[int, dict]:
    """A vLLM fused-MoE JSON -> {M: entry}, ascending M. As vLLM's ``get_moe_configs``: ``triton_version`` is
    dropped and every other key is a token count; any other key, or an entry that is not an object, raises
    ValueError naming the file (vLLM would fail on it at ``int(key)``)."""
    path = Path(path)
    raw = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a fused-MoE table is a JSON object keyed by M")
    raw.pop("triton_version", None)
    bad = [k for k, v in raw.items() if not (k.isdigit() and isinstance(v, dict))]
    if bad:
        raise ValueError(f"{path}: keys {bad} are not token counts M with a config object")
    return {int(m): dict(raw[m]) for m in sorted(raw, key=int)}


@lru_cache(maxsize=None)
def load_table(path: Path) -> dict[int, MoeConfig]:
    """Table (+ its meta file when present) -> {M: MoeConfig}; {} when the table does not exist."""
    path = Path(path)
    if not path.exists():
        return {}
    meta_file = meta_path(path)
    meta = {int(m): v for m, v in json.loads(meta_file.read_text()).items()} if meta_file.exists() else {}
    return {m: MoeConfig.from_dicts(entry, meta.get(m)) for m, entry in read_vllm_table(path).items()}


def write_table(path: Path | str, table: dict[int, MoeConfig], triton_version: str | None = None) -> Path:
    """Write {M: config} as vLLM's JSON (sorted by M) and the meta file beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {str(m): table[m].vllm_dict() for m in sorted(table)}
    if triton_version:
        body = {"triton_version": triton_version, **body}
    path.write_text(json.dumps(body, indent=4) + "\n")
    meta_path(path).write_text(json.dumps({str(m): table[m].meta_dict() for m in sorted(table)}, indent=1) + "\n")
    load_table.cache_clear()
    return path


def nearest(table: dict, m: int):
    """The entry with the nearest M (:func:`kernels.nearest.nearest_key`: vLLM's rule), or None for an empty table."""
    key = nearest_key(table, m)
    return None if key is None else table[key]


def heuristic_config(m: int, topk: int) -> MoeConfig:
    """Without a table. Decode (M·k ≤ 256): 16-row blocks (one token per expert needs no more), thin
    column tiles so that enough programs stream weights, deep K pipelines. Prefill: 64 × 64 × 64 tiles."""
    slots = m * topk
    if slots <= 256:
        return MoeConfig(16, 32, 128, 1, 4, 4, "token", 64, 128, 4, 4)
    if slots <= 4096:
        return MoeConfig(32, 64, 64, 4, 4, 3, "token", 64, 64, 4, 3)
    return MoeConfig(64, 64, 64, 8, 8, 3, "token", 128, 64, 8, 3)


def select_config(m: int, experts: int, n: int, topk: int, w_format: str, device: torch.device | str,
                  config_dir: Path | None = None) -> MoeConfig:
    """Tuned entry (nearest M) for (E, N, format, device), else :func:`heuristic_config`."""
    dev = torch.device(device)
    if dev.type == "cuda":
        path = Path(config_dir or CONFIG_DIR) / file_name(experts, n, vllm_device_name(dev), w_format)
        cfg = nearest(load_table(path), m)
        if cfg is not None:
            return cfg
    return heuristic_config(m, topk)
