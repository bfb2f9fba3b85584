"""The persistent prefill GEMM (kernels/gemm/gemm_persistent.py) on the CPU interpreter: tensor-descriptor and
pointer paths on shapes that are not multiples of the tile, the program order and stream-K split of
``launcher.persistent_plan``, the stream-K partials and counters, and the formats the launcher routes to it."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.gates.checks import TOLERANCES, rel_rms  # noqa: E402
from m3lab.kernels.gemm import launcher  # noqa: E402
from m3lab.kernels.gemm.tables import GemmConfig  # noqa: E402
from m3lab.kernels.gemm.reference import linear_ref, quantize_weight  # noqa: E402

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


def test_plan_streams_the_last_partial_wave():
    """H200 (132 SMs), M 2048 N 2304 K 6144, 128 x 128 tiles: 288 tiles = 2 waves + 24."""
    p = launcher.persistent_plan(2048, 2304, 6144, _cfg(128, 128, 64, split=2), 132)
    assert (p.programs, p.n_dp, p.n_sk) == (132, 132, 156)           # the last wave + 24 tiles stream-K
    assert p.max_contrib == 2                                         # 156 * 96 / 132 = 113 steps per program
    assert launcher.persistent_plan(2048, 2304, 6144, _cfg(128, 128, 64, split=3), 132).n_sk == 288
    assert launcher.persistent_plan(2048, 2304, 6144, _cfg(128, 128, 64, split=1), 132).n_sk == 0
    whole = launcher.persistent_plan(128 * 12, 128 * 11, 6144, _cfg(128, 128, 64), 132)   # one whole wave
    assert (whole.n_dp, whole.n_sk) == (132, 0)
    few = launcher.persistent_plan(2048, 1536, 6144, _cfg(128, 256, 64, split=2), 132)    # 96 tiles < 132 SMs
    assert (few.programs, few.n_dp, few.n_sk) == (132, 0, 96) and few.max_contrib == 3
    tiny = launcher.persistent_plan(16, 64, 64, _cfg(16, 64, 64, split=2), 132)          # 1 tile, 1 K step
    assert (tiny.programs, tiny.n_sk, tiny.max_contrib) == (1, 1, 1)


@pytest.mark.parametrize("programs,split", [(6, 2), (6, 8), (7, 2)])
def test_stream_k_tiles(monkeypatch, programs, split):
    """20 tiles of 64 x 64, 5 K steps (the last 8 columns wide) on 6-7 programs: the partial wave plus one
    wave stream-K (split 2: tiles shared by two programs), or every tile (split 8: runs of 16-17 steps, whole
    tiles inside a run). Each stream-K tile is checked on its own: without the stream-K loop it stays NaN,
    without every partial it is wrong. Repeated calls on fresh inputs: the counters are back at zero."""
    monkeypatch.setattr(launcher, "CPU_PROGRAMS", programs)
    m, n, k = 300, 200, 136
    cfg = _cfg(64, 64, 32, group=2, split=split)
    p = launcher.persistent_plan(m, n, k, cfg, programs)
    assert p.n_sk > 0 and p.max_contrib >= 2
    order = _grouped_tiles(m, n, 64, 64, 2)
    for _ in range(2):
        x, w = torch.randn(m, k, dtype=torch.float16), (torch.randn(n, k) / k**0.5).half()
        y, ref = _run(x, w, cfg), linear_ref(x, w)
        for i_m, i_n in order[p.n_dp:]:
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


def test_weight_formats_routed_to_the_persistent_kernel():
    """fp8 per channel in the kernel (scale per output column); MX dequantised to x's dtype first; fp8 block
    scales are refused with the field named."""
    m, n, k = 70, 50, 128
    x = torch.randn(m, k, dtype=torch.float16)
    for fmt in ("fp8", "mxfp8", "mxfp4"):
        wq, s = quantize_weight(torch.randn(n, k) / k**0.5, fmt)
        assert launcher.launch_config(m, n, k, fmt, x.device, config=_cfg(), use_native_mx=True)[1] == \
            ("fp8" if fmt == "fp8" else "bf16")
        y = _run(x, wq, _cfg(), w_format=fmt, w_scale=s)
        assert rel_rms(y, linear_ref(x, wq, w_format=fmt, w_scale=s)) <= FP16, fmt
    wq, _ = quantize_weight(torch.randn(n, k), "fp8")
    with pytest.raises(ValueError, match="block scales"):
        launcher.linear(x, wq, w_format="fp8", w_scale=torch.ones(1, 1), config=_cfg())


def test_tuner_offers_the_persistent_kernel_at_prefill_m():
    from m3lab.tune.gemm import candidates
    prefill = candidates(2048, 2304, 6144, 132, "bf16")
    assert any(c.kernel == "persistent" and c.SPLIT_K > 1 for c in prefill)
    assert any(c.kernel == "tiled" for c in prefill)
    assert all(c.kernel != "persistent" for c in candidates(16, 2304, 6144, 132, "bf16"))
    for c in prefill:
        assert GemmConfig.from_dict(c.to_dict()) == c
