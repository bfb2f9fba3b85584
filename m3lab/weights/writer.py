"""Small checkpoints with the real MiniMax M3 tensor names (for tests and examples).

:func:`random_hf_tensors` makes every text-backbone tensor of a config (``names.hf_shapes``) in one
of the published formats: ``bf16``; ``mxfp8`` (MiniMaxAI/MiniMax-M3-MXFP8: float8_e4m3fn payload +
``weight_scale_inv`` E8M0 for every linear except embedding, LM head and router; ``bf16_indexer``
keeps the index projections BF16: a mixed checkpoint that vLLM's one fused q/k/v/index projection cannot load,
and that ``m3lab.weights.loader`` refuses); ``mxfp4`` (amd/MiniMax-M3-MXFP4,
Quark: packed uint8 + ``weight_scale`` for the routed and shared experts only).
:func:`write_checkpoint` writes them as sharded safetensors plus ``model.safetensors.index.json``.
"""
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from m3lab.errors import M3LabError
from m3lab.kernels.mx.reference import quantize_mxfp4, quantize_mxfp8
from m3lab.spec.model import ModelSpec
from m3lab.weights.checkpoint import INDEX
from m3lab.weights.names import hf_shapes

FORMATS = ("bf16", "mxfp8", "mxfp4")
NOT_QUANTISED = ("embed_tokens", "lm_head", ".gate.weight", "norm", "e_score_correction_bias")


def _quantised(name: str, fmt: str, bf16_indexer: bool) -> bool:
    if fmt == "bf16" or any(s in name for s in NOT_QUANTISED) or not name.endswith(".weight"):
        return False
    if fmt == "mxfp4":
        return ".experts." in name or ".shared_experts." in name
    return not (bf16_indexer and ".index_" in name)


def random_hf_tensors(model: ModelSpec, fmt: str = "bf16", *, seed: int = 0, bf16_indexer: bool = False,
                      norm_std: float = 0.1) -> dict[str, torch.Tensor]:
    """HF name -> tensor for every text-backbone tensor of ``model`` (random values, real names and dtypes)."""
    if fmt not in FORMATS:
        raise M3LabError(f"checkpoint format {fmt!r} is not one of {FORMATS}", field="fmt")
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in hf_shapes(model).items():
        t = torch.randn(shape, generator=gen)
        if len(shape) == 1:
            out[name] = (t * (0.01 if "bias" in name else norm_std)).to(
                torch.float32 if "bias" in name else torch.bfloat16)
            continue
        t = t * (1.0 if "embed_tokens" in name else shape[1] ** -0.5)
        if ".gate.weight" in name:
            out[name] = t.float()
        elif _quantised(name, fmt, bf16_indexer):
            q, s = (quantize_mxfp8 if fmt == "mxfp8" else quantize_mxfp4)(t)
            base = name.removesuffix(".weight")
            out[name] = q
            out[base + (".weight_scale_inv" if fmt == "mxfp8" else ".weight_scale")] = s
        else:
            out[name] = t.to(torch.bfloat16)
    return out


def write_checkpoint(tensors: dict[str, torch.Tensor], path: str | Path, shards: int = 2) -> Path:
    """Write ``tensors`` as ``model-0000i-of-0000n.safetensors`` files plus the index; returns the folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {n: tensors[n].contiguous() for n in names[s::shards]}
        save_file(chunk, str(path / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in chunk})
    (path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return path
