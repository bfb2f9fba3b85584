"""The persistent prefill GEMM (kernels/gemm/gemm_persistent.py) on the CPU interpreter: tensor-descriptor and
pointer paths on shapes that are not multiples of the tile, the program order and tail split of
``launcher.persistent_plan``, the tail's partials and counters, and the formats the launcher routes to it."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.gates.checks import TOLERANCES, rel_rms  # noqa: E402
from m3lab.kernels.gemm import launcher  # noqa: E402
from m3lab.kernels.gemm.tables import GemmConfig  # noqa: E402
from m3lab.kernels.gemm.reference import FP8_BLOCK, linear_ref, quantize_weight  # noqa: E402

FP16, FP32 = TOLERANCES["float16"], TOLERANCES["float32"]


def _cfg(bm=32, bn=64, bk=32, group=3, split=4, **kw):
    return GemmConfig("persistent", bm, bn, bk, group, split, **kw)


def _run(x, w, cfg, **kw):
    """launcher.linear into a NaN-poisoned output."""
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype)
    launcher.linear(x, w, config=cfg, out=out, **kw)
    return out


def _grouped_tiles(m, n, bm, bn, group):
    """Program order of tiles.grouped_tile: tile id -> (i_m, i_n)."""
    n_m, n_n = -(-m // bm), -(-n // bn)
    out = []
    for pid in range(n_m * n_n):
        first = (pid // (group * n_n)) * group
        size = min(n_m - first, group)
        out.append((first + (pid % (group * n_n)) % size, (pid % (group * n_n)) // size))
    return out


@pytest.mark.parametrize("use_tma", [None, False])
@pytest.mark.parametrize("m,n,k,dtype", [(300, 200, 136, torch.float16), (5, 72, 64, torch.float16),
                                         (97, 40, 48, torch.float32)])
def test_persistent_matches_reference(m, n, k, dtype, use_tma):
    """Partial row, column and K tiles; fewer tiles than programs (M 5); descriptors (default) and pointers."""
    x, w = torch.randn(m, k, dtype=dtype), (torch.randn(n, k) / k**0.5).to(dtype)
    y = _run(x, w, _cfg(use_tma is None and 64 or 32, 64, 32, USE_TMA=use_tma))
    assert rel_rms(y, linear_ref(x, w)) <= (FP16 if dtype == torch.float16 else FP32)


def test_plan_splits_only_the_last_partial_wave():
    cfg = _cfg(128, 128, 64, split=8)
    p = launcher.persistent_plan(2048, 2304, 6144, cfg, 132)      # 288 tiles = 2 waves + 24
    assert (p.programs, p.n_whole, p.n_tail, p.tail_split) == (132, 264, 24, 5)
    assert p.tail_split * p.k_split >= 6144 > (p.tail_split - 1) * p.k_split and p.k_split % 64 == 0
    assert launcher.persistent_plan(2048, 2304, 6144, _cfg(128, 128, 64, split=2), 132).tail_split == 2
    assert launcher.persistent_plan(2048, 2304, 6144, _cfg(128, 128, 64, split=1), 132).n_tail == 0
    whole = launcher.persistent_plan(128 * 12, 128 * 11, 6144, cfg, 132)    # 132 tiles: one whole wave
    assert (whole.n_whole, whole.n_tail) == (132, 0)
    few = launcher.persistent_plan(256, 256, 6144, cfg, 132)               # 4 tiles: 4 programs, no tail
    assert (few.programs, few.n_whole, few.n_tail) == (4, 4, 0)
    short_k = launcher.persistent_plan(2048, 2304, 128, cfg, 132)         # 2 K steps: at most 2 ranges
    assert short_k.tail_split == 2 and short_k.k_split == 64
    busy = launcher.persistent_plan(2048, 2560, 6144, cfg, 132)           # 320 tiles: 56 left, 2 ranges each
    assert (busy.n_tail, busy.tail_split) == (56, 2) and busy.n_tail * busy.tail_split <= busy.programs


def test_tail_split_writes_the_tail_tiles(monkeypatch):
    """Six programs, 20 tiles: 18 whole, the 2 tail tiles in 3 K ranges (64, 64, 8 columns). Without the tail
    loop those tiles stay NaN; without the reduction of every partial they are wrong. Repeated calls on
    fresh inputs: the counters are back at zero after each."""
    monkeypatch.setattr(launcher, "CPU_PROGRAMS", 6)
    m, n, k = 300, 200, 136
    cfg = _cfg(64, 64, 32, group=2, split=4)
    p = launcher.persistent_plan(m, n, k, cfg, 6)
    assert (p.n_whole, p.n_tail, p.tail_split, p.k_split) == (18, 2, 3, 64)
    order = _grouped_tiles(m, n, 64, 64, 2)
    for _ in range(3):
        x, w = torch.randn(m, k, dtype=torch.float16), (torch.randn(n, k) / k**0.5).half()
        y, ref = _run(x, w, cfg), linear_ref(x, w)
        for i_m, i_n in order[p.n_whole:]:
            rows, cols = slice(64 * i_m, 64 * i_m + 64), slice(64 * i_n, 64 * i_n + 64)
            assert rel_rms(y[rows, cols], ref[rows, cols]) <= FP16, (i_m, i_n)
        assert rel_rms(y, ref) <= FP16
        assert int(launcher._LOCKS[x.device].abs().sum()) == 0


def test_unaligned_operands_take_the_pointer_path():
    """K 100 in fp16 is a 200-byte row stride: no tensor descriptor; a column-strided view neither."""
    x, w = torch.randn(33, 100, dtype=torch.float16), (torch.randn(24, 100) / 10).half()
    assert not launcher._tma_aligned(x, w)
    assert rel_rms(_run(x, w, _cfg()), linear_ref(x, w)) <= FP16
    xt = torch.randn(64, 33, dtype=torch.float16).T                      # [33, 64], stride (1, 33)
    assert not launcher._tma_aligned(xt) and launcher._tma_aligned(xt.contiguous())
    w2 = (torch.randn(24, 64) / 8).half()
    assert rel_rms(_run(xt, w2, _cfg()), linear_ref(xt, w2)) <= FP16


def test_weight_formats_routed_to_the_persistent_kernel(monkeypatch):
    """fp8 and MX weights are dequantised to x's dtype first (DEQUANT_PREFILL); without it, fp8 per channel runs
    in the kernel (scale per output column)."""
    m, n, k = 70, 50, 128
    x = torch.randn(m, k, dtype=torch.float16)
    for fmt in ("fp8", "mxfp8", "mxfp4"):
        wq, s = quantize_weight(torch.randn(n, k) / k**0.5, fmt)
        assert launcher.launch_config(m, n, k, fmt, x.device, config=_cfg(), use_native_mx=True)[1] == "bf16"
        y = _run(x, wq, _cfg(), w_format=fmt, w_scale=s)
        assert rel_rms(y, linear_ref(x, wq, w_format=fmt, w_scale=s)) <= FP16, fmt
    monkeypatch.setattr(launcher, "DEQUANT_PREFILL", False)
    wq, s = quantize_weight(torch.randn(n, k) / k**0.5, "fp8")
    assert launcher.launch_config(m, n, k, "fp8", x.device, config=_cfg())[1] == "fp8"
    assert rel_rms(_run(x, wq, _cfg(), w_format="fp8", w_scale=s), linear_ref(x, wq, w_format="fp8", w_scale=s)) <= FP16


def _block_fp8(n, k):
    """fp8 e4m3 codes [N, K] and fp32 scales per 128 x 128 block [ceil(N/128), ceil(K/128)], blocks of very
    different magnitudes (a scale applied to the wrong block shows)."""
    b = FP8_BLOCK
    nb, kb = -(-n // b), -(-k // b)
    mag = torch.exp(2.0 * torch.randn(nb, kb))
    w = torch.randn(n, k) * mag.repeat_interleave(b, 0)[:n].repeat_interleave(b, 1)[:, :k] / k**0.5
    pad = torch.zeros(nb * b, kb * b)
    pad[:n, :k] = w
    scale = (pad.view(nb, b, kb, b).abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
    codes = (w / scale.repeat_interleave(b, 0)[:n].repeat_interleave(b, 1)[:, :k]).to(torch.float8_e4m3fn)
    return codes, scale


@pytest.mark.parametrize("use_tma", [None, False])
def test_block_scaled_fp8_in_the_persistent_kernel(monkeypatch, use_tma):
    """fp8 with per-block scales: dequantised once (the default) and in the kernel (DEQUANT_PREFILL off): partial
    blocks along N and K (N 200, K 300), whole tiles and the tail split (six programs for 8 tiles, split 4),
    descriptors and pointers."""
    monkeypatch.setattr(launcher, "CPU_PROGRAMS", 6)
    m, n, k = 100, 200, 300
    x = torch.randn(m, k, dtype=torch.float16)
    wq, s = _block_fp8(n, k)
    cfg = _cfg(64, 64, 32, group=2, split=4, USE_TMA=use_tma)
    assert launcher.persistent_plan(m, n, k, cfg, 6).n_tail > 0
    ref = linear_ref(x, wq, w_format="fp8", w_scale=s)
    assert rel_rms(_run(x, wq, cfg, w_format="fp8", w_scale=s), ref) <= FP16
    monkeypatch.setattr(launcher, "DEQUANT_PREFILL", False)
    y = _run(x, wq, cfg, w_format="fp8", w_scale=s)
    assert rel_rms(y, ref) <= FP16
    tiled = _run(x, wq, GemmConfig("tiled", 32, 64, 32, 2), w_format="fp8", w_scale=s)
    assert rel_rms(y, tiled) <= FP16


def test_tuner_offers_the_persistent_kernel_at_prefill_m():
    from m3lab.tune.gemm import candidates
    prefill = candidates(2048, 2304, 6144, 132, "bf16")
    assert any(c.kernel == "persistent" and c.SPLIT_K > 1 for c in prefill)
    assert any(c.kernel == "tiled" for c in prefill)
    assert all(c.kernel != "persistent" for c in candidates(16, 2304, 6144, 132, "bf16"))
    assert any(c.kernel == "persistent" for c in candidates(2048, 2304, 6144, 132, "fp8"))
    for c in prefill:
        assert GemmConfig.from_dict(c.to_dict()) == c
