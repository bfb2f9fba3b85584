"""Benchmark table (long format), FLOP/byte formulas, ceilings, analysis, tuner plumbing on the CPU."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.bench import analysis, gemm  # noqa: E402
from m3lab.bench.ceilings import Ceilings  # noqa: E402
from m3lab.bench.table import COLUMNS, BenchRow, append_rows, read_table  # noqa: E402
from m3lab.bench.timing import Timing, cpu_time  # noqa: E402


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
    pd.read_csv(path).drop(columns="op").to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match="missing columns"):
        read_table(tmp_path / "bad.csv")


def test_formulas_and_ceiling():
    assert gemm.gemm_flops(2, 3, 4) == 48
    assert gemm.weight_bytes(64, 64, "mxfp4") == 64 * 64 * (0.5 + 1 / 32)
    assert gemm.weight_bytes(64, 64, "bf16") == 2 * gemm.weight_bytes(64, 64, "fp8") - 2 * 4 * 64
    c = Ceilings(copy_tbps=4.0, mm_tflops=800.0)
    label, floor = c.bound(gemm.gemm_flops(1, 2560, 6144), gemm.gemm_bytes(1, 2560, 6144, "bf16"))
    assert label.startswith("copy") and floor == pytest.approx(gemm.gemm_bytes(1, 2560, 6144, "bf16") / 4e6)
    assert c.bound(gemm.gemm_flops(8192, 6144, 6144), gemm.gemm_bytes(8192, 6144, 6144, "bf16"))[0].startswith("mm")
    r = _row(us=10.0)
    assert r.tbps == pytest.approx(gemm.gemm_bytes(1, 2560, 6144, "bf16") / 10e-6 / 1e12)
    assert 0 < r.frac_ceiling < 1 and isinstance(r, BenchRow)


def test_analysis_targets_on_synthetic_table():
    rows = []
    for m in (1, 8, 32, 64, 128, 2048):
        rows += [_row("cublas", m, us=10.0), _row("triton", m, us=8.0), _row("triton-prefill-tiles", m, us=12.0),
                 _row("triton", m, "mxfp8", us=5.0), _row("triton", m, "mxfp4", us=4.5)]
    df = pd.DataFrame([r.__dict__ for r in rows])
    df["M"], df["N"], df["K"] = [int(s.split(",")[0][2:]) for s in df["shape"]], 2560, 6144
    t = analysis.gemm_targets(df).set_index("target")
    assert t["measured"].iloc[0] == pytest.approx(1.25) and t["passed"].iloc[0]
    assert t.loc["MXFP8 decode M <= 32: geomean vs bf16 cuBLAS", "measured"] == pytest.approx(2.0)
    assert not t.loc["MXFP4 decode M <= 32: geomean vs bf16 cuBLAS", "passed"]        # 10 / 4.5 < 2.4
    gain = analysis.tile_gain(df)
    assert len(gain) == 6 and gain["gain"].tolist() == pytest.approx([0.5] * 6)


def test_committed_h200_gemm_table(repo_dir):
    df = read_table(repo_dir / "traces" / "bench" / "gemm.csv")
    assert set(df["device"]) == {"NVIDIA_H200"} and set(df["op"]) == {"gemm"}
    assert {(n, k) for n, k in zip(df["N"], df["K"])} == set(gemm.M3_TP4_SHAPES)
    assert set(df["provider"]) == {"cublas", "triton", "triton-prefill-tiles"}
    assert set(df["dtype"]) == {"bf16", "mxfp8", "mxfp4"} and df["M"].min() == 1 and df["M"].max() == 8192
    assert (df["us_p20"] <= df["us_p50"]).all() and (df["us_p50"] <= df["us_p80"]).all()
    sp = analysis.speedups(df)
    assert len(sp) and sp["speedup"].notna().all()


def test_tune_point_on_the_interpreter():
    from m3lab.tune.gemm import candidates, tune_point
    cands = candidates(5, 48, 256, sms=2)[:2] + [candidates(300, 48, 256)[2]]
    rows = tune_point(5, 48, 256, "mxfp8", cands, {}, device=torch.device("cpu"),
                      timer=lambda calls: cpu_time(calls[0], reps=1))
    assert len(rows) == 3 and all(r["us"] > 0 and not r["error"] for r in rows)
    assert all(c.kernel == "tiled" for c in candidates(4096, 2560, 6144))


def test_optable_gives_the_benchmarked_shapes():
    from m3lab.tune.gemm import default_shapes, model_gemm_shapes
    assert set(model_gemm_shapes("minimax-m3", 4)) == set(gemm.M3_TP4_SHAPES)
    assert set(default_shapes()) == set(gemm.M3_TP4_SHAPES)
