"""The stream-K decode kernel (kernels/gemm/gemm_streamk.py) on the CPU interpreter: every weight format against
``linear_ref`` on fresh random inputs, shapes that are not multiples of the tiles, NaN-poisoned outputs, every
way a program's step range can meet the tiles (inside one tile, across several, whole tiles only), the arrival
counters reset for the next call, and the config checks."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.gates.checks import TOLERANCES, rel_rms  # noqa: E402
from m3lab.kernels import counters  # noqa: E402
from m3lab.kernels.gemm import launcher  # noqa: E402
from m3lab.kernels.gemm.reference import linear_ref, quantize_weight  # noqa: E402
from m3lab.kernels.gemm.tables import GemmConfig  # noqa: E402
from m3lab.kernels.launches import recording  # noqa: E402

FP16 = TOLERANCES["float16"]
SMS = launcher._sm_count(torch.device("cpu"))


def _problem(fmt, m, n, k, gen):
    w0 = torch.randn(n, k, generator=gen) / k**0.5
    w, s = quantize_weight(w0.half() if fmt == "bf16" else w0, fmt)
    return torch.randn(m, k, generator=gen).half(), w, s


def _run(x, w, s, fmt, cfg):
    y = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype)
    with recording() as launched:
        launcher.linear(x, w, w_format=fmt, w_scale=s, config=cfg, out=y)
    assert launched == ["gemm_streamk_kernel"]
    assert not y.isnan().any(), "an output element was not written"
    return y


# (M, N, K, config): programs = PER_SM x SMs (4 on the CPU), capped at the K-steps
CASES = [
    (5, 72, 224, GemmConfig("streamk", 16, 32, 32, GROUP_M=1, PER_SM=1)),   # 3 tiles x 7 steps over 4 programs
    (37, 40, 96, GemmConfig("streamk", 64, 16, 32, GROUP_M=1, PER_SM=2)),   # 3 tiles x 3 steps over 8 programs
    (19, 100, 64, GemmConfig("streamk", 16, 16, 32, GROUP_M=1, PER_SM=1)),  # 14 tiles x 2 steps: whole tiles too
    (3, 24, 480, GemmConfig("streamk", 16, 16, 32, GROUP_M=1, PER_SM=2)),   # 2 tiles x 15 steps: ranges inside a tile
]


@pytest.mark.parametrize("m,n,k,cfg", CASES)
def test_streamk_bf16_weights_match_reference(m, n, k, cfg):
    gen = torch.Generator().manual_seed(m * 1000 + n)
    x, w, s = _problem("bf16", m, n, k, gen)
    y = _run(x, w, s, "bf16", cfg)
    assert rel_rms(y, linear_ref(x.float(), w)) <= FP16


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "fp8"])
def test_streamk_quantised_weights_match_reference(fmt):
    gen = torch.Generator().manual_seed(7)
    x, w, s = _problem(fmt, 9, 50, 256, gen)
    y = _run(x, w, s, fmt, CASES[0][3])
    assert rel_rms(y, linear_ref(x.float(), w, w_format=fmt, w_scale=s)) <= FP16


def test_streamk_counters_reset_and_repeat_calls_agree():
    gen = torch.Generator().manual_seed(3)
    x, w, s = _problem("bf16", 5, 72, 224, gen)
    cfg = CASES[0][3]
    first = _run(x, w, s, "bf16", cfg)
    assert int(launcher._locks(torch.device("cpu"), 1)[:16].abs().sum()) == 0
    second = _run(x, w, s, "bf16", cfg)
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_streamk_catches_a_dropped_contributor():
    """The reduction must add every program that touched a tile: with the steps of one program's first segment
    zeroed (its weights), the output changes in that tile only if the reducer reads that partial."""
    gen = torch.Generator().manual_seed(11)
    x, w, s = _problem("bf16", 5, 72, 224, gen)
    cfg = CASES[0][3]
    y = _run(x, w, s, "bf16", cfg)
    w2 = w.clone()
    w2[:32, 96:128] = 0                               # tile 0, K-step 3: program 0 holds it, program 1 shares the tile
    y2 = _run(x, w2, s, "bf16", cfg)
    assert rel_rms(y2, linear_ref(x.float(), w2)) <= FP16
    assert (y2[:, :32] - y[:, :32]).abs().max() > 1e-3


def test_streamk_config_checks():
    with pytest.raises(ValueError, match="PER_SM"):
        GemmConfig("streamk", 16, 32, 32)
    with pytest.raises(ValueError, match="PER_SM"):
        GemmConfig("splitk", 16, 32, 32, PER_SM=2)
    cfg = GemmConfig("streamk", 32, 64, 128, GROUP_M=1, PER_SM=2, num_warps=8, num_stages=4)
    assert GemmConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("m", [1, 5])
def test_persistent_kernel_at_decode_m(m):
    """The persistent kernel forced at decode M with BLOCK_M covering M (every tile stream-K, as the tiles are
    fewer than the SMs): a row tile mostly past M, N not a multiple of BLOCK_N."""
    gen = torch.Generator().manual_seed(m)
    x, w, s = _problem("bf16", m, 72, 256, gen)
    y = torch.full((m, 72), float("nan"), dtype=x.dtype)
    launcher.linear(x, w, config=GemmConfig("persistent", 16, 32, 64, 1, 2, 4, 3), out=y)
    assert not y.isnan().any() and rel_rms(y, linear_ref(x.float(), w)) <= FP16


@pytest.mark.parametrize("m,n,k,cfg", CASES[:2] + CASES[3:])
def test_streamk_atomic_sums_match_reference_and_rest_at_zero(m, n, k, cfg):
    """ATOMIC: partials added into the tile's fp32 sum; after each call the sums and counters are zero again."""
    from dataclasses import replace
    gen = torch.Generator().manual_seed(m + n + k)
    x, w, s = _problem("bf16", m, n, k, gen)
    cfg = replace(cfg, ATOMIC=True)
    for _ in range(2):
        y = _run(x, w, s, "bf16", cfg)
        assert rel_rms(y, linear_ref(x.float(), w)) <= FP16
        assert float(launcher._SUMS[torch.device("cpu")].abs().sum()) == 0.0
        assert int(launcher._locks(torch.device("cpu"), 1)[:64].abs().sum()) == 0


def test_outgrown_workspaces_stay_alive_for_captured_graphs():
    """A CUDA graph captured at one batch size keeps the address of the counters / ATOMIC sums it used; when a
    larger problem needs a larger buffer, the old one must not be freed (its memory would be reused under the graph)."""
    dev = torch.device("cpu")
    pool: dict = {}
    small = counters.zeroed(pool, dev, 10, torch.float32)
    assert counters.zeroed(pool, dev, 4096, torch.float32) is small          # fits: the same buffer
    big = counters.zeroed(pool, dev, 5000, torch.float32)
    assert big.numel() >= 2 * small.numel() and float(big.abs().sum()) == 0.0
    assert any(b is small for b in counters.OUTGROWN)
