"""Reading Hugging Face safetensors checkpoints (never pickle): files, index, one-line errors.

A checkpoint is a directory with ``model.safetensors.index.json`` (``weight_map``: tensor -> file)
and/or ``*.safetensors`` files, or a single ``.safetensors`` file. Corrupt or truncated files,
missing tensors and pickled formats raise :class:`~m3lab.errors.M3LabError` naming the file or
tensor and the fix.
"""
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from m3lab.errors import M3LabError

INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def _open(file: Path):
    try:
        return safe_open(str(file), framework="pt")
    except (SafetensorError, OSError, ValueError) as err:
        raise M3LabError(f"{file}: not a readable safetensors file (corrupt or truncated: {err})",
                         field="checkpoint", hint="download the file again; its header or size is wrong") from None


class CheckpointReader:
    """Tensor lookup over the safetensors files of a checkpoint."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise M3LabError(f"checkpoint not found: {self.path}", field="checkpoint", hint="check the path")
        files = self._files()
        self.where: dict[str, Path] = {}
        self._handles: dict[Path, object] = {}
        index = self.path / INDEX if self.path.is_dir() else None
        if index is not None and index.is_file():
            self._read_index(index)
        for f in files:
            for key in self._handle(f).keys():
                self.where.setdefault(key, f)

    def _files(self) -> list[Path]:
        if self.path.is_file():
            if self.path.suffix in PICKLE_SUFFIXES or self.path.suffix != ".safetensors":
                raise M3LabError(f"{self.path}: only .safetensors checkpoints are read (pickled files are never "
                                 f"loaded)", field="checkpoint", hint="convert the checkpoint to safetensors")
            return [self.path]
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            pickled = [p.name for p in self.path.iterdir() if p.suffix in PICKLE_SUFFIXES]
            what = f"only pickled files ({', '.join(pickled[:3])})" if pickled else "no .safetensors files"
            raise M3LabError(f"{self.path}: {what}", field="checkpoint",
                             hint="point at a safetensors checkpoint; pickled files are never loaded")
        return files

    def _read_index(self, index: Path) -> None:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise M3LabError(f"{index}: not a valid safetensors index ({err})", field="checkpoint",
                             hint='expected {"weight_map": {tensor: file}}') from None
        for key, fname in weight_map.items():
            f = self.path / fname
            if not f.is_file():
                raise M3LabError(f"{index}: tensor {key} maps to missing file {fname}", field="checkpoint",
                                 hint="download the missing shard")
            self.where[key] = f

    def _handle(self, f: Path):
        if f not in self._handles:
            self._handles[f] = _open(f)
        return self._handles[f]

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def keys(self) -> list[str]:
        """All tensor names."""
        return sorted(self.where)

    def get(self, name: str) -> torch.Tensor:
        """Load one tensor; a missing or unreadable tensor raises M3LabError naming it."""
        if name not in self.where:
            raise M3LabError(f"checkpoint {self.path} lacks tensor {name}", field="checkpoint",
                             hint="the checkpoint does not match the model config (layers, experts, names)")
        f = self.where[name]
        try:
            return self._handle(f).get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise M3LabError(f"{f}: tensor {name} cannot be read (corrupt or truncated: {err})",
                             field="checkpoint", hint="download the file again") from None
