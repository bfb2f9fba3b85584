"""MX (OCP v1.0) quantisation: exhaustive element codes, the E8M0 scale rule, saturation, rounding,
nibble order, round-trip error bounds; the Triton kernels (CPU interpreter) bit-exact vs the reference."""
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.kernels.mx import reference as ref  # noqa: E402
from m3lab.kernels.mx import triton_mx  # noqa: E402

E2M1 = {0: 0.0, 1: 0.5, 2: 1.0, 3: 1.5, 4: 2.0, 5: 3.0, 6: 4.0, 7: 6.0}


def e4m3_value(code: int) -> float:
    """Decode an E4M3 (fn) byte from the spec: bias 7, subnormals at exponent 0, 0x7F/0xFF NaN."""
    s, e, m = code >> 7, (code >> 3) & 15, code & 7
    mag = (m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -mag if s else mag


FINITE_E4M3 = [c for c in range(256) if c & 0x7F != 0x7F]


def _quant(fmt: str, x: torch.Tensor, impl: str):
    return ref.QUANTIZE[fmt](x) if impl == "reference" else triton_mx.quantize(x, fmt)


def test_e4m3_code_table_known_values():
    assert e4m3_value(0x38) == 1.0 and e4m3_value(0x7E) == 448.0 and e4m3_value(0x01) == 2.0**-9
    codes = torch.tensor(FINITE_E4M3, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    assert codes.tolist() == [e4m3_value(c) for c in FINITE_E4M3]


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_e4m3_every_code_quantises_to_itself(impl):
    # each row holds 448 (amax -> shared exponent floor(log2 448) - 8 = 0, scale byte 127) and 31 codes
    vals = [e4m3_value(c) for c in FINITE_E4M3]
    rows = [[448.0] + vals[i:i + 31] for i in range(0, len(vals), 31)]
    rows[-1] += [448.0] * (32 - len(rows[-1]))
    x = torch.tensor(rows)
    q, s = _quant("mxfp8", x, impl)
    assert (s == 127).all()
    expect = [[0x7E] + FINITE_E4M3[i:i + 31] for i in range(0, len(vals), 31)]
    expect[-1] += [0x7E] * (32 - len(expect[-1]))
    assert q.view(torch.uint8).tolist() == expect


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_e2m1_every_code_and_nibble_order(impl):
    # block: 6 (amax -> exponent floor(log2 6) - 2 = 0), then codes 0..15 in order, then padding 6.
    vals = [6.0] + [E2M1[c & 7] * (-1 if c & 8 else 1) for c in range(16)] + [6.0] * 15
    x = torch.tensor([vals])
    x[0, 9] = -0.0                                   # code 8 is -0: sign kept only where v < 0, so expect +0
    packed, s = _quant("mxfp4", x, impl)
    assert s.tolist() == [[127]]
    codes = ref.unpack_e2m1(packed)[0].tolist()
    assert codes[1:17] == [c if c != 8 else 0 for c in range(16)]
    assert codes[0] == 7
    # first element in the low nibble: bytes are (element 2j) | (element 2j+1) << 4
    assert packed[0, 0].item() == 7 | (0 << 4) and packed[0, 1].item() == 1 | (2 << 4)


@pytest.mark.parametrize("fmt,emax", [("mxfp8", 8), ("mxfp4", 2)])
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_scale_is_floor_log2_amax_minus_emax(fmt, emax, impl):
    amaxes = [1.0, 0.999, 1.5, 448.0, 3.0e-3, 6.0, 2.0**20 * 1.7, 1e-30]
    x = torch.rand(len(amaxes), 32) * torch.tensor(amaxes)[:, None] * 0.99
    x[:, 7] = -torch.tensor(amaxes)                  # the sign does not matter
    _, s = _quant(fmt, x, impl)
    expect = [max(-127, math.floor(math.log2(a)) - emax) + 127 for a in amaxes]
    assert s[:, 0].tolist() == expect


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_saturation(impl):
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1] = 511.0, -500.0                 # scaled to [256, 512): above 448 saturates
    x[0, 32], x[0, 33] = 7.9, -7.0                   # for E2M1 block 2: above 6 saturates
    q8, s8 = _quant("mxfp8", x, impl)
    assert s8[0, 0].item() == 127 and q8[0, :2].float().tolist() == [448.0, -448.0]
    q4, s4 = _quant("mxfp4", x, impl)
    d4 = ref.dequantize_mxfp4(q4, s4)
    assert s4[0, 1].item() == 127 and d4[0, 32:34].tolist() == [6.0, -6.0]


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_round_to_nearest_even_and_negative_zero(impl):
    x = torch.full((1, 32), 448.0)
    ties = [272.0, 304.0, -272.0, 3 * 2.0**-10, 2.0**-10, -1e-30, -0.0]
    x[0, 1:1 + len(ties)] = torch.tensor(ties)
    q, _ = _quant("mxfp8", x, impl)
    got = q.view(torch.uint8)[0, 1:1 + len(ties)]
    assert q[0, 1:5].float().tolist() == [256.0, 320.0, -256.0, 2 * 2.0**-9]
    assert got[4:].tolist() == [0x00, 0x80, 0x80]    # 2^-10 ties to 0; negatives round to -0
    y = torch.full((1, 32), 6.0)
    y[0, 1:8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    p, _ = _quant("mxfp4", y, impl)
    assert ref.dequantize_mxfp4(p, torch.tensor([[127]], dtype=torch.uint8))[0, 1:8].tolist() == \
        [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_nan_block_gets_nan_scale():
    x = torch.randn(2, 64)
    x[0, 3] = float("nan")
    for fmt in ("mxfp8", "mxfp4"):
        q, s = ref.QUANTIZE[fmt](x)
        assert s[0, 0].item() == 255 and s[0, 1].item() != 255
        assert torch.isnan(ref.DEQUANTIZE[fmt](q, s)[0, :32]).all()


@pytest.mark.parametrize("fmt,rms,bound", [("mxfp8", 0.04, 4), ("mxfp4", 0.16, 2)])
def test_round_trip_error_bounds(fmt, rms, bound):
    x = torch.randn(64, 256) * torch.exp2(torch.randint(-10, 10, (64, 8, 1)).float()).repeat_interleave(32, 2).reshape(64, 256)
    q, s = ref.QUANTIZE[fmt](x)
    y = ref.DEQUANTIZE[fmt](q, s)
    assert ((y - x).norm() / x.norm()).item() < rms
    amax = x.abs().reshape(64, 8, 32).amax(-1, keepdim=True)
    # worst case is saturation of the top binade: |err| <= 2**floor(log2 amax) / bound
    top = torch.exp2(torch.floor(torch.log2(amax)))
    assert ((y - x).abs().reshape(64, 8, 32) <= top / bound).all()


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("rows,k", [(1, 32), (7, 96), (19, 160)])
def test_triton_matches_reference_bit_exact(fmt, rows, k):
    e = torch.randint(-20, 20, (rows, k // 32, 1)).float()
    x = (torch.randn(rows, k // 32, 32) * torch.exp2(e)).reshape(rows, k)
    q, s = triton_mx.quantize(x, fmt)
    q_ref, s_ref = ref.QUANTIZE[fmt](x)
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    y = triton_mx.dequantize(q, s, fmt)
    assert torch.equal(y, ref.DEQUANTIZE[fmt](q_ref, s_ref))


def test_k_must_be_a_multiple_of_32():
    with pytest.raises(ValueError, match="multiple of the MX block size"):
        ref.quantize_mxfp8(torch.randn(2, 48))
    with pytest.raises(ValueError, match="multiple of the MX block size"):
        triton_mx.quantize(torch.randn(2, 40), "mxfp4")
