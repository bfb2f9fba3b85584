"""Hardware profiles as data: peak rates per dtype, memory, caches, links, measured ceilings, source.

Profiles ship as YAML in ``m3lab/spec/profiles`` (mi355x, mi325x, mi300x, h200, b200); users add their own by
passing a path to a YAML file with the same keys. Units: FLOP/s, B/s, bytes. ``link_bw`` is one way per GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from m3lab.errors import M3LabError

PROFILE_DIR = Path(__file__).with_name("profiles")
PEAK_DTYPES = ("bf16", "fp8", "mxfp8", "mxfp4")   # required in every profile
# Optional ``peak_flops.fp32``: the rate a plain fp32 torch GEMM (the fp32 MoE router) runs at by default —
# FP32 matrix cores on AMD (hipBLASLt, xf32 off), CUDA cores (non-tensor) on NVIDIA (torch keeps TF32 off).
FP32_NOTE = ("the fp32 router GEMM needs peak_flops.fp32 (the rate of a default fp32 torch GEMM: AMD FP32 "
             "matrix, NVIDIA non-tensor FP32)")


@dataclass(frozen=True)
class Hardware:
    """One accelerator. ``peak_flops`` maps dtype -> dense FLOP/s (emulated formats at the emulating rate)."""

    name: str
    peak_flops: dict
    hbm_bw: float
    hbm_bytes: float
    l2_bytes: float = 0.0
    llc_bytes: float = 0.0
    link_bw: float = 0.0
    measured: dict = field(default_factory=dict)
    source: str = ""
    native_mx: bool = False
    vendor: str = ""
    arch: str = ""
    lds_bytes: float = 0.0
    compute_units: int = 0
    tdp_w: float = 0.0

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a GEMM in ``dtype`` (fp16 at the bf16 rate, nvfp4 at mxfp4's; fp32 only from
        ``peak_flops.fp32``, never a silent fallback)."""
        key = {"fp16": "bf16", "nvfp4": "mxfp4"}.get(dtype, dtype)
        if key not in self.peak_flops:
            hint = FP32_NOTE if key == "fp32" else None
            raise M3LabError(f"hardware {self.name!r} has no peak rate for {dtype!r}", field=f"peak_flops.{key}",
                             hint=hint)
        return float(self.peak_flops[key])

    def ridge(self, dtype: str = "bf16") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from bandwidth- to compute-bound."""
        return self.peak(dtype) / self.hbm_bw

    @classmethod
    def from_dict(cls, data: dict, source_path: str = "") -> Hardware:
        if not isinstance(data, dict):
            raise M3LabError(f"hardware profile {source_path!r} must be a YAML mapping", field="hardware")
        for key in ("name", "peak_flops", "hbm_bw", "hbm_bytes"):
            if key not in data:
                raise M3LabError(f"hardware profile field {key!r} is missing ({source_path or 'dict'})", field=key)
        peaks = data["peak_flops"]
        if not isinstance(peaks, dict) or any(d not in peaks for d in PEAK_DTYPES):
            raise M3LabError(f"hardware profile field 'peak_flops' needs {', '.join(PEAK_DTYPES)}", field="peak_flops")
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise M3LabError(f"hardware profile has unknown field(s) {sorted(unknown)}", field=sorted(unknown)[0])
        try:
            values = {k: v for k, v in data.items()}
            values["peak_flops"] = {k: float(v) for k, v in peaks.items()}
            for k in ("hbm_bw", "hbm_bytes", "l2_bytes", "llc_bytes", "link_bw", "lds_bytes", "tdp_w"):
                if k in values:
                    values[k] = float(values[k])
            values["measured"] = {k: float(v) for k, v in (values.get("measured") or {}).items()}
        except (TypeError, ValueError) as err:
            raise M3LabError(f"hardware profile {source_path or data.get('name')!r}: a number is malformed ({err})",
                             field="hardware") from None
        return cls(**values)


def list_hardware() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


@lru_cache(maxsize=32)
def _load_file(path: str) -> Hardware:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        raise M3LabError(f"hardware profile {path!r} is not valid YAML ({str(err).splitlines()[0]})",
                         field="hardware") from None
    return Hardware.from_dict(data, source_path=path)


def load_hardware(name_or_yaml: str | Hardware) -> Hardware:
    """A shipped profile by name (``mi355x``, ``h200``, ...) or a path to a user YAML profile."""
    if isinstance(name_or_yaml, Hardware):
        return name_or_yaml
    key = str(name_or_yaml).strip().lower()
    shipped = PROFILE_DIR / f"{key}.yaml"
    if shipped.is_file():
        return _load_file(str(shipped))
    path = Path(name_or_yaml)
    if path.is_file():
        return _load_file(str(path.resolve()))
    raise M3LabError(f"unknown hardware {name_or_yaml!r}", field="hardware",
                     hint=f"use one of {', '.join(list_hardware())} or a path to a YAML profile")
