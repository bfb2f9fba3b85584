"""The kernel notebooks' views (07, 08, 09, 05): committed H200 tables -> analysis DataFrames -> plotly figures,
every figure labelled with where its numbers come from — on a CPU the recorded rows' device, commit and date."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pandas as pd
import pytest

from m3lab.bench_analysis import gemm as analysis
from m3lab.bench_analysis import moe as bench_moe
from m3lab.bench_analysis import runs as kernel_runs
from m3lab.bench_analysis import sparse as sa
from m3lab.kernels.gemm import tables


def _recorded_labels(fig, table):
    title = fig.layout.title.text
    assert "recorded: measured on NVIDIA_H200" in title, title
    for commit, date in set(zip(table["commit"].astype(str), table["date"].astype(str))):
        assert f"commit {commit}, {date}" in title, (title, commit, date)


def test_gemm_views_and_figures_show_the_recorded_commit_and_date(repo_dir):
    from m3lab.plots import kernels as kplots
    table, source = kernel_runs.gemm("cpu")
    assert not source.live and analysis.copy_ceiling(table) > 3.0   # measured copy TB/s quoted in the table
    targets = analysis.gemm_targets(table)
    assert len(targets) == 9 and targets["measured"].notna().all()
    cfgs = analysis.tuned_configs("NVIDIA_H200")
    assert set(cfgs["w_format"]) == {"bf16", "fp8", "mxfp8", "mxfp4", "mxfp8_layout", "mxfp4_layout"}
    assert set(cfgs["kernel"]) <= set(tables.KERNELS)
    for fig in (kplots.speedup_figure(analysis.speedups(table), source),
                kplots.bandwidth_figure(table, source, analysis.copy_ceiling(table)),
                kplots.tile_gain_figure(analysis.tile_gain(table), source),
                kplots.targets_table_figure(targets, source)):
        _recorded_labels(fig, table)
    gates = pd.read_csv(repo_dir / "traces" / "gates" / "gates_cuda_NVIDIA_H200.csv")
    _recorded_labels(kplots.gate_errors_figure(gates), gates)


def test_moe_and_sparse_figures_show_the_recorded_commit_and_date():
    from m3lab.plots import moe as pm
    from m3lab.plots import sparse as sp
    table, source = kernel_runs.moe("cpu")
    figs = [pm.targets_figure(bench_moe.moe_targets(table), source), pm.latency_figure(table, source),
            pm.bandwidth_figure(table, source), pm.ratio_figure(table, "m3lab", "vllm-triton", "vs vLLM", source),
            pm.share_figure(bench_moe.decode_share(table, batch=32), source)]
    for fig in figs:
        _recorded_labels(fig, table)
    table, source = kernel_runs.sparse("cpu")
    for fig in (sp.versus_vllm_figure(sa.versus_vllm(table), source), sp.pair_latency_figure(table, source),
                sp.dense_vs_sparse_figure(table, source), sp.targets_figure(sa.targets(table), source)):
        _recorded_labels(fig, table)


def test_a_live_source_names_the_device_and_this_commit(monkeypatch):
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    table = pd.DataFrame({"device": ["NVIDIA_H200"], "commit": ["unknown"], "date": ["2026-12-01"]})
    src = kernel_runs.Source.of(table, live=True)
    assert src.label == f"measured live on NVIDIA_H200, commit {kernel_runs.checkout_commit()}"
    assert kernel_runs.checkout_commit() != "unknown"   # the tests run in a git checkout


@pytest.mark.parametrize("device", ["gpu", "CUDA", ""])
def test_an_unknown_device_is_refused(device):
    from m3lab.errors import M3LabError
    with pytest.raises(M3LabError, match="device"):
        kernel_runs.resolve_device(device)


def test_auto_without_a_gpu_reads_the_recorded_tables(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert kernel_runs.resolve_device("auto") == "cpu"
    from m3lab.errors import M3LabError
    with pytest.raises(M3LabError, match="no GPU"):
        kernel_runs.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert kernel_runs.resolve_device("auto") == "cuda"
