"""The sparse-attention and indexer benchmark's recorded table (``traces/bench/sparse_attn.csv``, written by
:mod:`m3lab.bench.sparse_attn`) as notebook 09 reads it: ours vs vLLM per point, the kernels' H200 targets, the
bytes bound of sparse vs dense attention, the page adapter's mapping as a teaching frame, and the attention-side
ops of one decode step from the OpTable (projected).
"""
import pandas as pd
import torch

from ..analysis import repetition as rp
from ..arith import ceil_div
from ..analysis.targets import missing, status_of
from ..bench.sparse_attn import BATCHES, BLOCK, CONTEXTS, D, Q_ROWS, TOPK
from ..bench.table import TRACES_BENCH, read_table
from ..kernels.sparse_attn import reference as attn_ref
from ..serving.step_cost import cost_step
from ..spec.serving import make_deployment
from ..workload.step import EngineStep


def recorded_table(path=None, latest: bool = True):
    """traces/bench/sparse_attn.csv as a DataFrame with B, ctx, q parsed; ``latest``: only the last run's commit."""
    df = read_table(path or TRACES_BENCH / "sparse_attn.csv")
    return df[df["commit"] == df["commit"].iloc[-1]].reset_index(drop=True) if latest and len(df) else df


def versus_vllm(df):
    """Per (op, shape): our and vLLM's µs, speedup (vLLM / ours), our TB/s and fraction of the copy bandwidth."""
    out = []
    for (op, shape), g in df.groupby(["op", "shape"], sort=False):
        by = g.set_index("provider")
        if "ours" not in by.index or "vllm" not in by.index:
            continue
        o, v = by.loc["ours"], by.loc["vllm"]
        out.append({"op": op, "shape": shape, "B": int(o["B"]), "ctx": int(o["ctx"]), "q": int(o["q"]),
                    "ours_us": o["us_p50"], "vllm_us": v["us_p50"], "speedup": v["us_p50"] / o["us_p50"],
                    "ours_tbps": o["tbps"], "ours_frac_copy": o["frac_ceiling"], "vllm_frac_copy": v["frac_ceiling"]})
    return pd.DataFrame(out)


def targets(df):
    """The sparse kernels' H200 targets against the recorded rows: one line each with the figure, the points its title names
    that the rows lack (``missing``), and ``status`` (m3lab.analysis.targets: pass / fail / incomplete) and
    ``met`` (None when incomplete)."""
    vs = versus_vllm(df)
    rows = []
    dec = vs[vs["op"].isin(["sparse_attn", "sparse_indexer", "sparse_pair"])]
    points = [f"B={b},ctx={c},q={q}" for q in Q_ROWS for c in CONTEXTS for b in BATCHES]
    gap = missing(set.intersection(*[set(dec.loc[dec["op"] == op, "shape"]) for op in sorted(set(dec["op"]))]
                                   or [set()]) if len(dec) else [], points, "points")
    worst = dec.loc[dec["speedup"].idxmin()] if len(dec) else None
    rows.append(("never slower than vLLM (decode ops)", "" if worst is None else
                 f"worst {worst['speedup']:.2f}x at {worst['op']} {worst['shape']}", gap,
                 worst is not None and bool(worst["speedup"] >= 1.0)))
    for b in (1, 32):
        r = dec[(dec["op"] == "sparse_pair") & (dec["B"] == b) & (dec["ctx"] == 8192) & (dec["q"] == 1)]
        rows.append((f">= 1.5x indexer + attention, B={b}, 8K", f"{r['speedup'].iloc[0]:.2f}x" if len(r) else "",
                     missing(r["B"], [b], "B"), bool(len(r) and r["speedup"].iloc[0] >= 1.5)))
    r = dec[(dec["op"] == "sparse_attn") & (dec["B"] == 128) & (dec["q"] == 1)]
    rows.append(("attention >= 90% of copy bandwidth at B=128", ", ".join(f"{x:.0%}" for x in r["ours_frac_copy"]),
                 missing(r["ctx"], CONTEXTS, "ctx"), bool((r["ours_frac_copy"] >= 0.9).all())))
    r = dec[(dec["op"] == "sparse_indexer") & (dec["B"] >= 32) & (dec["q"] == 1)]
    rows.append(("indexer >= 90% of copy bandwidth at B >= 32", ", ".join(f"{x:.0%}" for x in r["ours_frac_copy"]),
                 missing(r["shape"], [f"B={b},ctx={c},q=1" for c in CONTEXTS for b in BATCHES if b >= 32], "points"),
                 bool((r["ours_frac_copy"] >= 0.9).all())))
    for op in ("sparse_prefill_attn", "sparse_prefill_indexer"):
        r = vs[vs["op"] == op]
        rows.append((f">= 1.2x on prefill chunks ({op.removeprefix('sparse_prefill_')})",
                     ", ".join(f"{x:.2f}x" for x in r["speedup"]), missing(r["ctx"], CONTEXTS, "ctx"),
                     bool((r["speedup"] >= 1.2).all())))
    out = pd.DataFrame(rows, columns=["target", "measured", "missing", "ok"])
    out["status"] = [status_of(ok, g) for ok, g in zip(out["ok"], out["missing"])]
    out["met"] = pd.Series([{"pass": True, "fail": False}.get(s) for s in out["status"]], dtype=object)
    return out.drop(columns="ok")


def saving_bound(ctx: int, index_bytes_per_token: int = 2 * D) -> dict:
    """Bytes bound of indexer + sparse attention vs dense attention for one decode row at TP4 (one KV head):
    dense reads K+V of every token (4·D bytes in bf16); sparse reads every index key plus the selected K+V."""
    dense = ctx * 4 * D
    sparse = ctx * index_bytes_per_token + min(TOPK, ctx // BLOCK) * BLOCK * 4 * D
    return {"ctx": ctx, "dense_bytes": dense, "sparse_bytes": sparse, "bound_saving": dense / sparse}


def page_mapping_frame(ctx: int = 3000, selected: tuple[int, ...] = (3, 17, 0, 9, 23, 11), seed: int = 0):
    """One decode row's page adapter (plain-torch reference): compact page slot -> physical page-16 id.

    A request of ``ctx`` tokens with its block table in random physical order; ``selected`` are the top-k's
    logical blocks (the own block is appended). Rows: slot, page, logical block, kind (full / tail / unused).
    """
    gen = torch.Generator().manual_seed(seed)
    nblk = ceil_div(ctx, BLOCK)
    table = torch.randperm(4 * nblk, generator=gen)[:nblk].view(1, -1)
    own = (ctx - 1) // BLOCK
    blocks = torch.tensor([[b for b in selected if b < own] + [own] + [-1] * (TOPK - 1 - len(selected))][:1])
    blocks = blocks[:, :TOPK]
    pages, ctx_len = attn_ref.sparse_page_table_ref(blocks, table, torch.zeros(1, dtype=torch.long),
                                                    torch.tensor([ctx - 1]), block_size=BLOCK,
                                                    block_page_stride=2 * BLOCK // 16)
    used = ceil_div(int(ctx_len[0]), 16)
    order = [b for b in blocks[0].tolist() if 0 <= b < own] + [own]
    rows = []
    for slot, page in enumerate(pages[0].tolist()):
        logical = order[slot // 8] if slot < len(order) * 8 else -1
        kind = "unused" if slot >= used and logical < 0 else ("tail" if logical == own else "full")
        if slot >= used and logical >= 0:
            kind = "beyond context"
        rows.append({"slot": slot, "page": page, "logical_block": logical, "kind": kind})
    return pd.DataFrame(rows), int(ctx_len[0])


def indexer_repetition(model: str = "minimax-m3", hardware: str = "mi355x", tp: int = 4, quant: str = "mxfp8",
                       ctx: int = 8192, concurrencies=(1, 128), calibration="default"):
    """Repetition view of the attention-side ops of one decode step at each concurrency (projected from the
    OpTable on ``hardware``): op, µs per call, µs per step, share of the step."""
    dep = make_deployment(None, model=model, hardware=hardware, tp=tp, quant=quant)
    frames = []
    for c in concurrencies:
        step = EngineStep.decode(c, ctx)
        rep = rp.repetition(cost_step(dep, step, calibration=calibration),
                            output_tokens=c, active_requests=c)
        rep = rep[rep["op"].isin(["indexer", "topk", "attention", "indexer_qk_proj", "qkv_proj"])].copy()
        rep["concurrency"] = c
        frames.append(rep[["concurrency", "op", "calls_per_step", "us_per_call", "us_per_step", "share", "bound"]])
    return pd.concat(frames, ignore_index=True)
