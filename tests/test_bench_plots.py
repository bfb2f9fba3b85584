"""The notebook-07/05 views: committed H200 table -> analysis DataFrames -> plotly figures."""
import pandas as pd

from m3lab.bench import analysis
from m3lab.bench.gemm import gemm_table
from m3lab.kernels.gemm import tables


def test_committed_table_views_and_figures(repo_dir):
    from m3lab.plots import kernels as kplots
    table = gemm_table("cpu")
    assert analysis.copy_ceiling(table) > 3.0                      # measured copy TB/s quoted in the table
    targets = analysis.gemm_targets(table)
    assert len(targets) == 9 and targets["measured"].notna().all()
    cfgs = analysis.tuned_configs("NVIDIA_H200")
    assert set(cfgs["w_format"]) == {"bf16", "fp8", "mxfp8", "mxfp4", "mxfp8_layout", "mxfp4_layout"}
    assert set(cfgs["kernel"]) <= set(tables.KERNELS)
    figs = [kplots.speedup_figure(analysis.speedups(table)),
            kplots.bandwidth_figure(table, analysis.copy_ceiling(table)),
            kplots.tile_gain_figure(analysis.tile_gain(table)),
            kplots.targets_table_figure(targets)]
    assert all("measured" in f.layout.title.text for f in figs)
    gates = pd.read_csv(repo_dir / "traces" / "gates" / "gates_cuda_NVIDIA_H200.csv")
    fig = kplots.gate_errors_figure(gates)
    assert "NVIDIA_H200" in fig.layout.title.text and len(fig.data) >= 1
