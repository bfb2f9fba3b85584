"""Gates for vLLM's own MiniMax M3 activation and norm kernels (amd/ops), against m3lab's references.

- ``vllm.swiglu_oai_split`` (``amd/ops/swiglu_oai.py:30-65,187-227``) vs ``kernels/moe/reference.swiglu_oai``;
- ``vllm.swiglu_oai_quantize_mxfp8`` (``amd/ops/swiglu_oai.py:68-184``): SwiGLU-OAI + per-32 MXFP8 in one
  pass. Its E8M0 rule is ``ceil(log2(amax / 448))`` (:data:`E8M0_RULE`), not the OCP rule ``floor(log2 amax) - 8`` of
  ``kernels/mx``: the two differ by exactly one step wherever a block's amax mantissa exceeds 1.75 (the
  OCP rule saturates those blocks' top elements at 448, vLLM's keeps them and loses a bit everywhere
  else). That is a documented finding: the scales are checked exactly against vLLM's rule applied to
  m3lab's reference activation, and the gate output states how many blocks differ from the OCP rule and
  what each rule's quantisation error is. The element codes are checked exactly against round-to-nearest-
  even of act·2^-e; in the CPU interpreter, whose fp32 -> e4m3 cast drops round-up carries and truncates
  subnormals, the elements where that matters are left out and counted.
- ``vllm.gemma_rmsnorm`` / ``vllm.gemma_fused_add_rmsnorm`` (``amd/ops/gemma_rmsnorm.py:27-146``) vs
  ``m3lab.model.layers.gemma_rms_norm`` (the fused add's sum taken in fp32, as vLLM's kernel does).

vLLM's wrappers allocate their outputs; each call runs with the module's ``torch.empty`` returning
NaN-filled tensors, so an unwritten element fails. CPU: interpreter, fp32 and fp16; CUDA: bf16, M3 shapes.
vLLM is imported through ``m3lab.vllm_src.imports`` (the module, not the re-exported function: pitfall 6).
"""
import contextlib

import torch

from ..kernels.moe.reference import swiglu_oai
from ..kernels.mx import reference as mx
from ..kernels.mx.reference import pow2
from ..model.layers import gemma_rms_norm
from ..optable.kernel_shapes import rank_dims
from ..vllm_src.imports import m3_module
from .checks import poison_
from .moe import m3_act
from .registry import Case, Gate, register

EPS = 1e-6
E4M3_MAX = 448.0
CPU_ROWS = (1, 37)
CPU_DTYPES = (torch.float32, torch.float16)


def _mod(name: str):
    return m3_module(name, f"the vllm.* gates ({name})")


class _PoisonedTorch:
    """Stands in for ``torch`` inside a vLLM module: ``empty`` returns poisoned tensors, the rest is torch."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        return poison_(torch.empty(*args, **kwargs))


@contextlib.contextmanager
def poisoned_outputs(module):
    real = module.torch
    module.torch = _PoisonedTorch()
    try:
        yield
    finally:
        module.torch = real


def _dtypes(device):
    return (torch.bfloat16,) if device.type == "cuda" else CPU_DTYPES


def _rows(device):
    return (1, 2048) if device.type == "cuda" else CPU_ROWS


def _label(dtype) -> str:
    return str(dtype).removeprefix("torch.")


# --- SwiGLU-OAI -------------------------------------------------------------------------------------
def _gate_up(m: int, inter: int, dtype, device) -> torch.Tensor:
    """[m, 2I] pre-activations spread past the clamp (|g|, |u| up to ~15)."""
    return (torch.randn(m, 2 * inter, device=device) * 4).to(dtype)


def _swiglu_case(m: int, inter: int, dtype, device) -> Case:
    def run():
        mod = _mod("amd.ops.swiglu_oai")
        g = _gate_up(m, inter, dtype, device)
        with poisoned_outputs(mod):
            a = m3_act()
            out = mod.swiglu_oai_split(g, a["alpha"], a["beta"], a["limit"])
        return out, swiglu_oai(g.float(), **m3_act())
    return Case(f"M={m},I={inter},{_label(dtype)}", _label(dtype), run)


# where vLLM states the rule (located in the installed source by m3lab.vllm.cite; a test checks it)
E8M0_RULE = ("models/minimax_m3/amd/ops/swiglu_oai.py", "_swiglu_oai_quant_kernel",
             "sb = tl.minimum(tl.maximum(tl.ceil(tl.log2(amax / FP8_MAX)) + 127.0, 0.0), 254.0)")


def ceil_rule_scale(act: torch.Tensor) -> torch.Tensor:
    """vLLM's E8M0 byte per 32 (:data:`E8M0_RULE`, the ``sb = ...`` line of ``_swiglu_oai_quant_kernel``):
    clamp(ceil(log2(max(amax, tiny)/448)) + 127, 0, 254). act fp32 [M, I] -> uint8 [M, I/32]."""
    amax = act.reshape(*act.shape[:-1], -1, 32).abs().amax(-1).clamp(min=torch.finfo(torch.float32).tiny)
    return (torch.ceil(torch.log2(amax / E4M3_MAX)) + 127).clamp(0, 254).to(torch.uint8)


def _scaled(act: torch.Tensor, byte: torch.Tensor) -> torch.Tensor:
    """act / 2^(byte-127) per 32 (exact power-of-two scaling), fp32 [M, I]."""
    e = byte.to(torch.int32) - 127
    return (act.reshape(*act.shape[:-1], -1, 32) * pow2(-e)[..., None]).reshape(act.shape)


def _quant_cases(m: int, inter: int, dtype, device):
    state: dict = {}

    def run_vllm():
        if "q" not in state:
            mod = _mod("amd.ops.swiglu_oai")
            g = _gate_up(m, inter, dtype, device)
            with poisoned_outputs(mod):
                state["q"], state["s"] = mod.swiglu_oai_quantize_mxfp8(g, **m3_act())
            state["act"] = swiglu_oai(g.float(), **m3_act())
        return state

    def scales():
        st = run_vllm()
        return st["s"], ceil_rule_scale(st["act"])

    def scale_finding() -> str:
        st = state
        ocp_q, ocp_s = mx.quantize_mxfp8(st["act"])
        ref_s = ceil_rule_scale(st["act"])
        diff = ref_s.int() - ocp_s.int()
        ref_q = _scaled(st["act"], ref_s).to(torch.float8_e4m3fn)
        a = st["act"].double()
        err = lambda q, s: ((mx.dequantize_mxfp8(q, s).double() - a).norm() / a.norm()).item()  # noqa: E731
        return (f"vLLM's E8M0 rule ceil(log2(amax/448)) vs OCP floor(log2 amax)-8 (kernels/mx): "
                f"{(diff != 0).double().mean().item():.1%} of {diff.numel()} blocks one step higher "
                f"(steps seen: {sorted(set(diff.unique().tolist()))}); rel-RMS quantisation error vs the fp32 "
                f"activation: vLLM rule {err(ref_q, ref_s):.4f}, OCP rule {err(ocp_q, ocp_s):.4f}")

    def codes():
        st = run_vllm()
        x = _scaled(st["act"], st["s"])                   # with vLLM's own scales
        ref = x.to(torch.float8_e4m3fn)
        got = st["q"]
        keep = torch.ones_like(x, dtype=torch.bool)
        if device.type != "cuda":   # interpreter cast: no round-up carry into the next binade, subnormals truncated
            r = ref.float().abs()
            carry = (r > x.abs()) & (torch.frexp(r)[0] == 0.5)
            keep = ~carry & (x.abs() >= 2.0 ** -6)
            state["left_out"] = 1.0 - keep.double().mean().item()
        return got.view(torch.uint8)[keep], ref.view(torch.uint8)[keep]

    def code_finding() -> str:
        return (f"{state['left_out']:.1%} of elements not compared: the CPU interpreter's fp32->e4m3 cast drops "
                "round-up carries and truncates subnormals")

    name = f"M={m},I={inter},{_label(dtype)}"
    yield Case(name + ",scales", "uint8", scales, exact=True, finding=scale_finding)
    yield Case(name + ",codes", "uint8", codes, exact=True,
               finding=code_finding if device.type != "cuda" else None)


# --- Gemma RMSNorm ------------------------------------------------------------------------------------
def _norm_case(m: int, n: int, dtype, device, fused: bool, part: int = 0, strided: bool = False) -> Case:
    def run():
        mod = _mod("amd.ops.gemma_rmsnorm")
        x = torch.randn(m, 2 * n if strided else n, device=device).to(dtype)
        x = x[:, ::2] if strided else x                    # a non-contiguous view, as vLLM's q/k slices
        w = (0.1 * torch.randn(n, device=device)).to(dtype)
        if not fused:
            with poisoned_outputs(mod):
                out = mod.gemma_rmsnorm(x, w, EPS)
            return out, gemma_rms_norm(x.float(), w, EPS)
        r = torch.randn(m, n, device=device).to(dtype)
        with poisoned_outputs(mod):
            outs = mod.gemma_fused_add_rmsnorm(x, r, w, EPS)
        s = x.float() + r.float()
        return outs[part], (gemma_rms_norm(s, w, EPS), s)[part]
    what = ("out", "residual_out")[part] if fused else ("strided" if strided else "")
    return Case(",".join(p for p in (f"M={m},N={n},{_label(dtype)}", what) if p), _label(dtype), run)


def _norm_shapes(device):
    # M3 TP4: hidden (pre-attention / pre-FFN norms); head_dim (q/k/index norms, one row per head)
    d = rank_dims("minimax-m3", tp=4)
    return ((1, d.hidden), (160, d.hidden), (2048, d.head_dim)) if device.type == "cuda" else ((1, 96), (37, 100))


def _swiglu_cases(device):
    d = rank_dims("minimax-m3", tp=4)     # M3 TP4: a routed expert's and the dense MLP's widths
    inters = (d.expert_inter, d.dense_inter) if device.type == "cuda" else (96,)
    return [_swiglu_case(m, i, d, device) for d in _dtypes(device) for m in _rows(device) for i in inters]


def _quant_all(device):
    inters = (rank_dims("minimax-m3", tp=4).expert_inter,) if device.type == "cuda" else (96,)
    return [c for d in _dtypes(device) for m in _rows(device) for i in inters for c in _quant_cases(m, i, d, device)]


def _norm_cases(device, fused: bool):
    cases = []
    for d in _dtypes(device):
        for m, n in _norm_shapes(device):
            if fused:
                cases += [_norm_case(m, n, d, device, True, part) for part in (0, 1)]
            else:
                cases.append(_norm_case(m, n, d, device, False))
        if not fused:
            cases.append(_norm_case(5, 128, d, device, False, strided=True))
    return cases


register(Gate("vllm.swiglu_oai_split", "vllm_swiglu", _swiglu_cases,
              doc="vLLM's SwiGLU-OAI (split layout) vs kernels/moe/reference.swiglu_oai"))
register(Gate("vllm.swiglu_oai_quantize_mxfp8", "vllm_swiglu_quant", _quant_all,
              doc="vLLM's SwiGLU-OAI + MXFP8: scales exact to its ceil rule (finding: vs OCP), codes exact"))
register(Gate("vllm.gemma_rmsnorm", "vllm_norm", lambda d: _norm_cases(d, False),
              doc="vLLM's Gemma RMSNorm vs m3lab.model.layers.gemma_rms_norm"))
register(Gate("vllm.gemma_fused_add_rmsnorm", "vllm_norm", lambda d: _norm_cases(d, True),
              doc="vLLM's fused add + Gemma RMSNorm: normed output and residual sum"))
