"""Gates for kernels/moe: our grouped MoE (``launcher.fused_moe``) and vLLM's own MoE kernel vs ``fused_moe_ref``.

``moe.<fmt>`` (bf16 | mxfp8 | mxfp4 weights): CPU (interpreter) small awkward shapes (H 64, I 48 or 64,
T 1 / 7 / 37, a few experts, EP with remote experts, MXFP8 activations, tl.dot_scaled where the
interpreter has it), fp32/fp16 activations; CUDA: MiniMax M3 TP4 shapes (H 6144, I 768, 128 + 1 experts,
top-5 with the shared slot), bf16, T 1 / 32 / 2048 (MX: 1 / 32) and the expert-major order at T 8.

``vllm.fused_moe_kernel``: vLLM's Triton ``fused_moe_kernel`` (``fused_moe/fused_moe.py:297-610``, launched by
its ``invoke_fused_moe_triton_kernel``: gate_up, then down with the routing weights) on tokens aligned by
our ``kernels/moe/align.py`` (vLLM's own ``moe_align_block_size`` is a compiled op), or vLLM's naive
one-block-per-slot assignment where vLLM takes it (``_prepare_expert_assignment``, ``fused_moe.py:1549-1600``);
the SwiGLU-OAI between the GEMMs is vLLM's ``swiglu_oai_split``; the per-token sum is torch's (vLLM's
``ops.moe_sum`` is compiled). vLLM's config comes from its own lookup (``try_get_optimal_moe_config``).
"""
from functools import lru_cache

import torch

from ..kernels.moe import launcher
from ..kernels.moe.align import align
from ..kernels.moe.reference import fused_moe_ref
from ..kernels.moe.tables import MoeConfig
from ..optable.kernel_shapes import moe_problem
from ..spec.model import load_model
from ..vllm_src.imports import m3_module, vllm_module
from .checks import poison_
from .inputs import act_dtype, make_routing, make_weights
from .registry import Case, Gate, register


@lru_cache(maxsize=1)
def m3_act() -> dict:
    """MiniMax M3's SwiGLU-OAI constants (alpha, limit, beta), read from its ModelSpec."""
    return load_model("minimax-m3").swiglu


_M3 = moe_problem("minimax-m3", tp=4)
M3_TP4 = {"h": _M3.hidden, "i": _M3.inter, "experts": _M3.routed, "topk": _M3.topk}
CPU_CONFIG = MoeConfig(16, 32, 32, 2, 4, 1, "token", 32, 32, 4, 1)
GPU_TS = (1, 32, 2048)


def _case(t: int, h: int, i: int, experts: int, topk: int, fmt: str, device, dtype, label: str,
          ep: bool = False, act_format: str = "bf16", **launch) -> Case:
    def run():
        w = make_weights(experts + 1, h, i, fmt, dtype, device)
        r = make_routing(t, experts, topk, device)
        x = torch.randn(t, h, device=device, dtype=dtype)
        ids, emap = r.ids, None
        if ep:   # this rank holds the even experts (and the shared one): the odd ones are remote
            emap = torch.full((experts + 1,), -1, dtype=torch.int32, device=device)
            local = torch.arange(0, experts + 1, 2, device=device)
            emap[local] = torch.arange(local.numel(), dtype=torch.int32, device=device)
            emap[experts] = local.numel()
            keep = torch.cat([local, torch.tensor([experts], device=device)])
            w = {**w, **{k: w[k][keep] for k in ("w13", "w2", "w13_scale", "w2_scale") if k in w}}
        out = poison_(torch.empty(t, h, device=device, dtype=dtype))
        launcher.fused_moe(x, w["w13"], w["w2"], r.weights, ids, **m3_act(), w13_scale=w.get("w13_scale"),
                           w2_scale=w.get("w2_scale"), fmt=fmt, act_format=act_format, expert_map=emap,
                           output_scale=r.output_scale, out=out, **launch)
        ref_ids = ids if emap is None else torch.where(emap[ids.long()] >= 0, emap[ids.long()], -1)
        ref = fused_moe_ref(x.float(), w["w13"] if fmt != "bf16" else w["w13"].float(),
                            w["w2"] if fmt != "bf16" else w["w2"].float(), r.weights, ref_ids, **m3_act(),
                            w13_scale=w.get("w13_scale"), w2_scale=w.get("w2_scale"), fmt=fmt,
                            act_format=act_format, output_scale=r.output_scale)
        return out, ref
    return Case(f"T={t},H={h},I={i},E={experts}+1,k={topk}+1,{label}", str(dtype).removeprefix("torch."), run)


def _cases(fmt: str, device: torch.device):
    dtype = act_dtype(device)
    if device.type != "cuda":
        i = 64 if fmt != "bf16" else 48
        yield _case(1, 64, i, 6, 2, fmt, device, torch.float32, "fp32", config=CPU_CONFIG)
        yield _case(37, 64, i, 6, 2, fmt, device, dtype, "auto")
        yield _case(7, 64, i, 6, 2, fmt, device, dtype, "ep_half_remote", ep=True, config=CPU_CONFIG, order="expert")
        if fmt != "bf16":
            yield _case(7, 64, i, 6, 2, fmt, device, torch.float32, "act_mxfp8", act_format="mxfp8", config=CPU_CONFIG)
            yield _case(7, 64, i, 6, 2, fmt, device, dtype, "native_mx", config=CPU_CONFIG, use_native_mx=True)
        return
    for t in GPU_TS if fmt == "bf16" else GPU_TS[:2]:
        yield _case(t, M3_TP4["h"], M3_TP4["i"], M3_TP4["experts"], M3_TP4["topk"], fmt, device, dtype, "auto")
    yield _case(8, M3_TP4["h"], M3_TP4["i"], M3_TP4["experts"], M3_TP4["topk"], fmt, device, dtype,
                "order=expert", order="expert")
    # MXFP8 activations are gated in the interpreter in fp32 only: in bf16 a one-ulp difference of h (summation
    # order) flips ~0.5% of the E4M3 codes by a full step (2^-3), ~1% rel-RMS: the format's noise, not a kernel
    # error (H200, 2026-11-30: 1.4e-2 against the fp32 reference).


for _fmt in launcher.W_FORMATS:
    register(Gate(f"moe.{_fmt}", "moe", lambda d, f=_fmt: list(_cases(f, d)),
                  doc=f"grouped MoE (routing, alignment, gate_up+SwiGLU, down+combine) with {_fmt} weights "
                      "vs fused_moe_ref"))


# --- vLLM's own MoE kernel ------------------------------------------------------------------------------
def vllm_fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                   *, alpha: float, limit: float, beta: float, config: dict | None = None,
                   out: torch.Tensor | None = None, poison: bool = False) -> torch.Tensor:
    """vLLM's bf16 Triton MoE path (unquantised weights) on x [T, H], w13 [E, 2I, H], w2 [E, H, I] -> [T, H].

    config: vLLM's launch config (default: vLLM's own lookup, ``try_get_optimal_moe_config``; on a CPU,
    where vLLM has no device name, its ``get_default_config``). poison: NaN-fill the intermediates.
    """
    import triton.language as tl

    fm = vllm_module("vllm.model_executor.layers.fused_moe.fused_moe", "vLLM's fused_moe_kernel")
    act_mod = m3_module("amd.ops.swiglu_oai", "vLLM's SwiGLU-OAI")
    t, h = x.shape
    e, n2, _ = w13.shape
    k = ids.shape[1]
    if config is None:
        try:    # vLLM's lookup needs its platform's device name, which a CPU does not have
            config = fm.try_get_optimal_moe_config(tuple(w13.shape), tuple(w2.shape), k, None, t)
        except NotImplementedError:
            config = fm.get_default_config(t, e, w2.shape[2], h, k, None, None)
    if t * k * 4 <= e:                                  # vLLM's naive assignment (fused_moe.py:1569-1589)
        sorted_ids, expert_ids = None, ids.reshape(-1).to(torch.int32)
        num_post = torch.full((1,), ids.numel() * config["BLOCK_SIZE_M"], dtype=torch.int32, device=x.device)
    else:
        sorted_ids, expert_ids, num_post = align(ids, config["BLOCK_SIZE_M"], e)
    ct = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[x.dtype]
    flags = dict(compute_type=ct, use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False,
                 use_int4_w4a16=False, per_channel_quant=False)
    new = (lambda *s: poison_(torch.empty(*s, dtype=x.dtype, device=x.device))) if poison else \
        (lambda *s: torch.empty(*s, dtype=x.dtype, device=x.device))
    cache1 = new(t, k, n2)
    fm.invoke_fused_moe_triton_kernel(x, w13, cache1, None, None, weights, sorted_ids, expert_ids, num_post,
                                      False, k, config, **flags)
    act = act_mod.swiglu_oai_split(cache1.view(-1, n2), alpha, beta, limit)
    cache3 = new(t, k, h)
    fm.invoke_fused_moe_triton_kernel(act, w2, cache3, None, None, weights, sorted_ids, expert_ids, num_post,
                                      True, 1, config, **flags)
    return torch.sum(cache3, dim=1, out=out)


def _vllm_case(t: int, h: int, i: int, experts: int, topk: int, device, dtype) -> Case:
    def run():
        w = make_weights(experts + 1, h, i, "bf16", dtype, device)
        r = make_routing(t, experts, topk, device)
        x = torch.randn(t, h, device=device, dtype=dtype)
        out = poison_(torch.empty(t, h, device=device, dtype=dtype))
        vllm_fused_moe(x, w["w13"], w["w2"], r.weights, r.ids, **m3_act(), out=out, poison=True)
        ref = fused_moe_ref(x.float(), w["w13"].float(), w["w2"].float(), r.weights, r.ids, **m3_act())
        return out, ref
    return Case(f"T={t},H={h},I={i},E={experts}+1,k={topk}+1", str(dtype).removeprefix("torch."), run)


def _vllm_cases(device: torch.device):
    if device.type != "cuda":
        return [_vllm_case(1, 64, 48, 8, 1, device, torch.float32),      # naive assignment (T·k·4 <= E)
                _vllm_case(1, 64, 48, 6, 2, device, torch.float32),
                _vllm_case(37, 64, 48, 6, 2, device, torch.float16)]
    return [_vllm_case(t, M3_TP4["h"], M3_TP4["i"], M3_TP4["experts"], M3_TP4["topk"], device, torch.bfloat16)
            for t in (1, 128)]


register(Gate("vllm.fused_moe_kernel", "vllm_moe", _vllm_cases,
              doc="vLLM's Triton fused_moe_kernel (bf16 path, both GEMMs) with its SwiGLU-OAI vs fused_moe_ref"))
