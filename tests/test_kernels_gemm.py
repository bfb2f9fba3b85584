"""GEMM kernels on the CPU interpreter beyond the gates (m3lab/gates/gemm.py holds the awkward-shape grid of
every kernel and format, scored with the gate's tolerances): the gemv kernel, the weight decoding bits, fp8
block scales, the split-K counters, the config tables, their lookup and the launcher's checks."""
import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from m3lab.gates import run_gates  # noqa: E402
from m3lab.gates.checks import TOLERANCES, rel_rms  # noqa: E402
from m3lab.kernels.gemm import launcher, tables  # noqa: E402
from m3lab.kernels.gemm.tables import GemmConfig  # noqa: E402
from m3lab.kernels.gemm.reference import linear_ref, quantize_weight  # noqa: E402
from m3lab.kernels.mx.triton_mx import e2m1_value, e8m0_pow2  # noqa: E402

KERNEL_CONFIGS = {"tiled": GemmConfig("tiled", 16, 32, 64, GROUP_M=3),
                  "splitk": GemmConfig("splitk", 16, 32, 32, SPLIT_K=3)}
FP16, FP32 = TOLERANCES["float16"], TOLERANCES["float32"]


def _problem(fmt, m, n, k, dtype=torch.float16):
    w0 = torch.randn(n, k) / k**0.5
    w, s = quantize_weight(w0.to(dtype) if fmt == "bf16" else w0, fmt)
    return torch.randn(m, k, dtype=dtype), w, s


def test_gemm_gate_passes_on_the_interpreter():
    """The gate's awkward-shape grid (auto config and each kernel forced) for the one format the CPU gate tests
    elsewhere leave out of their passing runs (tests/test_gates.py: bf16, mxfp4; tests/test_gates.py CLI: fp8)."""
    df = run_gates("cpu", names=["gemm.mxfp8"], perf=False)
    assert len(df) >= 12 and df["passed"].all(), df[~df["passed"]].to_string()


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
def test_native_mx_dot_scaled_path(fmt):
    if tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9):
        pytest.skip("this interpreter lacks tl.dot_scaled")
    x, w, s = _problem(fmt, 7, 100, 160)
    for cfg in (KERNEL_CONFIGS["tiled"], KERNEL_CONFIGS["splitk"]):
        y = launcher.linear(x, w, w_format=fmt, w_scale=s, config=cfg, use_native_mx=True)
        assert rel_rms(y, linear_ref(x.float(), w, w_format=fmt, w_scale=s)) <= FP16


@pytest.mark.parametrize("fmt", ["bf16", "mxfp8", "mxfp4"])
def test_gemv_kernel_matches_reference(fmt):
    """The CUDA-core decode kernel: partial row tiles (M 3 in BLOCK_M 4), N and K not multiples of the tiles."""
    x, w, s = _problem(fmt, 3, 40, 224)
    for cfg in (GemmConfig("gemv", 4, 16, 64, SPLIT_K=2), GemmConfig("gemv", 1, 8, 128, SPLIT_K=1)):
        if cfg.BLOCK_M == 1:
            x = x[:1]
        out = torch.full((x.shape[0], 40), float("nan"), dtype=x.dtype)
        launcher.linear(x, w, w_format=fmt, w_scale=s, config=cfg, out=out)
        assert rel_rms(out, linear_ref(x.float(), w, w_format=fmt, w_scale=s)) <= FP16
    assert int(launcher._LOCKS[x.device].abs().sum()) == 0
    w8, s8 = quantize_weight(torch.randn(40, 224), "fp8")
    with pytest.raises(ValueError, match="gemv"):
        launcher.linear(x, w8, w_format="fp8", w_scale=s8, config=GemmConfig("gemv", 4, 16, 64))


@triton.jit
def _decode_kernel(p_c, p_e2m1, p_e2m1_f32, p_pow2, p_pow2_f32, p_q, p_q_bf16):
    o = tl.arange(0, 256)
    c = tl.load(p_c + o)
    tl.store(p_e2m1 + o, e2m1_value(c, tl.bfloat16).to(tl.float32))
    tl.store(p_e2m1_f32 + o, e2m1_value(c, tl.float32))
    tl.store(p_pow2 + o, e8m0_pow2(c, tl.bfloat16).to(tl.float32))
    tl.store(p_pow2_f32 + o, e8m0_pow2(c, tl.float32))
    tl.store(p_q_bf16 + o, tl.load(p_q + o).to(tl.bfloat16).to(tl.float32))


def test_weight_decoding_bits_are_exact():
    """E2M1 and E8M0 decoded by bit construction (bf16 and fp32) and E4M3 -> bf16, over every code."""
    codes = torch.arange(256, dtype=torch.uint8)
    outs = [torch.empty(256) for _ in range(5)]
    q = codes.view(torch.float8_e4m3fn)
    _decode_kernel[(1,)](codes, outs[0], outs[1], outs[2], outs[3], q, outs[4])
    e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])[(codes & 15).long()]
    assert torch.equal(outs[0], e2m1) and torch.equal(outs[1], e2m1)
    pow2 = torch.tensor([2.0 ** (int(c) - 127) for c in codes[:255]], dtype=torch.float64).float()
    assert torch.equal(outs[3][:255], pow2) and outs[3][255].isnan() and outs[2][255].isnan()
    assert torch.equal(outs[2][1:255], pow2[1:])            # s = 0: bf16 subnormal (the interpreter flushes it)
    finite = q.float().isfinite()
    assert torch.equal(outs[4][finite], q.float()[finite])


def test_fp8_block_scales_and_fp32_activations():
    m, n, k = 5, 130, 260
    w, _ = quantize_weight(torch.randn(n, k), "fp8")
    s = torch.rand(2, 3) + 0.5                                  # [ceil(N/128), ceil(K/128)]
    x = torch.randn(m, k)
    y = launcher.linear(x, w, w_format="fp8", w_scale=s, config=KERNEL_CONFIGS["splitk"])
    assert rel_rms(y, linear_ref(x, w, w_format="fp8", w_scale=s)) <= FP32
    wf = torch.randn(n, k)
    y = launcher.linear(x, wf, config=KERNEL_CONFIGS["tiled"])
    assert rel_rms(y, x @ wf.T) <= FP32


def test_auto_config_both_regimes():
    for m in (3, 80):                                           # decode heuristic, prefill heuristic
        x, w, s = _problem("mxfp4", m, 48, 96)
        assert rel_rms(launcher.linear(x, w, w_format="mxfp4", w_scale=s),
                       linear_ref(x.float(), w, w_format="mxfp4", w_scale=s)) <= FP16


def test_splitk_counters_reset_after_each_call():
    x, w, s = _problem("bf16", 3, 64, 256)
    launcher.linear(x, w, config=GemmConfig("splitk", 16, 16, 32, SPLIT_K=4))
    assert int(launcher._LOCKS[x.device].abs().sum()) == 0       # graph replays start from zero again


def test_launcher_rejects_bad_operands():
    x, w, s = _problem("mxfp8", 2, 32, 64)
    with pytest.raises(ValueError, match="w_format"):
        launcher.linear(x, w, w_format="int4")
    with pytest.raises(ValueError, match="w_scale: required"):
        launcher.linear(x, w, w_format="mxfp8")
    with pytest.raises(ValueError, match="K=64 does not match"):
        launcher.linear(torch.randn(2, 96, dtype=torch.float16), w, w_format="mxfp8", w_scale=s)
    with pytest.raises(ValueError, match="MX scales must be uint8"):
        launcher.linear(x, w, w_format="mxfp8", w_scale=s[:, :1].contiguous())
    with pytest.raises(ValueError, match="x's dtype"):
        launcher.linear(x, torch.randn(32, 64), w_format="bf16")


def test_config_validation_and_round_trip():
    cfg = GemmConfig("splitk", 16, 64, 128, 1, 4, 4, 5, waves_per_eu=2, matrix_instr_nonkdim=16)
    assert GemmConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.compiler_options(is_hip=False) == {"num_warps": 4, "num_stages": 5}
    assert cfg.compiler_options(is_hip=True)["waves_per_eu"] == 2
    with pytest.raises(ValueError, match="BLOCK_N"):
        GemmConfig("tiled", 16, 48, 64)
    with pytest.raises(ValueError, match="unknown keys"):
        GemmConfig.from_dict({"kernel": "tiled", "BLOCK_SIZE_M": 64})
    with pytest.raises(ValueError, match="kernel"):
        GemmConfig("streamk")


def test_table_nearest_m_lookup(tmp_path, monkeypatch):
    table = {1: GemmConfig("splitk", 16, 64, 128, 1, 4), 64: GemmConfig("splitk", 64, 64, 128, 1, 2),
             2048: GemmConfig("tiled", 128, 128, 64)}
    path = tables.write_table(tables.table_path(48, 96, "mxfp4", "cpu", tmp_path), table)
    assert json.loads(path.read_text())["64"]["SPLIT_K"] == 2
    loaded = tables.load_table(path)
    assert tables.nearest(loaded, 20) == table[1] and tables.nearest(loaded, 40) == table[64]
    assert tables.nearest(loaded, 100000) == table[2048] and tables.nearest({}, 5) is None
    monkeypatch.setattr(tables, "CONFIG_DIR", tmp_path)
    assert tables.select_config(1500, 48, 96, "mxfp4", "cpu") == table[2048]
    assert tables.select_config(1500, 48, 96, "mxfp4", "cpu", regime="decode").kernel == "splitk"
    assert tables.select_config(3, 48, 96, "bf16", "cpu") == tables.heuristic_config(3, 48, 96, "bf16", sms=8)
    # a table tuned at decode M only (a tuning run cut short) serves no prefill M, and the reverse
    tables.write_table(tables.table_path(48, 96, "mxfp8", "cpu", tmp_path), {1: table[1], 64: table[64]})
    assert tables.select_config(2048, 48, 96, "mxfp8", "cpu") == tables.heuristic_config(2048, 48, 96, "mxfp8", sms=8)
    tables.write_table(tables.table_path(48, 96, "fp8", "cpu", tmp_path), {2048: table[2048]})
    assert tables.select_config(8, 48, 96, "fp8", "cpu") == tables.heuristic_config(8, 48, 96, "fp8", sms=8)
    assert tables.select_config(200, 48, 96, "fp8", "cpu") == table[2048]


def test_heuristic_regimes():
    dec = tables.heuristic_config(1, 2560, 6144, sms=132)
    assert dec.kernel == "splitk" and dec.BLOCK_M == 16 and dec.SPLIT_K >= 4
    assert tables.heuristic_config(48, 2560, 6144).BLOCK_M == 64
    assert tables.heuristic_config(4096, 2560, 6144).kernel == "tiled"


UNTUNED_MX_SHARED_EXPERT = {(1536, 6144), (6144, 768)}  # the unfused shared expert's GEMMs: no full H200 MX (OCP) table
DECODE_ONLY_MX = {(1536, 6144, "mxfp8")}                  # tuned at decode M only (the tuning budget ran out)


def test_committed_h200_tables_cover_the_m3_shapes():
    from m3lab.optable.kernel_shapes import model_gemm_shapes
    from m3lab.tune.gemm import LAYOUT_FORMATS
    shapes = set(model_gemm_shapes())
    for n, k in UNTUNED_MX_SHARED_EXPERT:   # the launcher's heuristic serves them until `m3lab tune gemm` runs
        for fmt in ("mxfp8", "mxfp4"):
            table = tables.load_table(tables.table_path(n, k, fmt, "NVIDIA_H200"))
            assert (not table) or ((n, k, fmt) in DECODE_ONLY_MX and max(table) <= tables.CROSSOVER_MAX_M)
    for n, k in sorted(shapes):
        for fmt in LAYOUT_FORMATS:          # decode-layout tables: decode M only
            table = tables.load_table(tables.table_path(n, k, fmt, "NVIDIA_H200"))
            assert table and max(table) <= tables.DECODE_MAX_M, (n, k, fmt)
    for n, k in sorted(shapes):
        for fmt in ("bf16", "fp8", "mxfp8", "mxfp4"):
            if fmt.startswith("mx") and (n, k) in UNTUNED_MX_SHARED_EXPERT:
                continue
            table = tables.load_table(tables.table_path(n, k, fmt, "NVIDIA_H200"))
            assert table, (n, k, fmt)
            assert min(table) == 1 and max(table) >= 2048
            assert table[1].kernel in ("splitk", "gemv", "streamk") and table[1].BLOCK_M <= 16   # decode vs prefill tiles
            assert all(c.kernel not in tables.PREFILL_KERNELS for m, c in table.items() if m <= tables.DECODE_MAX_M)
            assert all(c.kernel != "gemv" or m <= tables.GEMV_MAX_M for m, c in table.items())
            assert all(c.kernel in tables.PREFILL_KERNELS for m, c in table.items() if m > tables.CROSSOVER_MAX_M)
            assert table[max(table)].kernel in tables.PREFILL_KERNELS and table[max(table)].BLOCK_M >= 64
