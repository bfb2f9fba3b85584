"""Gates for kernels/gemm: the launcher and each kernel vs ``linear_ref`` for every weight format.

CPU (interpreter): awkward small shapes (M 1/7/33; N, K not multiples of the tiles), fp16
activations, the auto config plus each kernel forced; the native-MX (``tl.dot_scaled``) path too
where the interpreter has it. CUDA: the MiniMax M3 TP4 shapes (the OpTable's, as the benchmark and the
tuner use them), bf16 activations, M from decode to prefill, the auto (tuned) config plus the other
regime's tiles.
"""
import torch
import triton

from ..kernels.gemm import launcher, layout_launcher
from ..kernels.gemm.tables import GemmConfig, regime_of
from ..kernels.gemm.reference import linear_ref, quantize_weight
from ..kernels.mx.decode_layout import pack
from ..optable.kernel_shapes import model_gemm_shapes
from .checks import poison_
from .inputs import act_dtype
from .registry import Case, Gate, register

GEMM_FORMATS = ("bf16", "fp8", "mxfp8", "mxfp4")
CPU_PROBLEMS = ((1, 80, 96), (7, 100, 160), (33, 40, 224))
CPU_CONFIGS = {"tiled": GemmConfig("tiled", 16, 32, 64, GROUP_M=2),
               "splitk": GemmConfig("splitk", 16, 32, 32, SPLIT_K=3),
               "splitk1": GemmConfig("splitk", 32, 64, 64, SPLIT_K=1),
               "persistent": GemmConfig("persistent", 16, 32, 64, GROUP_M=2, SPLIT_K=4),
               "streamk": GemmConfig("streamk", 16, 32, 32, GROUP_M=1, PER_SM=1),
               "streamk_atomic": GemmConfig("streamk", 32, 16, 32, GROUP_M=1, PER_SM=2, ATOMIC=True)}
GPU_MS = (1, 7, 33, 128, 2048)


def _interpreter_has_dot_scaled() -> bool:
    return tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 9)


def _case(fmt: str, m: int, n: int, k: int, device: torch.device, label: str, block_scales: bool = False,
          **launch) -> Case:
    dtype = act_dtype(device)

    def run():
        w0 = torch.randn(n, k, device=device) / k**0.5
        if block_scales:
            w, _ = quantize_weight(w0, "fp8")
            s = torch.rand(triton.cdiv(n, 128), triton.cdiv(k, 128), device=device) * 0.02 + 0.005
        else:
            w, s = quantize_weight(w0.to(dtype) if fmt == "bf16" else w0, fmt)
        x = torch.randn(m, k, device=device, dtype=dtype)
        out = poison_(torch.empty(m, n, device=device, dtype=dtype))
        launcher.linear(x, w, w_format=fmt, w_scale=s, out=out, **launch)
        return out, linear_ref(x.float(), w, w_format=fmt, w_scale=s)
    return Case(f"M={m},N={n},K={k},{label}", str(dtype).removeprefix("torch."), run)


def _cases(fmt: str, device: torch.device):
    if device.type != "cuda":
        for m, n, k in CPU_PROBLEMS:
            yield _case(fmt, m, n, k, device, "auto")
            for name, cfg in CPU_CONFIGS.items():
                yield _case(fmt, m, n, k, device, name, config=cfg)
            if fmt == "fp8":
                yield _case(fmt, m, n, k, device, "block_scales", block_scales=True)
                yield _case(fmt, m, n, k, device, "block_scales,persistent", block_scales=True,
                            config=CPU_CONFIGS["persistent"])
            if fmt.startswith("mx") and _interpreter_has_dot_scaled():
                yield _case(fmt, m, n, k, device, "native_mx", config=CPU_CONFIGS["splitk"], use_native_mx=True)
        return
    for n, k in model_gemm_shapes():
        for m in GPU_MS:
            yield _case(fmt, m, n, k, device, "auto")
            other = "prefill" if regime_of(m) == "decode" else "decode"
            yield _case(fmt, m, n, k, device, f"{other}_tiles", regime=other)
        if fmt == "fp8":          # block scales through the table's prefill kernel (the persistent one when tuned)
            yield _case(fmt, GPU_MS[-1], n, k, device, "block_scales", block_scales=True)


def _layout_case(fmt: str, m: int, n: int, k: int, device: torch.device, label: str,
                 config: GemmConfig | None = None) -> Case:
    """MX weights packed once into the decode layout (kernels/mx/decode_layout) through linear_layout, against the
    reference of the kernel it launches (the auto case included: a table may pick the fp8-MMA kernel, whose
    reference quantises x; layout_launcher.layout_linear_ref)."""
    dtype = act_dtype(device)

    def run():
        w, s = quantize_weight(torch.randn(n, k, device=device) / k**0.5, fmt)
        x = torch.randn(m, k, device=device, dtype=dtype)
        out = poison_(torch.empty(m, n, device=device, dtype=dtype))
        layout_launcher.linear_layout(x, pack(w, s, fmt), out=out, config=config)
        kernel = layout_launcher.layout_kernel(m, n, k, fmt, device, config)
        return out, layout_launcher.layout_linear_ref(x, w, s, fmt, kernel)
    return Case(f"M={m},N={n},K={k},{label}", str(dtype).removeprefix("torch."), run)


def _layout_kernels(fmt: str) -> tuple[str, ...]:
    return ("mxdec_fold", "mxdec", "mxdec_fp8") if fmt == "mxfp8" else ("mxdec_fold", "mxdec")


def _layout_cases(fmt: str, device: torch.device):
    if device.type != "cuda":
        for m, n, k in CPU_PROBLEMS:
            yield _layout_case(fmt, m, n, k, device, "auto")
            yield _layout_case(fmt, m, n, k, device, "split3", config=GemmConfig("gemv", 4, 16, 64, SPLIT_K=3))
            for kern in _layout_kernels(fmt):
                yield _layout_case(fmt, m, n, k, device, kern, config=GemmConfig(kern, 16, 32, 64, SPLIT_K=3))
        return
    for n, k in model_gemm_shapes():
        for m in (1, 7, 33):
            yield _layout_case(fmt, m, n, k, device, "auto")
        for kern in _layout_kernels(fmt):
            yield _layout_case(fmt, 7, n, k, device, kern, config=GemmConfig(kern, 16, 128, 128, SPLIT_K=4))


for _fmt in GEMM_FORMATS:
    register(Gate(f"gemm.{_fmt}", "gemm", lambda d, f=_fmt: list(_cases(f, d)),
                  doc=f"y = x @ Wᵀ with {_fmt} weights vs linear_ref"))


for _fmt in ("mxfp8", "mxfp4"):
    register(Gate(f"gemm.{_fmt}_layout", "gemm", lambda d, f=_fmt: list(_layout_cases(f, d)),
                  doc=f"y = x @ Wᵀ with {_fmt} weights in the decode layout vs linear_ref"))
