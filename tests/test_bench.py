"""Benchmark table (long format), FLOP/byte formulas, ceilings, analysis, tuner plumbing on the CPU."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.bench import gemm  # noqa: E402
from m3lab.bench_analysis import gemm as analysis  # noqa: E402
from m3lab.bench.ceilings import Ceilings  # noqa: E402
from m3lab.bench.table import COLUMNS, BenchRow, append_rows, read_table, rows_frame  # noqa: E402
from m3lab.bench.timing import HARNESS, Timing, cpu_time  # noqa: E402


def _row(provider="triton", m=1, dtype="bf16", us=10.0):
    return gemm.bench_row(provider, m, 2560, 6144, dtype, Timing(us * 0.9, us, us * 1.1), Ceilings(), "cpu")


def test_table_append_and_read(tmp_path):
    path = tmp_path / "bench" / "gemm.csv"
    append_rows(path, [_row(), _row("cublas")])
    append_rows(path, [_row(m=4096, us=100.0)])
    text = path.read_text().splitlines()
    assert text[0] == ",".join(COLUMNS) and len(text) == 4          # header once
    df = read_table(path)
    assert list(df["M"]) == [1, 1, 4096] and set(df["N"]) == {2560} and set(df["K"]) == {6144}
    assert list(df["m"]) == [1, 1, 4096] and list(df["ceiling"]) == ["copy_tbps", "copy_tbps", "mm_tflops"]
    c = Ceilings()     # the H200 profile's measured ceilings
    assert list(df["ceiling_value"]) == [round(c.copy_tbps, 6), round(c.copy_tbps, 6), round(c.mm_tflops, 6)]
    pd.read_csv(path).drop(columns="op").to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match="missing columns"):
        read_table(tmp_path / "bad.csv")


def test_old_rows_are_read_into_the_numeric_columns(tmp_path):
    """Rows written before m/n/k/ceiling_value existed: read from their labels; appending migrates the file."""
    path = tmp_path / "gemm.csv"
    old = ",".join(COLUMNS[:14])
    path.write_text(old + '\ngemm,triton,"M=2,N=2560,K=6144",bf16,1,2,3,0.1,0.2,0.5,copy_tbps=4.21,dev,abc,2026-11-29\n')
    df = read_table(path)
    assert (int(df["m"][0]), int(df["N"][0]), df["ceiling"][0], df["ceiling_value"][0]) == (2, 2560, "copy_tbps", 4.21)
    append_rows(path, [_row()])
    df = read_table(path)
    assert path.read_text().splitlines()[0] == ",".join(COLUMNS) and list(df["m"]) == [2, 1]
    assert list(df["ceiling_value"]) == [4.21, round(Ceilings().copy_tbps, 6)]


def test_formulas_and_ceiling():
    # derived by hand: 2MNK FLOPs; W with its E8M0 scales (1 byte per 32) once, x and y in bf16 once
    m, n, k = 1, 2560, 6144
    for fmt, w_bytes in (("bf16", 2.0), ("mxfp8", 1 + 1 / 32), ("mxfp4", 0.5 + 1 / 32)):
        flops, nbytes = gemm.gemm_flops_bytes(m, n, k, fmt)
        assert flops == 2 * m * n * k and nbytes == pytest.approx(n * k * w_bytes + 2 * m * k + 2 * m * n)
    c = Ceilings(copy_tbps=4.0, mm_tflops=800.0)
    name, value, floor = c.limit(*gemm.gemm_flops_bytes(m, n, k, "bf16"))
    assert (name, value) == ("copy_tbps", 4.0) and floor == pytest.approx(gemm.gemm_flops_bytes(m, n, k, "bf16")[1] / 4e6)
    assert c.limit(*gemm.gemm_flops_bytes(8192, 6144, 6144, "bf16"))[:2] == ("mm_tflops", 800.0)
    assert c.bound(*gemm.gemm_flops_bytes(8192, 6144, 6144, "bf16")) == ("mm_tflops=800", c.limit(
        *gemm.gemm_flops_bytes(8192, 6144, 6144, "bf16"))[2])
    r = _row(us=10.0)
    assert r.tbps == pytest.approx(gemm.gemm_flops_bytes(m, n, k, "bf16")[1] / 10e-6 / 1e12)
    assert 0 < r.frac_ceiling < 1 and isinstance(r, BenchRow)


def test_analysis_targets_on_synthetic_table():
    rows = []
    for m in (1, 8, 32, 64, 128, 2048):
        rows += [_row("cublas", m, us=10.0), _row("triton", m, us=8.0), _row("triton-prefill-tiles", m, us=12.0),
                 _row("triton", m, "mxfp8", us=5.0), _row("triton", m, "mxfp4", us=4.5),
                 _row("triton-mx-layout", m, "mxfp8", us=6.0), _row("triton-mx-layout", m, "mxfp4", us=4.0)]
    df = rows_frame(rows)
    t = analysis.gemm_targets(df).set_index("target")
    assert t["measured"].iloc[0] == pytest.approx(1.25) and t["passed"].iloc[0]
    # each MX format is served by its faster weight path over all M (OCP for mxfp8 here, the layout for mxfp4)
    assert t.loc["MXFP8 decode M <= 32 (triton): geomean vs bf16 cuBLAS", "measured"] == pytest.approx(2.0)
    mx4 = t.loc["MXFP4 decode M <= 32 (triton-mx-layout): geomean vs bf16 cuBLAS"]
    assert mx4["measured"] == pytest.approx(2.5) and mx4["passed"]                   # 10 / 4 >= 2.4
    gain = analysis.tile_gain(df)
    assert len(gain) == 6 and gain["gain"].tolist() == pytest.approx([0.5] * 6)


def test_committed_h200_gemm_table(repo_dir):
    df = read_table(repo_dir / "traces" / "bench" / "gemm.csv")
    assert set(df["device"]) == {"NVIDIA_H200"} and set(df["op"]) == {"gemm"}
    assert {(n, k) for n, k in zip(df["N"], df["K"])} <= set(gemm.model_gemm_shapes())
    assert set(df["provider"]) <= set(gemm.PROVIDERS) | {"triton-prefill-tiles"}
    assert set(df["dtype"]) == set(gemm.W_FORMATS) and df["M"].min() == 1 and df["M"].max() == 8192
    newest = df[df["commit"] == df["commit"].iloc[-1]]
    assert set(newest["harness"]) == {HARNESS} and set(newest["provider"]) >= set(gemm.PROVIDERS) - {"triton-mx-layout"}
    assert (df["us_p20"] <= df["us_p50"]).all() and (df["us_p50"] <= df["us_p80"]).all()
    sp = analysis.speedups(df)
    assert len(sp) and sp["speedup"].notna().all()


def test_tune_point_on_the_interpreter():
    from m3lab.tune.gemm import candidates, tune_point
    cands = candidates(5, 48, 256, sms=2)[:2] + [candidates(300, 48, 256)[2]]
    rows = tune_point(5, 48, 256, "mxfp8", cands, {}, device=torch.device("cpu"),
                      timer=lambda calls: cpu_time(calls[0], reps=1))
    assert len(rows) == 3 and all(r["us"] > 0 and not r["error"] for r in rows)
    assert all(c.kernel in ("tiled", "persistent") for c in candidates(4096, 2560, 6144))


@pytest.mark.parametrize("fmt", ["mxfp8_layout", "mxfp4_layout"])
def test_tune_point_decode_layout_on_the_interpreter(fmt):
    """The tuner times decode-layout kernels through layout_launcher.linear_layout on weights packed once; each candidate
    is checked first (the fp8-MMA kernel against x quantised as it multiplies it), a wrong one is dropped."""
    from dataclasses import replace

    from m3lab.tune.gemm import LAYOUT_TUNE_KERNELS, base_format, layout_candidates, tune_point
    cands = layout_candidates(5, 48, 256, sms=2, w_format=fmt)
    assert {c.kernel for c in cands} == set(LAYOUT_TUNE_KERNELS[base_format(fmt)]) | {"gemv"}
    assert not layout_candidates(40, 48, 256, sms=2, w_format=fmt)[-1].kernel == "gemv"   # CUDA cores lose there
    picks = [next(c for c in cands if c.kernel == kern) for kern in dict.fromkeys(c.kernel for c in cands)]
    picks = [replace(c, BLOCK_N=16, BLOCK_K=64, SPLIT_K=2) for c in picks]
    rows = tune_point(5, 48, 256, fmt, picks, {}, device=torch.device("cpu"),
                      timer=lambda calls: cpu_time(calls[0], reps=1))
    assert all(r["us"] > 0 and not r["error"] for r in rows), rows


def test_optable_gives_the_benchmarked_shapes(monkeypatch):
    # MiniMax M3 at TP4, per rank (minimax_m3.md §3): sparse-layer fused qkv+indexer, dense-layer qkv, o_proj,
    # dense-MLP gate_up, dense-MLP down, and the shared expert's gate_up and down (vLLM runs it as its own MLP
    # unless shared-expert fusion is asked for)
    m3_tp4 = {(2560, 6144), (2304, 6144), (6144, 2048), (6144, 6144), (6144, 3072), (1536, 6144), (6144, 768)}
    assert set(gemm.model_gemm_shapes("minimax-m3", 4)) == m3_tp4
    import m3lab.optable.kernel_shapes as optable

    def broken(*args, **kwargs):
        raise RuntimeError("broken OpTable")
    monkeypatch.setattr(optable, "build_optable", broken)
    gemm.model_gemm_shapes.cache_clear()
    with pytest.raises(RuntimeError, match="broken OpTable"):      # no silent fall-back to a hard-coded set
        gemm.model_gemm_shapes("minimax-m3", 4)
    gemm.model_gemm_shapes.cache_clear()


def test_label_fields_of_other_ops(tmp_path):
    """A MoE row names its problem in the label: its integer fields become columns; M/N/K stay empty."""
    row = BenchRow("moe", "triton", "T=8,H=6144,I=768,E=129,k=5,routing=zipf", "mxfp8", 1.0, 2.0, 3.0, 0.1, 0.2,
                   0.5, Ceilings().bound(1e9, 1e8)[0], "dev", "abc", "2026-11-30")
    path = append_rows(tmp_path / "moe.csv", [row])
    df = read_table(path)
    assert (int(df["T"][0]), int(df["E"][0]), df["ceiling"][0], df["ceiling_value"][0]) == (8, 129, "copy_tbps", round(Ceilings().copy_tbps, 6))
    assert df["M"].isna().all() and "routing" not in df.columns
