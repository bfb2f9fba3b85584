"""Figures of notebook 09 (sparse attention and the lightning indexer): the page adapter (analytic), our kernels
against vLLM's (measured live or recorded: ``source``, :class:`m3lab.bench_analysis.runs.Source` or its label),
the bytes bound (analytic) and the indexer's share of a decode step (projected)."""
from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from m3lab.plots.kernels import provenance, targets_table


def page_adapter_figure(pages: pd.DataFrame, ctx: int, position: int) -> go.Figure:
    """One decode row's compact page slot -> physical page-16 id (``m3lab.bench_analysis.sparse.page_mapping_frame``)."""
    return px.scatter(pages, x="slot", y="page", color="kind", hover_data=["logical_block"],
                      title=f"Sparse page adapter, one decode row at position {position}: compact page slot → "
                            f"physical page-16 id (context {ctx} tokens; analytic: the plain-torch reference)")


def versus_vllm_figure(vs: pd.DataFrame, source) -> go.Figure:
    """Speed-up of our kernels over vLLM's per point (``m3lab.bench_analysis.sparse.versus_vllm``)."""
    fig = px.bar(vs, x="shape", y="speedup", color="op", barmode="group",
                 title=f"Our kernels vs vLLM 0.33.0's Triton kernels: speed-up = vLLM µs / our µs (×) — "
                       f"{provenance(source)}, CUDA-graph replay")
    fig.add_hline(y=1.0, line_dash="dot")
    return fig


def pair_latency_figure(table: pd.DataFrame, source) -> go.Figure:
    """Indexer + attention of one layer, µs per call, by provider and point."""
    return px.bar(table[table["op"] == "sparse_pair"], x="shape", y="us_p50", color="provider", barmode="group",
                  log_y=True, labels={"us_p50": "µs per call (p50)"},
                  title=f"Indexer + attention of one layer, µs per call (sharing4-derived = indexer/4 + attention) — "
                        f"{provenance(source)}")


def dense_vs_sparse_figure(table: pd.DataFrame, source) -> go.Figure:
    """Dense SDPA over the whole context against indexer + sparse attention, µs per call."""
    pair = (table["op"] == "sparse_pair") & table["provider"].isin(["ours", "vllm", "ours-fp8idx"])
    return px.bar(table[(table["provider"] == "dense-sdpa") | pair], x="shape", y="us_p50", color="provider",
                  barmode="group", log_y=True, labels={"us_p50": "µs per call (p50)"},
                  title=f"Dense SDPA over the whole context vs indexer + sparse attention, µs per call — "
                        f"{provenance(source)}")


def bytes_bound_figure(contexts=(8192, 65536)) -> go.Figure:
    """The most indexer + sparse attention can save over dense attention, by bytes (one decode row at TP4), for
    bf16, fp8 and shared (every 4th layer) index keys (``m3lab.bench_analysis.sparse.saving_bound``)."""
    from m3lab.bench_analysis.sparse import D, saving_bound  # local: pulls in torch, triton
    keys = (("bf16", 2 * D), ("fp8", D), ("bf16, shared by 4 layers", 2 * D // 4))
    bounds = pd.DataFrame([{**saving_bound(c, b), "index keys": name} for c in contexts for name, b in keys])
    return px.bar(bounds, x="ctx", y="bound_saving", color="index keys", barmode="group",
                  labels={"bound_saving": "bytes of dense / bytes of sparse (×)", "ctx": "context (tokens)"},
                  title="Bytes bound of the saving of indexer + sparse attention over dense attention, one decode "
                        "row at TP4 (analytic, from the shapes; ×)")


def indexer_share_figure(rep: pd.DataFrame, model: str, quant: str, ctx: int, hardware: str) -> go.Figure:
    """Share of one decode step by attention-side op at each concurrency
    (``m3lab.bench_analysis.sparse.indexer_repetition``; projected)."""
    return px.bar(rep, x="op", y="share", color="op", facet_col="concurrency",
                  title=f"Share of one decode step by op, concurrency {' vs '.join(map(str, rep.concurrency.unique()))}"
                        f" ({model} TP4 {quant}, context {ctx}; projected for {hardware} from the OpTable)")


def targets_figure(targets: pd.DataFrame, source) -> go.Figure:
    """The sparse-attention targets (``m3lab.bench_analysis.sparse.targets``) as a table figure."""
    return targets_table(targets, source, "Sparse-attention and indexer targets")
