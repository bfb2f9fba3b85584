"""Sparse-attention and indexer benchmark: our kernels vs vLLM 0.33.0's Triton kernels, dense SDPA and
gather-then-attend, side by side in one run (``m3lab bench sparse --out DIR``: :func:`run`, GPU only). The
recorded table is read by m3lab/bench_analysis/sparse.py.

M3 at TP4 on one rank (:func:`m3lab.optable.kernel_shapes.sparse_problem`): ``HQ`` query heads : ``HKV`` KV head,
one index head, head dim ``D``, block ``BLOCK``, top-``TOPK`` blocks, bf16. Points: B
requests × context × query rows per request (1 = decode, 4 = 1 + 3 verification rows). Ops (column ``op``):

- ``sparse_attn``: attention over the selected blocks. Providers ``ours`` (vLLM's Triton layout
  ``[NB, 1, 128, 256]``), ``ours-page16`` (AITER's page-16 views through the page adapter's table), ``vllm``
  (``minimax_m3_sparse_attn_decode``: ``_gqa_sparse_decode_kernel`` + merge), ``dense-sdpa`` (torch SDPA over
  the whole context), ``gather-attend`` (torch: gather the selected blocks, then SDPA over them).
  Bytes: the selected K+V the kernel reads (each row its own blocks); gather-attend: read + write + read.
  dense-sdpa and gather-attend put no causal mask among verification rows (the same bytes).
- ``sparse_indexer``: scores + top-16. ``ours`` (bf16 index keys), ``ours-fp8`` (e4m3 keys: half the bytes),
  ``ours-table`` (also emitting the page-16 table), ``vllm`` (``minimax_m3_index_decode``: score + partial +
  merge top-k), ``vllm-amd`` (vLLM's AMD file on its generic path: score + fused top-k). Bytes: index keys,
  read once per request.
- ``sparse_pair``: indexer + attention of one layer: ``ours``, ``ours-fp8idx``, ``ours-page16`` (the top-k
  emits the table), ``vllm``; and ``ours-sharing4-derived`` = indexer / 4 + attention (index sharing with
  ``index_topk_freq`` 4: one computing layer per four), computed from the measured rows.
- ``sparse_prefill_attn`` / ``sparse_prefill_indexer``: one request, a 1024-token chunk at the end of the
  context: ours vs vLLM (``_gqa_sparse_fwd_kernel``; ``_index_block_score_kernel`` + ``_topk_index_kernel``).

Timing: CUDA-graph replay of >= 24 calls per graph for every provider, each call on its own copy of the caches
(physical blocks of a shared pool) so one replay streams more than twice the L2. Rows go to the long table of
``m3lab/bench/table.py``; ``shape`` is ``B=..,ctx=..,q=..``. ``common_frac`` (in ``extra.csv``): the share of
selected blocks the rows of a request have in common.
"""
import csv
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..kernels.indexer import launcher as index_launcher
from ..kernels.sparse_attn import launcher as attn_launcher
from ..kernels.sparse_attn import reference as attn_ref
from ..optable.kernel_shapes import sparse_problem
from ..vllm_src.imports import m3_module
from .ceilings import Ceilings, measure_ceilings
from .session_log import session_log
from .table import BenchRow, append_rows, commit_id, today
from .timing import Timing, graph_time, l2_bytes

M3 = sparse_problem("minimax-m3", tp=4)     # one TP4 rank of MiniMax M3
HQ, HKV, D, BLOCK, TOPK = M3.heads_q, M3.heads_kv, M3.head_dim, M3.block, M3.topk
BATCHES = (1, 32, 128)
CONTEXTS = (8192, 65536)
Q_ROWS = (1, 4)
MIN_CALLS = 24
PREFILL_CHUNK = 1024


@dataclass
class Point:
    """One benchmark point's operands: ``copies`` problems sharing pools of physical blocks."""
    b: int
    ctx: int
    q: int
    kv_pool: torch.Tensor          # [NB, 1, 128, 256] bf16 (vLLM's Triton layout)
    index_pool: torch.Tensor       # [NB, 128, 128] bf16
    index_pool8: torch.Tensor      # fp8 e4m3 copy
    tables: list[torch.Tensor]     # per copy [B, ctx/128] int32
    seq_lens: torch.Tensor
    cu: torch.Tensor
    qs: list[torch.Tensor]         # per copy [T, 16, 128]
    iqs: list[torch.Tensor]        # per copy [T, 1, 128]
    topks: list[torch.Tensor]      # per copy [1, T, 16] int32 (our indexer's selection on these inputs)
    page_tables: list[index_launcher.Selection]

    @property
    def rows(self) -> int:
        return self.b * self.q


def _copies(bytes_per_copy: float, device) -> int:
    return max(1, math.ceil(2 * l2_bytes(device) / max(bytes_per_copy, 1)) + 1)


def selected_kv_bytes(b: int, ctx: int, q: int) -> float:
    """K+V bytes of the selected blocks, every row reading its own (bf16; the tail block only up to the row)."""
    n = min(TOPK, ctx // BLOCK)
    return b * q * n * BLOCK * 2 * D * HKV * 2


def index_key_bytes(b: int, ctx: int, elt: int = 2) -> float:
    return b * ctx * D * elt


def make_point(b: int, ctx: int, q: int, device) -> Point:
    copies = _copies(min(selected_kv_bytes(b, ctx, q), index_key_bytes(b, ctx)), device)
    nblk = ctx // BLOCK
    total = copies * b * nblk
    kv_pool = torch.randn(total, HKV, BLOCK, 2 * D, device=device, dtype=torch.bfloat16)
    index_pool = torch.randn(total, BLOCK, D, device=device, dtype=torch.bfloat16)
    perm = torch.randperm(total, device=device).to(torch.int32).view(copies, b, nblk)
    seq_lens = torch.full((b,), ctx, dtype=torch.int32, device=device)
    cu = torch.arange(0, b * q + 1, q, dtype=torch.int32, device=device)
    t = b * q
    qs = [torch.randn(t, HQ, D, device=device, dtype=torch.bfloat16) for _ in range(copies)]
    iqs = [torch.randn(t, 1, D, device=device, dtype=torch.bfloat16) for _ in range(copies)]
    p = Point(b, ctx, q, kv_pool, index_pool, index_pool.to(torch.float8_e4m3fn), list(perm), seq_lens, cu, qs,
              iqs, [], [])
    for c in range(copies):
        sel = index_launcher.indexer_topk(iqs[c], index_pool, p.tables[c], seq_lens, cu, topk=TOPK, max_q_len=q,
                                          max_seq_len=ctx, emit_page_table=True, block_page_stride=BLOCK // 16 * 2)
        p.topks.append(sel.topk)
        p.page_tables.append(sel)
    return p


def common_fraction(p: Point) -> float:
    """Mean over requests of |blocks selected by every row| / |blocks selected by any row| (q > 1)."""
    if p.q == 1:
        return 1.0
    sel = p.topks[0][0].view(p.b, p.q, TOPK).cpu()
    fr = []
    for r in range(p.b):
        sets = [set(x for x in row.tolist() if x >= 0) for row in sel[r]]
        fr.append(len(set.intersection(*sets)) / max(1, len(set.union(*sets))))
    return sum(fr) / len(fr)


def vllm_modules():
    """vLLM's sparse-attention, index-top-k and AMD index-top-k op modules (the peers)."""
    return (m3_module("common.ops.sparse_attn"), m3_module("common.ops.index_topk"),
            m3_module("amd.ops.index_topk"))


def _cycle(p: Point, make):
    n = max(MIN_CALLS, len(p.tables))
    return [make(c % len(p.tables)) for c in range(n)]


def attention_calls(p: Point, provider: str, vllm_mods=None):
    scale = D ** -0.5
    planes = attn_ref.triton_planes(p.kv_pool)
    if provider == "ours":
        return _cycle(p, lambda c: lambda: attn_launcher.sparse_attention(
            p.qs[c], *planes, p.topks[c], p.tables[c], p.seq_lens, p.cu, scale=scale, max_q_len=p.q,
            uniform_rows=True))
    if provider == "ours-page16":
        k16, v16 = _page16_views(p)
        return _cycle(p, lambda c: lambda: attn_launcher.page16_attention(
            p.qs[c], k16, v16, p.page_tables[c].table, p.page_tables[c].ctx, scale=scale, block_size=BLOCK))
    if provider == "vllm":
        sa = vllm_mods[0]
        outs = [torch.empty_like(x) for x in p.qs]
        return _cycle(p, lambda c: lambda: sa.minimax_m3_sparse_attn_decode(
            p.qs[c], p.kv_pool, p.topks[c], p.tables[c], p.seq_lens, HKV, scale, outs[c], p.q))
    if provider == "dense-sdpa":
        kd, vd = _dense(p)
        qd = [x.view(p.b, p.q, HQ, D).transpose(1, 2) for x in p.qs]
        return _cycle(p, lambda c: lambda: torch.nn.functional.scaled_dot_product_attention(
            qd[c], kd[c % len(kd)], vd[c % len(vd)], enable_gqa=True))
    if provider == "gather-attend":
        req = torch.arange(p.rows, device=p.cu.device) // p.q

        def call(c):
            def run():
                phys = p.tables[c][req[:, None], p.topks[c][0].clamp(min=0).long()]          # [T, 16]
                kv = p.kv_pool[phys.long()].view(p.rows, TOPK * BLOCK, 2 * D)           # gather: [T, 2048, 256]
                qd = p.qs[c].view(p.rows, 1, HQ, D).transpose(1, 2)
                k = kv[..., :D].unsqueeze(1)
                v = kv[..., D:].unsqueeze(1)
                return torch.nn.functional.scaled_dot_product_attention(qd, k, v, enable_gqa=True)
            return run
        return _cycle(p, call)
    raise ValueError(provider)


def _page16_views(p: Point):
    """AITER page-16 views over the same bytes count (a pool laid out as K and V pages sharing a block)."""
    if not hasattr(p, "_p16"):
        nb = p.kv_pool.shape[0]
        raw = torch.randn(nb * 16, HKV, 16 * D, device=p.kv_pool.device, dtype=torch.bfloat16)
        p._p16 = (raw.view(nb * 16, HKV, D // 8, 16, 8), raw.view(nb * 16, HKV, 2, D, 8)[8:])
    return p._p16


def _dense(p: Point):
    """Contiguous K, V [B, 1, ctx, D] copies for SDPA (enough copies to exceed the L2)."""
    n = min(len(p.tables), _copies(2 * p.b * p.ctx * D * 2, p.kv_pool.device))
    ks = [torch.randn(p.b, HKV, p.ctx, D, device=p.kv_pool.device, dtype=torch.bfloat16) for _ in range(n)]
    vs = [torch.randn_like(k) for k in ks]
    return ks, vs


def indexer_calls(p: Point, provider: str, vllm_mods=None):
    if provider in ("ours", "ours-fp8", "ours-table"):
        pool = p.index_pool8 if provider == "ours-fp8" else p.index_pool
        table = provider == "ours-table"
        return _cycle(p, lambda c: lambda: index_launcher.indexer_topk(
            p.iqs[c], pool, p.tables[c], p.seq_lens, p.cu, topk=TOPK, max_q_len=p.q, max_seq_len=p.ctx,
            emit_page_table=table))
    mod = vllm_mods[1] if provider == "vllm" else vllm_mods[2]
    outs = [torch.empty(1, p.rows, TOPK, dtype=torch.int32, device=p.cu.device) for _ in p.tables]
    return _cycle(p, lambda c: lambda: mod.minimax_m3_index_decode(
        p.iqs[c], p.index_pool, p.tables[c], p.seq_lens, p.ctx, TOPK, 0, 1, HKV, p.q, p.q, out=outs[c]))


def pair_calls(p: Point, provider: str, vllm_mods=None):
    scale = D ** -0.5
    planes = attn_ref.triton_planes(p.kv_pool)
    if provider in ("ours", "ours-fp8idx"):
        pool = p.index_pool8 if provider == "ours-fp8idx" else p.index_pool

        def call(c):
            def run():
                sel = index_launcher.indexer_topk(p.iqs[c], pool, p.tables[c], p.seq_lens, p.cu, topk=TOPK,
                                                  max_q_len=p.q, max_seq_len=p.ctx)
                return attn_launcher.sparse_attention(p.qs[c], *planes, sel.topk, p.tables[c], p.seq_lens, p.cu,
                                                      scale=scale, max_q_len=p.q, uniform_rows=True)
            return run
        return _cycle(p, call)
    if provider == "ours-page16":
        k16, v16 = _page16_views(p)

        def call(c):
            def run():
                sel = index_launcher.indexer_topk(p.iqs[c], p.index_pool, p.tables[c], p.seq_lens, p.cu, topk=TOPK,
                                                  max_q_len=p.q, max_seq_len=p.ctx, emit_page_table=True)
                return attn_launcher.page16_attention(p.qs[c], k16, v16, sel.table, sel.ctx, scale=scale,
                                                      block_size=BLOCK)
            return run
        return _cycle(p, call)
    sa, it, _ = vllm_mods
    outs = [torch.empty_like(x) for x in p.qs]

    def call(c):
        def run():
            topk = it.minimax_m3_index_decode(p.iqs[c], p.index_pool, p.tables[c], p.seq_lens, p.ctx, TOPK, 0, 1,
                                              HKV, p.q, p.q)
            sa.minimax_m3_sparse_attn_decode(p.qs[c], p.kv_pool, topk, p.tables[c], p.seq_lens, HKV, scale, outs[c],
                                             p.q)
        return run
    return _cycle(p, call)


def _row(op, provider, shape, timing, nbytes, ceilings: Ceilings, device) -> BenchRow:
    t = timing.us_p50
    floor = nbytes / (ceilings.copy_tbps * 1e12) * 1e6
    return BenchRow(op, provider, shape, "bf16", timing.us_p20, t, timing.us_p80, 0.0, nbytes / t / 1e6,
                    floor / t, f"copy_tbps={ceilings.copy_tbps:.3g}", device, commit_id(), today())


def bench_point(b, ctx, q, ceilings, vllm_mods, log, rep_ms=40.0) -> tuple[list[BenchRow], dict]:
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device).replace(" ", "_")
    p = make_point(b, ctx, q, device)
    shape = f"B={b},ctx={ctx},q={q}"
    sel_bytes, idx_bytes = selected_kv_bytes(b, ctx, q), index_key_bytes(b, ctx)
    plan = [("sparse_attn", attention_calls, ("ours", "ours-page16", "vllm", "dense-sdpa", "gather-attend")),
            ("sparse_indexer", indexer_calls, ("ours", "ours-fp8", "ours-table", "vllm", "vllm-amd")),
            ("sparse_pair", pair_calls, ("ours", "ours-fp8idx", "ours-page16", "vllm"))]
    rows, times = [], {}
    for op, make, providers in plan:
        for prov in providers:
            try:
                timing = graph_time(make(p, prov, vllm_mods), rep_ms=rep_ms)
            except Exception as err:   # one provider failing must not lose the point
                log(f"{shape} {op} {prov} failed: {type(err).__name__}: {str(err)[:300]}")
                continue
            nbytes = {"sparse_attn": sel_bytes, "sparse_indexer": idx_bytes, "sparse_pair": sel_bytes + idx_bytes}[op]
            if op == "sparse_attn" and prov == "dense-sdpa":
                nbytes = 2 * b * ctx * D * 2
            elif op == "sparse_attn" and prov == "gather-attend":
                nbytes = 3 * sel_bytes
            elif prov in ("ours-fp8", "ours-fp8idx"):
                nbytes -= idx_bytes / 2
            rows.append(_row(op, prov, shape, timing, nbytes, ceilings, name))
            times[(op, prov)] = timing
    if ("sparse_indexer", "ours") in times and ("sparse_attn", "ours") in times:
        ti, ta = times[("sparse_indexer", "ours")], times[("sparse_attn", "ours")]
        t = Timing(*(a + i / 4 for a, i in zip((ta.us_p20, ta.us_p50, ta.us_p80), (ti.us_p20, ti.us_p50, ti.us_p80))))
        rows.append(_row("sparse_pair", "ours-sharing4-derived", shape, t, sel_bytes + idx_bytes / 4, ceilings, name))
    extra = {"shape": shape, "common_frac": common_fraction(p), "copies": len(p.tables)}
    log(f"{shape}: " + " ".join(f"{r.op.removeprefix('sparse_')}/{r.provider}:{r.us_p50:.1f}" for r in rows))
    del p
    torch.cuda.empty_cache()
    return rows, extra


def bench_prefill(ctx, ceilings, vllm_mods, log, rep_ms=40.0) -> list[BenchRow]:
    """One request, a PREFILL_CHUNK-token chunk ending at ``ctx``: attention and indexer, ours vs vLLM."""
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device).replace(" ", "_")
    q = PREFILL_CHUNK
    p = make_point(1, ctx, q, device)
    sa, it, _ = vllm_mods
    scale = D ** -0.5
    planes = attn_ref.triton_planes(p.kv_pool)
    prefix = p.seq_lens - q
    outs = [torch.empty_like(x) for x in p.qs]
    calls = {
        ("sparse_prefill_attn", "ours"): lambda c: lambda: attn_launcher.sparse_attention(
            p.qs[c], *planes, p.topks[c], p.tables[c], p.seq_lens, p.cu, scale=scale, max_q_len=q),
        ("sparse_prefill_attn", "vllm"): lambda c: lambda: sa.minimax_m3_sparse_attn(
            p.qs[c], p.kv_pool, p.topks[c], p.tables[c], p.cu, p.seq_lens, prefix, q, HKV, scale, outs[c]),
        ("sparse_prefill_indexer", "ours"): lambda c: lambda: index_launcher.indexer_topk(
            p.iqs[c], p.index_pool, p.tables[c], p.seq_lens, p.cu, topk=TOPK, max_q_len=q, max_seq_len=ctx),
        ("sparse_prefill_indexer", "vllm"): lambda c: lambda: it.minimax_m3_index_topk(
            it.minimax_m3_index_score(p.iqs[c], p.index_pool, p.tables[c], p.cu, p.seq_lens, prefix, q, ctx, HKV),
            p.cu, prefix, q, TOPK, 0, 1),
    }
    rows = []
    shape = f"B=1,ctx={ctx},q={q}"
    for (op, prov), make in calls.items():
        try:
            timing = graph_time(_cycle(p, make), rep_ms=rep_ms)
        except Exception as err:
            log(f"{shape} {op} {prov} failed: {type(err).__name__}: {str(err)[:300]}")
            continue
        nbytes = selected_kv_bytes(1, ctx, q) if op.endswith("attn") else index_key_bytes(1, ctx)
        rows.append(_row(op, prov, shape, timing, nbytes, ceilings, name))
    log(f"{shape}: " + " ".join(f"{r.op.removeprefix('sparse_')}/{r.provider}:{r.us_p50:.1f}" for r in rows))
    return rows


def run(out: str = "out", batches=BATCHES, contexts=CONTEXTS, q_rows=Q_ROWS, deadline_s: float = 400.0,
        prefill: bool = True, log=None) -> Path:
    """Every benchmark point (until ``deadline_s``, counted from the start) appended to ``OUT/sparse_attn.csv``,
    the points' extras to ``OUT/extra.csv``; ``log`` default: printed and appended to ``OUT/bench_log.txt``
    -> the table's path."""
    t0 = time.time()
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    log = log or session_log(outdir / "bench_log.txt", t0)
    ceilings = measure_ceilings(torch.device("cuda"))
    log(f"ceilings: copy {ceilings.copy_tbps:.3f} TB/s, mm {ceilings.mm_tflops:.0f} TFLOP/s")
    mods = vllm_modules()
    log("vllm imported")
    table, extras = outdir / "sparse_attn.csv", []
    points = [(b, ctx, q) for q in q_rows for ctx in contexts for b in batches]
    for b, ctx, q in points:
        if time.time() - t0 > deadline_s:
            log(f"deadline: skipping B={b} ctx={ctx} q={q}")
            continue
        rows, extra = bench_point(b, ctx, q, ceilings, mods, log)
        append_rows(table, rows)
        extras.append(extra)
    for ctx in contexts if prefill else ():
        if time.time() - t0 > deadline_s:
            log(f"deadline: skipping prefill ctx={ctx}")
            continue
        append_rows(table, bench_prefill(ctx, ceilings, mods, log))
    with (outdir / "extra.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["shape", "common_frac", "copies"])
        w.writeheader()
        w.writerows(extras)
    log("done")
    return table
