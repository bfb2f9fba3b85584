"""The MX decode layout (kernels/mx/decode_layout): exact round trips over every E2M1/E4M3 code, odd N and
K = 32 x odd, the bit-operation dequantisation against the OCP reference, and bad input refused."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.mx import decode_layout as dl  # noqa: E402
from kernels.mx.reference import dequantize_mxfp4, dequantize_mxfp8, quantize_mxfp4, quantize_mxfp8  # noqa: E402


def _every_code(n: int, k: int, w_format: str, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw MX weights whose bytes run through every value (mxfp8: all 256 E4M3 bytes; mxfp4: all 256 nibble
    pairs, i.e. every E2M1 code in both nibbles), scales over the layout's range incl. its extremes."""
    nbytes = n * (k if w_format == "mxfp8" else k // 2)
    b = (torch.arange(nbytes) * 37 + torch.randint(0, 256, (1,), generator=gen)) % 256
    q = b.to(torch.uint8).reshape(n, -1)
    if w_format == "mxfp8":
        q = q.view(torch.float8_e4m3fn)
    top = 254 - dl.C_SHIFT[w_format]
    s = torch.randint(100, 150, (n, k // 32), generator=gen, dtype=torch.int32)
    ext = torch.tensor([0, 1, 127, top], dtype=torch.int32)
    s.view(-1)[:4] = ext[:s.numel()]
    return q, s.to(torch.uint8)


@pytest.mark.parametrize("w_format", dl.FORMATS)
@pytest.mark.parametrize("n,k", [(1, 32), (7, 96), (33, 224), (64, 256)])
def test_round_trip_every_code(w_format, n, k):
    gen = torch.Generator().manual_seed(n * 1000 + k)
    q, s = _every_code(n, k, w_format, gen)
    if n * k >= 256 * (1 if w_format == "mxfp8" else 2):
        assert q.view(torch.uint8).unique().numel() == 256
    dw = dl.pack(q, s, w_format)
    assert dw.codes.shape == q.shape and dw.scales.shape == (k // 32, n) and dw.codes.dtype == torch.uint8
    q2, s2 = dl.unpack(dw)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s2, s)


@pytest.mark.parametrize("w_format", dl.FORMATS)
@pytest.mark.parametrize("n,k", [(7, 96), (33, 224), (64, 256)])
def test_bit_dequantisation_matches_the_reference(w_format, n, k):
    gen = torch.Generator().manual_seed(n + k)
    q, s = _every_code(n, k, w_format, gen)
    if w_format == "mxfp8":                                   # E4M3 NaN bytes: the layout decodes them as 480
        nan = (q.view(torch.uint8) & 0x7F) == 0x7F
        q = torch.where(nan, q.view(torch.uint8) ^ 1, q.view(torch.uint8)).view(torch.float8_e4m3fn)
        ref = dequantize_mxfp8(q, s)
    else:
        ref = dequantize_mxfp4(q, s)
    got = dl.dequantize(dl.pack(q, s, w_format))
    assert torch.equal(got, ref)                              # exact: both are code x 2**(s-127) in fp32


@pytest.mark.parametrize("w_format", dl.FORMATS)
def test_layout_of_quantised_weights_and_pairs(w_format):
    w = torch.randn(5, 64)
    q, s = (quantize_mxfp8 if w_format == "mxfp8" else quantize_mxfp4)(w)
    dw = dl.pack(q, s, w_format)
    ref = (dequantize_mxfp8 if w_format == "mxfp8" else dequantize_mxfp4)(q, s)
    assert torch.equal(dl.dequantize(dw), ref)
    # the documented word layout: mxfp4 word 0 low half = even elements, high half = odd ones
    e = torch.stack((q.view(torch.uint8) & 15, q.view(torch.uint8) >> 4), -1).reshape(5, 64).int() \
        if w_format == "mxfp4" else q.view(torch.uint8).int()
    word = dl._words(dw.codes)[0, 0].item() & 0xFFFFFFFF
    if w_format == "mxfp4":
        assert [(word >> (4 * p)) & 15 for p in range(4)] == e[0, 0:8:2].tolist()
        assert [(word >> (16 + 4 * p)) & 15 for p in range(4)] == e[0, 1:8:2].tolist()
    else:
        assert [(word >> (8 * i)) & 255 for i in range(4)] == e[0, [0, 2, 1, 3]].tolist()


def test_bad_input_is_refused():
    q, s = quantize_mxfp4(torch.randn(3, 64))
    with pytest.raises(ValueError, match="w_format"):
        dl.pack(q, s, "mxfp6")
    with pytest.raises(ValueError, match="^s: scale bytes"):
        dl.pack(q, torch.full_like(s, 255), "mxfp4")
    with pytest.raises(ValueError, match=r"^s: expected"):
        dl.pack(q, s[:, :1], "mxfp4")


def test_layout_gates_on_the_interpreter():
    """The decode-layout kernels (layout_launcher.linear_layout) vs linear_ref: odd N and K, split-K, M tiles; per problem
    the auto config, the gemv kernel and each tensor-core kernel (mxfp8 also on the fp8 MMA)."""
    from m3lab.gates.runner import run_gates
    df = run_gates("cpu", names=["gemm.mxfp8_layout", "gemm.mxfp4_layout"], perf=False)
    assert len(df) == 27 and df["passed"].all()


def test_layout_prefill_goes_through_the_mx_path():
    from kernels.gemm import layout_launcher
    from kernels.gemm.reference import linear_ref
    from kernels.gemm.tables import DECODE_MAX_M
    q, s = quantize_mxfp4(torch.randn(24, 64))
    x = torch.randn(DECODE_MAX_M + 3, 64, dtype=torch.float16)
    with __import__("kernels.launches", fromlist=["recording"]).recording() as log:
        y = layout_launcher.linear_layout(x, dl.pack(q, s, "mxfp4"))
    ref = linear_ref(x.float(), q, w_format="mxfp4", w_scale=s)
    assert "gemv_mx_layout_kernel" not in log and (y.float() - ref).norm() / ref.norm() < 2e-3
    with __import__("kernels.launches", fromlist=["recording"]).recording() as log:
        layout_launcher.linear_layout(x[:2], dl.pack(q, s, "mxfp4"))
    assert log == ["gemm_mx_fold_kernel"]
