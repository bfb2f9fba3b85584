"""Shape histograms over a workload: consistency with the step-by-step schedule (their speed is printed by
``m3lab bench shapes``, not timed here)."""
import csv

import numpy as np

from m3lab.spec.serving import make_deployment
from m3lab.workload import Scheduler, SchedulerConfig, Workload
from m3lab.analysis.shapes import query_positions, schedule, shape_histograms, sharding_table


def _random_workload(rng):
    n = int(rng.integers(3, 12))
    return Workload(1, 1, int(rng.integers(1, 5)), prompt_lens=tuple(rng.integers(1, 700, n)),
                    output_lens=tuple(rng.integers(1, 60, n)))


def test_histograms_match_step_by_step():
    rng = np.random.default_rng()
    wl = _random_workload(rng)
    cfg = SchedulerConfig(max_num_batched_tokens=int(rng.integers(64, 512)))
    steps = list(Scheduler(cfg).steps(wl))
    mini = make_deployment(None, model="minimax-m3-mini", tp=2, quant="bf16", isl=1024, osl=64)  # its context: 4K
    rep = shape_histograms(mini, runs=schedule(wl, cfg))
    assert rep.num_steps == len(steps)
    qkv = rep.gemm_m[(rep.gemm_m.op == "o_proj")]
    expected = np.bincount([s.num_tokens for s in steps])
    assert dict(zip(qkv.m, qkv.steps)) == {m: c for m, c in enumerate(expected) if c}
    head = rep.gemm_m[rep.gemm_m.op == "lm_head"]
    assert dict(zip(head.m, head.steps)) == {m: c for m, c in enumerate(np.bincount([s.num_reqs for s in steps])) if c}
    # query positions: every (request, position) computed exactly once
    positions = np.zeros(2000, np.int64)
    for s in steps:
        for n, c in zip(s.new_tokens, s.context_lens):
            positions[c - n:c] += 1
    dec, pre = query_positions(schedule(wl, cfg))
    both = np.zeros(2000, np.int64)
    both[:dec.size] += dec
    both[:pre.size] += pre
    assert (both == positions).all()
    assert rep.selected_blocks.queries.sum() == positions.sum()
    assert rep.attention_ctx.queries.sum() == positions.sum()


def test_distinct_gemms_tp4_match_aiter(shared_dir):
    aiter = {(int(r["N"]), int(r["K"])) for r in
             csv.DictReader(open(shared_dir / "data/aiter/a8w8_bpreshuffle_tuned_gemm_minimax_m3.csv"))}
    # AITER's tuned set has no separate shared-expert GEMMs: it was tuned with shared-expert fusion asked for
    rep = shape_histograms(make_deployment(None, tp=4, quant="bf16", fused_shared_expert=True, isl=2048, osl=16,
                                           concurrency=8, num_prompts=32))
    d = rep.distinct_gemms
    assert set(zip(d.n, d.k)) == aiter | {(128, 6144), (50016, 6144)}
    g = rep.distinct_grouped
    assert set(zip(g.experts, g.topk, g.hidden, g.inter)) == {(129, 5, 6144, 768)}
    # one draw of per-expert counts per distinct token count, weighted by steps: 128 routed experts per step
    assert rep.tokens_per_expert.expert_steps.sum() == 128 * rep.num_steps


def test_sharding_table_tp8_replicates_kv():
    t = sharding_table("minimax-m3").set_index("tp")
    assert t.loc[8, "kv_replication"] == 2 and t.loc[8, "heads_kv"] == 1 and t.loc[4, "kv_replication"] == 1
    assert t.loc[8, "index_key_replication"] == 8


def test_attention_ctx_histogram_y_axis_starts_at_zero():
    import pandas as pd

    from m3lab.plots.shapes import attention_ctx_figure

    att = pd.DataFrame({"phase": ["decode", "decode", "prefill"], "ctx": [300, 900, 128], "queries": [5, 7, 3]})
    fig = attention_ctx_figure(att, {"model": "m", "isl": 1, "osl": 1, "concurrency": 1})
    assert fig.layout.yaxis.type == "linear" and fig.layout.yaxis.rangemode == "tozero"
    assert sorted(v for tr in fig.data for v in tr.y) == [3, 5, 7]


def test_sharding_table_fused_projection_widths():
    t = sharding_table("minimax-m3").set_index("tp")
    assert t.loc[4, "qkv_sparse"] == 2560 and t.loc[1, "qkv_sparse"] == 9856 and t.loc[4, "qkv_dense"] == 2304
