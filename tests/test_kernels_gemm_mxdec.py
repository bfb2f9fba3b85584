"""The tensor-core MX decode kernel (kernels/gemm/gemm_mx_layout) through layout_launcher.linear_layout, in the CPU
interpreter: every E2M1/E4M3 code decoded exactly, odd N and K, fresh random inputs against linear_ref (fp16 MMA)
and against the x-quantised reference (fp8 MMA, vLLM's activation rule), NaN-poisoned outputs, repeated calls,
x far outside fp16's range, the routing by M and bad configs refused.

The interpreter runs the fp8 x fp8 ``tl.dot`` correctly (the fp8-MMA cases below match the x-quantised reference
to fp16 rounding); its fp32 -> e4m3 cast truncates, which the kernel's ROUND_X covers there.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels import launches  # noqa: E402
from kernels.gemm import layout_launcher  # noqa: E402
from kernels.gemm.reference import linear_ref, quantize_weight  # noqa: E402
from kernels.gemm.tables import DECODE_MAX_M, GemmConfig  # noqa: E402
from kernels.mx import decode_layout as dl  # noqa: E402
from kernels.mx.reference import dequantize_mxfp4, dequantize_mxfp8  # noqa: E402

KERNELS = [("mxfp4", "mxdec"), ("mxfp8", "mxdec"), ("mxfp8", "mxdec_fp8"), ("mxfp4", "mxdec_fold"),
           ("mxfp8", "mxdec_fold")]


def _ref(x, q, s, fmt, kernel):
    """linear_ref; the fp8-MMA kernel multiplies x quantised to MXFP8 per token (dl.quantize_x_mxfp8)."""
    xr = dl.quantize_x_mxfp8(x) if kernel == "mxdec_fp8" else x.float()
    return linear_ref(xr, q, w_format=fmt, w_scale=s)


def _run(x, dw, config):
    out = torch.full((x.shape[0], dw.codes.shape[0]), float("nan"), dtype=x.dtype)
    layout_launcher.linear_layout(x, dw, config=config, out=out)
    return out


@pytest.mark.parametrize("fmt,kernel", KERNELS)
def test_every_code_decodes_exactly(fmt, kernel):
    """One-hot activations read back each weight: every E2M1 nibble in both positions / every finite E4M3 byte, at
    scale bytes 124..130 per group (y = W exactly: all values are fp16-exact)."""
    n = 16 if fmt == "mxfp4" else 8                        # 16 rows x 16 bytes | 8 rows x 32 bytes: all 256 byte values
    b = torch.arange(256, dtype=torch.int32).reshape(n, -1)
    if fmt == "mxfp8":
        b = torch.where((b & 0x7F) == 0x7F, b ^ 1, b)     # the two NaN codes: never written by the quantiser
        q = torch.cat([b, b.flip(0)], 1).to(torch.uint8).view(torch.float8_e4m3fn)
        w = dequantize_mxfp8
    else:
        q = torch.cat([b, b.flip(0)], 1).to(torch.uint8)
        w = dequantize_mxfp4
    s = (124 + torch.arange(2 * n).reshape(n, 2) % 7).to(torch.uint8)
    x = torch.eye(64, dtype=torch.float16)[:32]            # x[m] = e_m: y[m, n] = W[n, m] for the first group
    x2 = torch.eye(64, dtype=torch.float16)[32:]           # the second group
    dw = dl.pack(q, s, fmt)
    ref = w(q, s)
    for xs, cols in ((x, slice(0, 32)), (x2, slice(32, 64))):
        y = _run(xs, dw, GemmConfig(kernel, 32, 16, 64, SPLIT_K=1))
        assert torch.equal(y.float(), ref[:, cols].t().contiguous())


@pytest.mark.parametrize("fmt,kernel", KERNELS)
@pytest.mark.parametrize("m,n,k,cfg", [(1, 80, 96, (16, 32, 64, 2)), (7, 100, 224, (16, 32, 64, 3)),
                                       (33, 64, 256, (64, 32, 64, 2)), (17, 96, 160, (32, 64, 128, 1))])
def test_random_inputs_match_the_reference(fmt, kernel, m, n, k, cfg):
    """Odd N, K = 32 x odd, M tiles partly filled, split-K with and without a partial last split, N % BLOCK_N == 0
    (the unmasked path) and not."""
    q, s = quantize_weight(torch.randn(n, k) / k**0.5, fmt)
    x = torch.randn(m, k, dtype=torch.float16)
    y = _run(x, dl.pack(q, s, fmt), GemmConfig(kernel, *cfg[:3], SPLIT_K=cfg[3]))
    ref = _ref(x, q, s, fmt, kernel)
    assert not torch.isnan(y).any()
    assert (y.float() - ref).norm() / ref.norm() < 1e-3      # fp16 output rounding: ~2e-4 measured


@pytest.mark.parametrize("fmt,kernel", KERNELS)
def test_repeated_calls_and_wide_activations(fmt, kernel):
    """bf16-valued fp32 x from 1e-30 to 1e6 per row (beyond fp16 both ways): the per-token power of two keeps the
    fp16 MMA exact;
    a second call into the same output (split-K counters reset by the reducing split) gives the same bits."""
    m, n, k = 4, 48, 128
    q, s = quantize_weight(torch.randn(n, k) / k**0.5, fmt)
    x = (torch.randn(m, k) * torch.tensor([1e-30, 1.0, 3e4, 1e6])[:, None]).bfloat16().float()
    dw = dl.pack(q, s, fmt)
    cfg = GemmConfig(kernel, 16, 16, 32, SPLIT_K=4)
    y1 = _run(x, dw, cfg)
    y2 = _run(x, dw, cfg)
    assert torch.equal(y1, y2)
    ref = _ref(x, q, s, fmt, kernel)
    err = ((y1 - ref).abs().amax(1) / ref.abs().amax(1)).max()      # per row (norms of 1e-31 underflow)
    assert err < (1e-3 if kernel == "mxdec_fp8" else 1e-5)   # fp32 output, fp16-exact x (fp8: x quantised)


@pytest.mark.parametrize("fmt,kernel", KERNELS)
def test_nan_in_x_reaches_its_row_only(fmt, kernel):
    q, s = quantize_weight(torch.randn(32, 64) / 8, fmt)
    x = torch.randn(3, 64, dtype=torch.float16)
    x[1, 5] = float("nan")
    y = _run(x, dl.pack(q, s, fmt), GemmConfig(kernel, 16, 16, 32, SPLIT_K=2))
    assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2]]).any()


def test_launcher_routes_by_m():
    """Without a table, M 1..DECODE_MAX_M: the folded-scale tensor-core kernel; beyond: unpacked to OCP MX
    (the tiled kernel's path); a forced gemv config reaches the CUDA-core layout kernel."""
    q, s = quantize_weight(torch.randn(40, 96) / 10, "mxfp4")
    dw = dl.pack(q, s, "mxfp4")
    seen = {}
    gemv = GemmConfig("gemv", 1, 16, 64)
    for m, cfg in ((1, None), (2, None), (DECODE_MAX_M, None), (DECODE_MAX_M + 1, None), (1, gemv)):
        x = torch.randn(m, 96, dtype=torch.float16)
        with launches.recording() as log:
            y = layout_launcher.linear_layout(x, dw, config=cfg)
        seen[m, cfg is None] = log
        ref = linear_ref(x.float(), q, w_format="mxfp4", w_scale=s)
        assert (y.float() - ref).norm() / ref.norm() < 1e-3
    assert seen[1, True] == seen[2, True] == seen[DECODE_MAX_M, True] == ["gemm_mx_fold_kernel"]
    assert seen[1, False] == ["gemv_mx_layout_kernel"]
    assert "gemm_mx_fold_kernel" not in seen[DECODE_MAX_M + 1, True]


def test_bad_config_is_refused():
    q, s = quantize_weight(torch.randn(8, 64), "mxfp4")
    x = torch.randn(2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="^config: kernel 'mxdec_fp8'"):
        layout_launcher.linear_layout(x, dl.pack(q, s, "mxfp4"), config=GemmConfig("mxdec_fp8", 16, 16, 32))
    with pytest.raises(ValueError, match="^config: kernel 'splitk'"):
        layout_launcher.linear_layout(x, dl.pack(q, s, "mxfp4"), config=GemmConfig("splitk", 16, 16, 32))


def test_activation_rule_is_vllms():
    """dl.quantize_x_mxfp8 (the fp8-MMA kernel's reference) equals vLLM's activation quantiser for MXFP8 linears
    (vllm/model_executor/layers/quantization/utils/mxfp8_utils.py:38, ``_mxfp8_e4m3_quantize_torch``), including
    all-zero blocks, blocks whose maximum sits at 448 * 2**e and just above it, and blocks 2**±30 apart."""
    from m3lab.vllm_src.imports import vllm_module
    mod = vllm_module("vllm.model_executor.layers.quantization.utils.mxfp8_utils", "vLLM's MXFP8 activation quantiser")
    x = torch.randn(6, 512) * torch.exp2(torch.randint(-30, 30, (6, 16)).float()).repeat_interleave(32, 1)
    x[0, :32] = 0
    x[1, :32] = 448.0
    x[1, 32:64] = 449.0
    x[2, :32] = torch.nextafter(torch.tensor(448.0), torch.tensor(1e9))
    x = x.to(torch.bfloat16)
    q, sc = mod._mxfp8_e4m3_quantize_torch(x)
    ref = (q.float().reshape(6, 16, 32) * torch.exp2(sc.float() - 127)[..., None]).reshape(6, 512)
    assert torch.equal(dl.quantize_x_mxfp8(x), ref)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_folded_scales_far_below_the_row_maximum(fmt):
    """mxdec_fold measures each group's scale from its row's largest (DecodeWeights.row_exp): groups 2**-6 below are
    exact, groups 2**-30 and 2**-40 below lose bits as fp16 subnormals (or vanish), each weight off by at most 2**-23
    of its row's largest |w| (one-hot x reads the weights back)."""
    n, k = 8, 128
    q, s = quantize_weight(torch.randn(n, k), fmt)
    s = s.clone()
    s[:, 0], s[:, 1], s[:, 2], s[:, 3] = 130, 124, 90, 100           # base r = 130; groups 2**-6, 2**-40, 2**-30
    dw = dl.pack(q, s, fmt)
    w = (dequantize_mxfp8 if fmt == "mxfp8" else dequantize_mxfp4)(q, s)
    y = torch.cat([_run(torch.eye(k, dtype=torch.float32)[i:i + 16], dw, GemmConfig("mxdec_fold", 16, 16, 128))
                   for i in range(0, k, 16)])                           # y[k, n] = W[n, k]
    err = (y - w.t()).abs()
    assert torch.equal(err[:64], torch.zeros_like(err[:64]))            # groups 0 and 1: exact
    assert (err <= 2.0**-23 * w.abs().amax(1)[None, :]).all()
