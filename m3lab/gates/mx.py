"""Gates for kernels/mx: Triton quantise (codes and scales bit-exact) and dequantise (vs reference)."""
import torch

from ..kernels.mx import reference, triton_mx
from ..optable.kernel_shapes import rank_dims
from .checks import poison_
from .inputs import blocky
from .registry import Case, Gate, register

CPU_SHAPES = ((7, 96), (33, 224))
_DIMS = rank_dims("minimax-m3", tp=4)
GPU_SHAPES = ((128, _DIMS.hidden), (_DIMS.qkv_sparse, _DIMS.hidden), (_DIMS.hidden, _DIMS.attn_out))   # M3 TP4 (rows, K)


def _shapes(device: torch.device):
    return GPU_SHAPES if device.type == "cuda" else CPU_SHAPES


def _quant_case(fmt: str, rows: int, k: int, device: torch.device, part: int) -> Case:
    def run():
        x = blocky(rows, k, device)
        q_ref, s_ref = reference.QUANTIZE[fmt](x)
        out = (poison_(torch.empty_like(q_ref)), poison_(torch.empty_like(s_ref)))
        triton_mx.quantize(x, fmt, out=out)
        return out[part], (q_ref, s_ref)[part]
    return Case(f"R={rows},K={k},{('codes', 'scales')[part]}", "uint8", run, exact=True)


def _dequant_case(fmt: str, rows: int, k: int, device: torch.device) -> Case:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def run():
        q, s = reference.QUANTIZE[fmt](blocky(rows, k, device))
        out = poison_(torch.empty(rows, k, device=device, dtype=dtype))
        triton_mx.dequantize(q, s, fmt, dtype=dtype, out=out)
        return out, reference.DEQUANTIZE[fmt](q, s, dtype=torch.float32)
    return Case(f"R={rows},K={k}", str(dtype).removeprefix("torch."), run)


for _fmt in ("mxfp8", "mxfp4"):
    register(Gate(f"mx.quant_{_fmt}", "mx_quant",
                  lambda d, f=_fmt: [_quant_case(f, r, k, d, p) for r, k in _shapes(d) for p in (0, 1)],
                  doc=f"Triton {_fmt} quantise: element codes and E8M0 scales bit-identical to the reference"))
    register(Gate(f"mx.dequant_{_fmt}", "mx_dequant",
                  lambda d, f=_fmt: [_dequant_case(f, r, k, d) for r, k in _shapes(d)],
                  doc=f"Triton {_fmt} dequantise vs the reference"))
