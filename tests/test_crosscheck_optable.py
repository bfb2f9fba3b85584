"""Acceptance 2: tracing full-width M3 on the meta device reproduces the OpTable's shapes.

Dense GEMMs (m, n, k), grouped GEMMs (experts, top-k, hidden, inter, routed tokens, m/n/k) and
attention / indexer query and context shapes, for a prefill step and a decode step, all 60 layers.
"""
import numpy as np
import pytest
import torch

from m3lab.capture.reference import build_traced_model
from m3lab.capture.crosscheck import compare_with_optable, traced_shapes
from m3lab.optable import build_optable
from m3lab.spec.plan import ParallelPlan
from m3lab.workload.step import EngineStep


def _trace_and_table(plan, steps, layers=None):
    m = build_traced_model("minimax-m3", plan, device="meta", layers=layers)
    cache = m.new_cache(sum(-(-sum(col) // 128) for col in zip(*steps)) + 4)
    ctx = [0] * len(steps[0])
    results = []
    for s in steps:
        m.dispatcher.records.clear()
        m.step(cache, [(r, torch.zeros(n, dtype=torch.long)) for r, n in enumerate(s)])
        ctx = [c + n for c, n in zip(ctx, s)]
        spec = m.model.name
        table = build_optable(spec, plan, "bf16", EngineStep(np.array(s), np.array(ctx)))
        if layers is not None:
            table = table[table.layer < layers]
        results.append((traced_shapes(m.dispatcher.records), table))
    return results


@pytest.mark.slow
def test_full_m3_tp4_prefill_and_decode_match_optable():
    for traced, table in _trace_and_table(ParallelPlan(tp=4, fused_shared_expert=True), [[1000, 300], [1, 1]]):
        diffs = compare_with_optable(traced, table)
        assert diffs.empty, diffs.to_string()
        assert len(traced) == len(table[table.kind.isin(["gemm", "router", "lm_head", "grouped_gemm", "attention",
                                                          "indexer"])])
        moe = traced[traced.op == "moe_gate_up"]
        assert (moe.experts == 129).all() and (moe.inter == 768).all() and (moe.topk == 5).all()
        assert (traced[traced.op == "qkv_proj"].n.isin([2304, 2560])).all()  # reference §3 TP4 widths


def test_tp1_unfused_first_layers_match_optable():
    plan = ParallelPlan(tp=1, fused_shared_expert=False)
    for traced, table in _trace_and_table(plan, [[200, 129, 1], [1, 1, 1]], layers=5):
        assert compare_with_optable(traced, table).empty
        assert (traced[traced.op == "qkv_proj"].n.isin([9216, 9856])).all()


def test_a_shape_difference_is_reported():
    traced, table = _trace_and_table(ParallelPlan(tp=2), [[64]], layers=4)[0]
    traced.loc[traced.op == "o_proj", "k"] += 1
    traced = traced[traced.op != "router"]
    diffs = compare_with_optable(traced, table)
    assert set(diffs[diffs.column == "k"].op) == {"o_proj"}
    assert set(diffs[diffs.column == "(row)"].op) == {"router"}
