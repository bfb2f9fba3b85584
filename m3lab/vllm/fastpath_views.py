"""Tables and figures of the fast-path resolver across deployments (for notebook 04 and reports).

:func:`write_up_configurations` names the deployments the write-up discusses plus the variants whose verdicts
matter (AITER off, TP2 with a bf16 index cache, an fp8 index cache, EP4 with fusion asked for, an H200);
:func:`compare` resolves them into one long table; :func:`verdicts` keeps what vLLM refuses or turns off;
:func:`path_matrix` draws the paths as an op x deployment grid (plotly imported only there).
"""
from __future__ import annotations

import pandas as pd

from m3lab.spec.serving import Deployment, deployment, load_preset
from m3lab.vllm.fastpaths import resolve

STATUS_ORDER = ("runs", "off", "skipped", "refused")


def write_up_configurations() -> dict[str, Deployment]:
    """Name -> Deployment: the write-up's presets and the variants that show each verdict."""
    opt = load_preset("mxfp8-tp4-optimised")
    return {
        "MXFP8 TP4 baseline": load_preset("mxfp8-tp4-baseline"),
        "MXFP8 TP4 optimised": opt,
        "optimised, AITER off": opt.with_settings({"aiter": "0"}),
        "optimised, fp8 index cache": opt.with_settings({"index_dtype": "fp8"}),
        "optimised at TP2 (bf16 index)": opt.with_settings({"tp": "2"}),
        "EP4, fusion asked": deployment("minimax-m3-mxfp8", "mi355x", "mxfp8", tp=4, ep=4, fused_shared_expert=True)
        .with_settings({"aiter": "1", "shuffle_kv_cache": "1"}),
        "MXFP4 TP2": load_preset("mxfp4-tp2"),
        "EAGLE3 TP4 (k=3)": load_preset("eagle3-mxfp8-tp4"),
        "H200 BF16 TP4": load_preset("h200-bf16-tp4"),
    }


def compare(configs: dict[str, Deployment], tokens: int = 32, phase: str = "decode") -> pd.DataFrame:
    """One row per (configuration, op, layer kind): decision id, status, path, kernels, decided_by, note."""
    frames = []
    for name, dep in configs.items():
        t = resolve(dep, tokens=tokens, phase=phase).table()
        frames.append(t.assign(config=name))
    out = pd.concat(frames, ignore_index=True)
    return out[["config", "op", "layer_kind", "decision", "status", "path", "kernels", "shape", "decided_by", "note"]]


def verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """The rows where vLLM refuses the deployment or quietly turns a requested path off, with vLLM's reason."""
    rows = table[table["status"].isin(["refused", "off"])]
    return rows.drop_duplicates(["config", "op", "status", "note"])[["config", "op", "status", "note", "decided_by"]]


def path_matrix(table: pd.DataFrame, *, title: str):
    """Heatmap: ops (with layer kind) x configurations, the cell text the path, the colour its status."""
    import plotly.graph_objects as go

    table = table.assign(row=table["op"] + " · " + table["layer_kind"])
    rows = list(dict.fromkeys(table["row"]))
    cols = list(dict.fromkeys(table["config"]))
    cell = table.drop_duplicates(["row", "config"]).set_index(["row", "config"])
    z, text, hover = [], [], []
    for r in rows:
        zr, tr, hr = [], [], []
        for c in cols:
            if (r, c) in cell.index:
                x = cell.loc[(r, c)]
                zr.append(STATUS_ORDER.index(x["status"]))
                tr.append(x["path"])
                hr.append(f"{c}<br>{r}: {x['path']} ({x['status']})<br>{x['kernels']}<br>{x['decided_by']}")
            else:
                zr.append(None)
                tr.append("")
                hr.append(f"{c}<br>{r}: not on this deployment")
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    scale = [[0.0, "#2e7d32"], [0.33, "#f9a825"], [0.66, "#bdbdbd"], [1.0, "#c62828"]]
    fig = go.Figure(go.Heatmap(z=z, x=cols, y=rows, text=text, texttemplate="%{text}", hovertext=hover,
                               hoverinfo="text", colorscale=scale, zmin=0, zmax=3, showscale=True,
                               colorbar=dict(tickvals=[0, 1, 2, 3], ticktext=list(STATUS_ORDER), title="status")))
    fig.update_layout(title=title, height=28 * len(rows) + 200, xaxis_title="deployment",
                      yaxis_title="op · layer kind", yaxis=dict(autorange="reversed"), font=dict(size=10))
    return fig
