"""OpenAI's triton_kernels ``matmul_ogs`` (vendored in vLLM: ``vllm/third_party/triton_kernels``) as the MXFP4
decode peer, in each of its variants.

The weights are laid out as vLLM lays them out for ``matmul_ogs`` (``_swizzle_mxfp4``,
vllm/model_executor/layers/quantization/utils/mxfp4_utils.py:65-170): codes and scales transposed so that K
is the quantised axis, on Hopper ``HopperMXValueLayout`` (nibbles bit-interleaved for a short in-register
upcast) and ``HopperMXScaleLayout`` (scales swizzled for ``num_warps`` warps), the scale's K groups padded to a
multiple of 4. A variant is (``num_warps`` of the scale layout, ``split_k``): vLLM pins ``split_k = 1`` on
SM90; the other split counts and triton_kernels' own choice (``split_k=None``) are tried too, so the peer
runs at its best. x is bf16 [M, K]; y bf16 [M, N].
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..vllm_src.imports import vllm_module

WARPS = (4, 8)
SPLITS = {4: (None, 1, 2, 4, 8), 8: (None, 1, 4)}      # None: triton_kernels' heuristic


@dataclass(frozen=True)
class OgsVariant:
    num_warps: int
    split_k: int | None

    @property
    def label(self) -> str:
        return f"warps={self.num_warps},split_k={'auto' if self.split_k is None else self.split_k}"


VARIANTS = tuple(OgsVariant(w, s) for w in WARPS for s in SPLITS[w])


def _tk():
    """The triton_kernels package as vLLM imports it (its vendored copy registered as ``triton_kernels``)."""
    vllm_module("vllm.utils.import_utils").import_triton_kernels()
    import triton_kernels  # noqa: F401 - registered by vLLM's import above
    from triton_kernels import matmul_ogs
    from triton_kernels.matmul_ogs_details import opt_flags
    from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details import layout
    return matmul_ogs, opt_flags, (FP4, convert_layout, wrap_torch_tensor), layout


def ogs_weights(w_q: torch.Tensor, w_s: torch.Tensor, num_warps: int):
    """OCP MXFP4 weights (packed codes uint8 [N, K/2], low nibble first; E8M0 [N, K/32]) -> (w, scale) in
    triton_kernels' Hopper layouts, as vLLM's ``_swizzle_mxfp4`` builds them (one expert: [1, K/2, N])."""
    _, _, (fp4, convert_layout, wrap), layout = _tk()
    vl, vo = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    sl, so = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=num_warps)
    s = w_s[None]
    s = torch.nn.functional.pad(s, (0, -s.shape[-1] % 4))
    w = convert_layout(wrap(w_q[None].transpose(-2, -1), dtype=fp4), vl, **vo)
    return w, convert_layout(wrap(s.transpose(-2, -1)), sl, **so)


@contextmanager
def variant_flags(v: OgsVariant):
    """triton_kernels' option constraints for one variant (module-wide state, reset on exit)."""
    _, opt_flags, _, _ = _tk()
    opt_flags.reset_opt_flags_constraints()
    if v.split_k is not None:
        opt_flags.update_opt_flags_constraints({"split_k": v.split_k})
    try:
        yield
    finally:
        opt_flags.reset_opt_flags_constraints()


def ogs_linear(x: torch.Tensor, w, w_scale) -> torch.Tensor:
    """y [M, N] = x [M, K] bf16 @ W^T through ``matmul_ogs`` (weights from :func:`ogs_weights`)."""
    mo, _, _, _ = _tk()
    from triton_kernels.numerics import InFlexData
    pc = mo.PrecisionConfig(weight_scale=w_scale, flex_ctx=mo.FlexCtx(rhs_data=InFlexData()), out_dtype=x.dtype)
    y = mo.matmul_ogs(x, w, None, precision_config=pc)
    return y.reshape(x.shape[0], -1)
