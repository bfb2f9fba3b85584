"""A target is computed only from the points its title names: a missing point makes it incomplete, never a pass
(GEMM, grouped MoE, sparse attention)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest

from m3lab.analysis.targets import add_verdicts, missing, verdict
from m3lab.bench.table import rows_frame
from m3lab.bench_analysis import gemm as analysis
from m3lab.bench_analysis import moe as bench_moe
from m3lab.bench_analysis import sparse as sa


def _row(provider, m, dtype="bf16", us=10.0):
    from m3lab.bench import gemm
    from m3lab.bench.ceilings import Ceilings
    from m3lab.bench.timing import HARNESS, Timing
    r = gemm.bench_row(provider, m, 2560, 6144, dtype, Timing(us, us, us), Ceilings(), "cpu")
    r.harness = HARNESS
    return r


def _gemm_table(ms):
    rows = []
    for m in ms:   # our kernel 1.25x cuBLAS at every point
        rows += [_row("cublas", m, us=10.0), _row("triton", m, us=8.0), _row("triton-prefill-tiles", m, us=12.0)]
    return rows_frame(rows)


def test_the_review_case_m_1_32_2048_is_incomplete_not_pass():
    t = analysis.gemm_targets(_gemm_table([1, 32, 2048])).set_index("target")
    decode = t.loc["bf16 decode M in {1,8,32,64,128}: geomean vs cuBLAS"]
    assert decode["measured"] == pytest.approx(1.25)          # the figure over the points there is ...
    assert decode["status"] == "incomplete" and decode["passed"] is None   # ... never passes
    assert decode["missing"] == "M = 8, 64, 128 not measured"
    assert t.loc["bf16 prefill M >= 2048: worst point vs cuBLAS", "status"] == "pass"


def test_every_named_point_measured_passes():
    t = analysis.gemm_targets(_gemm_table([1, 8, 32, 64, 128, 2048])).set_index("target")
    row = t.loc["bf16 decode M in {1,8,32,64,128}: geomean vs cuBLAS"]
    assert row["status"] == "pass" and row["passed"] is True and row["missing"] == ""


def test_moe_target_with_a_missing_token_count_is_incomplete():
    table = bench_moe.moe_table()
    full = bench_moe.moe_targets(table)
    assert set(full["status"]) <= {"pass", "fail"}
    cut = bench_moe.moe_targets(table[table["T"] != 8])
    small = cut[cut["target"].str.startswith("T <= 128")]
    assert set(small["status"]) == {"incomplete"} and small["passed"].isna().all()
    assert small["missing"].str.contains("T = 8 not measured").all()


def test_sparse_target_without_b_128_is_incomplete():
    table = sa.recorded_table()
    cut = sa.targets(table[table["B"] != 128]).set_index("target")
    row = cut.loc["attention >= 90% of copy bandwidth at B=128"]
    assert row["status"] == "incomplete" and row["met"] is None and "ctx = 8192, 65536" in row["missing"]
    assert sa.targets(table).set_index("target").loc["attention >= 90% of copy bandwidth at B=128", "status"] in (
        "pass", "fail")


def test_verdicts():
    assert missing([1, 32, 2048], [1, 8, 32]) == "M = 8 not measured" and missing([1, 8], [1, 8]) == ""
    assert verdict(2.0, 1.0) == "pass" and verdict(0.5, 1.0) == "fail" and verdict(2.0, 1.0, ">=", "M = 8") == \
        "incomplete"
    assert verdict(float("nan"), 1.0) == "incomplete" and verdict(2.0, float("nan"), "info") == "info"
    import pandas as pd
    out = add_verdicts(pd.DataFrame({"measured": [2.0, 0.5], "threshold": [1.0, 1.0], "missing": ["", ""]}))
    assert list(out["status"]) == ["pass", "fail"] and list(out["passed"]) == [True, False]
