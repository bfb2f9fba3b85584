"""The graph24 harness, its committed H200 run, the targets command, per-channel fp8 and vLLM's MXFP8 kernel."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.bench_analysis import gemm as analysis  # noqa: E402
from m3lab.bench_analysis import peers  # noqa: E402
from m3lab.bench.table import read_table, rows_frame  # noqa: E402
from m3lab.bench.timing import HARNESS, MIN_CALLS, SELF_CHECK_US, graph_calls  # noqa: E402


def test_graph_holds_min_calls_round_robin_over_copies():
    copies = [lambda i=i: i for i in range(5)]
    seq = graph_calls(copies)
    assert len(seq) == MIN_CALLS and [c() for c in seq[:7]] == [0, 1, 2, 3, 4, 0, 1]
    many = [lambda i=i: i for i in range(30)]
    assert graph_calls(many) == many                     # more copies than MIN_CALLS: each once


def test_committed_self_check_and_rows(repo_dir):
    sc = pd.read_csv(repo_dir / "traces" / "bench" / "gemm_selfcheck_NVIDIA_H200.csv")
    assert set(sc["harness"]) == {HARNESS} and len(sc) >= 4
    assert ((sc["diff_us"].abs() <= SELF_CHECK_US) == sc["passed"]).all() and sc["passed"].all()
    # one kernel per call: checked against its kernel time; several (cuBLAS GEMM + split-K reduction): their span
    one = sc["kernels_per_call"] == 1
    assert (sc.loc[one, "checked_against"] == "kernels").all() and (sc.loc[~one, "checked_against"] == "span").all()
    assert np.allclose((sc["harness_us"] - sc["kernel_us"]).where(one, sc["harness_us"] - sc["span_us"]), sc["diff_us"])
    df = read_table(repo_dir / "traces" / "bench" / "gemm.csv")
    assert set(df["harness"]) == {"", HARNESS}           # older rows are told apart by an empty harness


def test_targets_command_prints_the_newest_commit(repo_dir, capsys):
    """The targets command reads the committed peers table (every peer at its best, in rounds) and nothing else."""
    peers.print_targets()
    out = capsys.readouterr().out
    df = read_table(repo_dir / "traces" / "bench" / peers.PEERS_TABLE)
    assert f"commit {df['commit'].iloc[-1]}" in out and "MoE bf16 vs vLLM" in out and "rounds" in out


def _row(provider, m, dtype="bf16", us=10.0, harness=HARNESS):
    from m3lab.bench import gemm
    from m3lab.bench.ceilings import Ceilings
    from m3lab.bench.timing import Timing
    r = gemm.bench_row(provider, m, 2560, 6144, dtype, Timing(us, us, us), Ceilings(), "cpu")
    r.harness = harness
    return r


def test_targets_use_the_new_harness_and_report_ratios():
    rows = [_row("cublas", 1, us=50.0, harness=""), _row("triton", 1, us=1.0, harness="")]   # old method: ignored
    for m in (1, 8, 32):
        rows += [_row("cublas", m, us=10.0), _row("triton", m, us=8.0), _row("triton-prefill-tiles", m, us=24.0),
                 _row("triton", m, "mxfp8", us=8.0), _row("read-only", m, "mxfp8", us=6.0),
                 _row("vllm-mxfp8", m, "mxfp8", us=20.0)]
    t = analysis.gemm_targets(rows_frame(rows)).set_index("target")
    assert t["measured"].iloc[0] == pytest.approx(1.25)
    assert t.loc["MX decode M <= 32: worst fraction of the streaming ceiling", "measured"] == pytest.approx(0.75)
    assert t.loc["bf16 decode tiles vs prefill tiles, M <= 64: speed ratio (geomean)", "measured"] == pytest.approx(3.0)
    assert t.loc["vLLM MXFP8 (peer) decode M <= 32: geomean vs bf16 cuBLAS", "measured"] == pytest.approx(0.5)
    assert t.loc["vLLM MXFP8 (peer) decode M <= 32: geomean vs bf16 cuBLAS", "passed"] is None


def test_per_channel_fp8_scale_once_per_row():
    from kernels.gemm import launcher
    from kernels.gemm.reference import linear_ref, quantize_weight
    from kernels.gemm.tables import GemmConfig
    m, n, k = 5, 70, 160
    w, s = quantize_weight(torch.randn(n, k) / k**0.5, "fp8")
    assert launcher._scale_args(w, "fp8", s, n, k, GemmConfig("splitk", 16, 32, 32))[1:] == (1, 0, 1, 0)
    x = torch.randn(m, k, dtype=torch.float16)
    ref = linear_ref(x.float(), w, w_format="fp8", w_scale=s)
    for cfg in (GemmConfig("splitk", 16, 32, 32, SPLIT_K=3), GemmConfig("tiled", 16, 32, 64, GROUP_M=2)):
        y = torch.full((m, n), float("nan"), dtype=torch.float16)
        launcher.linear(x, w, w_format="fp8", w_scale=s, config=cfg, out=y)
        assert (y.float() - ref).norm() / ref.norm() < 2e-3


def test_vllm_mxfp8_gate_on_the_interpreter():
    from m3lab.gates.runner import run_gates
    df = run_gates("cpu", names=["vllm.mxfp8_linear"], perf=False)
    assert len(df) == 4 and df["passed"].all()
