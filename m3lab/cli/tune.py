"""``m3lab tune OP``: time candidate launch configs on the GPU and write the op's tuned table.

    m3lab tune gemm [--model minimax-m3 --tp 4 | --shapes 2560x6144,...] [--formats bf16,mxfp8,mxfp4,mxfp4_layout]
                    [--ms 1,8,...] [--budget-s 240] [--json]                 -> kernels/gemm/configs/
    m3lab tune moe [--ts 1,8,32,128,512,2048,8192] [--budget-s 300] [--out DIR] [--json]
                                                                             -> kernels/moe/configs/ (vLLM's format)

Sparse attention and the indexer launch one fixed config each (kernels/sparse_attn, kernels/indexer): no table
to tune. Every option is checked before any work starts (bad input: one line naming the option, exit 2).
"""
from __future__ import annotations

from typing import Optional

import typer

from m3lab.cli.bench import int_list, need_gpus, one_of
from m3lab.cli.output import echo_json
from m3lab.errors import M3LabError
from m3lab.optable.kernel_shapes import model_gemm_shapes

tune_app = typer.Typer(help="Tune kernel launch tables on the GPU (writes kernels/<op>/configs/). Ops: gemm, moe "
                            "(sparse attention and the indexer have no table).", no_args_is_help=True)


def parse_shapes(text: str | None, model: str, tp: int) -> tuple[tuple[int, int], ...]:
    """``"2560x6144,6144x2048"`` -> ((2560, 6144), (6144, 2048)); None -> the model's GEMMs from the OpTable."""
    if not text:
        return model_gemm_shapes(model, tp)
    try:
        shapes = tuple(tuple(int(v) for v in s.lower().split("x")) for s in text.split(","))
    except ValueError:
        shapes = ((),)
    if any(len(s) != 2 or min(s) <= 0 for s in shapes):
        raise M3LabError(f"shapes: {text!r} is not a list like 2560x6144,6144x2048 (N x K)", field="shapes")
    return shapes


@tune_app.command("gemm")
def tune_gemm_cmd(shapes: Optional[str] = typer.Option(None, help="N x K list (default: the model's GEMMs from the OpTable)"),
                  model: str = typer.Option("minimax-m3", help="model whose OpTable gives the shapes"),
                  tp: int = typer.Option(4, help="tensor-parallel size of those shapes"),
                  formats: str = typer.Option("bf16,mxfp8,mxfp4",
                                              help="weight formats (+ mxfp8_layout, mxfp4_layout: the decode layout)"),
                  ms: Optional[str] = typer.Option(None, help="token counts M to tune (default decode+prefill set)"),
                  budget_s: float = typer.Option(240.0, help="stop after this many seconds"),
                  config_dir: Optional[str] = typer.Option(None, help="where to write tables (default kernels/gemm/configs)"),
                  as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Benchmark candidate GEMM configs at the model's shapes on the GPU and write the tables."""
    from m3lab.kernels.gemm.tables import CONFIG_DIR  # local: pulls in torch
    from m3lab.tune import gemm as tuner  # local: pulls in pandas, torch, triton
    fmts = one_of(formats, tuner.TUNABLE_FORMATS, "formats")
    m_list = int_list(ms, "ms") if ms else tuner.DECODE_MS + tuner.PREFILL_MS
    nk = parse_shapes(shapes, model, tp)
    need_gpus(1, "tune gemm")
    df = tuner.tune_gemm(nk, fmts, m_list, config_dir=config_dir or CONFIG_DIR,
                         budget_s=budget_s, log=lambda s: typer.echo(s, err=as_json))   # --json: progress on stderr
    if as_json:
        echo_json({"timings": len(df), "ok": int(df["us"].notna().sum()) if len(df) else 0})


@tune_app.command("moe")
def tune_moe_cmd(ts: str = typer.Option("1,8,32,128,512,2048,8192", help="token counts T to tune"),
                 budget_s: float = typer.Option(300.0, help="stop timing after this many seconds"),
                 out: Optional[str] = typer.Option(None, help="also write every timing (moe_tune.csv) and the table "
                                                               "(moe_configs.json) into this folder"),
                 as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Time the grouped-MoE candidates on one TP4 rank of M3 (balanced routing) and write the bf16 table."""
    if budget_s <= 0:
        raise M3LabError(f"budget-s: {budget_s} must be positive", field="budget-s")
    ts_ = int_list(ts, "ts")
    need_gpus(1, "tune moe")
    from pathlib import Path

    import pandas as pd

    from m3lab.tune import moe as tuner  # local: pulls in pandas, torch, triton
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
    trials = tuner.tune_table(ts_, budget_s=budget_s, outdir=out, log=lambda s: typer.echo(s, err=as_json))
    if out:
        pd.DataFrame(trials).to_csv(Path(out) / "moe_tune.csv", index=False)
    if as_json:
        echo_json({"timings": len(trials), "tuned_T": sorted({t["T"] for t in trials})})


def register(app: typer.Typer) -> None:
    app.add_typer(tune_app, name="tune")
