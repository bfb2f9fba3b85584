"""The reference M3 decoder (mini config) equals a straightforward dense-mask implementation.

Acceptance 1: prefill (chunked, two requests in one step) and several decode steps, index sharing on
and off, contexts longer than topk_blocks x block_size (so the selection is sparse). Top-k ties are
guarded by a score margin: the dense-mask implementation reports the smallest gap between the k-th
and (k+1)-th block score; inputs whose gap is below MARGIN are redrawn (never a looser tolerance).
"""
import math

import pytest
import torch

from m3lab.model import LAYOUTS, build_model, dense_mask_logits
from m3lab.spec.model import ModelSpec, load_model

MINI = ModelSpec.mini()

MARGIN = 1e-3  # fp32 score error is ~1e-6; a gap above this cannot flip the top-k choice
ATOL = 2e-4    # fp32 logits vs float64 dense-mask logits (logits are O(1))


def _run(cfg, fused: bool, seed: int, layout: str = "triton"):
    """Prefill two sequences (the first in two chunks), then 3 decode steps; returns (model, seqs, logits per seq)."""
    plan = {"tp": 1, "fused_shared_expert": fused}
    m = build_model(cfg, plan, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    bs, k = cfg.sparse.block_size, cfg.sparse.topk_blocks
    lens = [k * bs + 37, k * bs + 5]  # longer than topk x block: the choice is sparse
    seqs = [torch.randint(0, cfg.vocab, (n + 3,), generator=gen) for n in lens]
    cache = m.new_cache(64, layout=layout)
    got = [[], []]
    half = lens[0] // 2
    out = m.step(cache, [(0, seqs[0][:half]), (1, seqs[1][:lens[1]])], all_logits=True)
    got[0].append(out[:half])
    got[1].append(out[half:])
    got[0].append(m.step(cache, [(0, seqs[0][half:lens[0]])], all_logits=True))
    for d in range(3):
        out = m.step(cache, [(0, seqs[0][lens[0] + d:lens[0] + d + 1]), (1, seqs[1][lens[1] + d:lens[1] + d + 1])],
                     all_logits=True)
        got[0].append(out[:1])
        got[1].append(out[1:])
    return m, seqs, [torch.cat(g) for g in got]


def _check(cfg, fused: bool, layout: str = "triton"):
    for attempt in range(4):
        seed = int(torch.randint(0, 2**30, ()).item())
        m, seqs, got = _run(cfg, fused, seed, layout)
        refs = [dense_mask_logits(m, s) for s in seqs]
        if min(margin for _, margin in refs) < MARGIN:
            continue  # a near-tie in the top-k: redraw the inputs
        for (ref, margin), g in zip(refs, got):
            assert math.isfinite(margin), "selection was not sparse (no contested top-k choice)"
            assert g.shape == ref.shape
            err = (g.double() - ref).abs().max().item()
            assert err < ATOL, f"max |logit diff| {err:.3g}"
        return m
    pytest.fail("no input without a top-k near-tie in 4 draws")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("freq", [1, 2])
def test_mini_logits_match_dense_mask(freq, layout):
    cfg = MINI.with_index_sharing(freq)
    m = _check(cfg, fused=False, layout=layout)
    indexer_layers = {r["layer"] for r in m.dispatcher.records if r["op"] == "indexer"}
    assert indexer_layers == set(cfg.topk_layers)
    if freq > 1:
        assert len(indexer_layers) < len(cfg.sparse_layers)  # some layers reuse the selection


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fused_shared_expert_matches_dense_mask(layout):
    m = _check(MINI, fused=True, layout=layout)
    moe = [r for r in m.dispatcher.records if r["op"] == "moe_experts"]
    assert moe and all(r["shapes"]["w13"][0] == MINI.experts + 1 for r in moe)
    assert all(r["attrs"]["shared_expert"] == "fused" for r in moe)
    assert not any(r["op"].startswith("shared_") for r in m.dispatcher.records)


def test_default_plan_keeps_the_shared_expert_apart():
    """vLLM's default (VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=0): a separate shared-expert MLP."""
    m = build_model(MINI, None)
    assert not m.fused_shared and "layers.1.shared_gate_up" in m.weights
    assert m.weights["layers.1.w13"].shape[0] == MINI.experts


def test_one_fused_projection_and_reuse_layers_skip_the_index_branch():
    """Sparse layers run ONE q/k/v/index GEMM; reuse layers keep its index columns but skip index norm, RoPE
    and the index-cache write (amd/model.py:1024-1101)."""
    cfg = MINI.with_index_sharing(2)
    m, _, _ = _run(cfg, fused=False, seed=5)
    recs = [r for r in m.dispatcher.records if r["layer"] == 2]   # sparse ordinal 1: reuses layer 1's top-k
    assert not cfg.computes_topk(2) and cfg.computes_topk(1)
    assert not any("index" in r["op"] and r["op"] != "indexer" for r in m.dispatcher.records)  # no indexer GEMM
    wiq = cfg.sparse.index_heads * cfg.sparse.index_dim + cfg.sparse.index_dim
    qkv = [r for r in recs if r["op"] == "qkv_proj"]
    assert qkv and all(r["shapes"]["w"][0] == (cfg.heads_q + 2 * cfg.heads_kv) * cfg.head_dim + wiq for r in qkv)
    for op in ("qk_norm", "rope"):
        assert all("iq" not in r["shapes"] for r in recs if r["op"] == op)
        assert all("iq" in r["shapes"] for r in m.dispatcher.records if r["op"] == op and r["layer"] == 1)
    assert all("ik" not in r["shapes"] for r in recs if r["op"] == "cache_write")
    assert not any(r["op"] in ("indexer", "topk") for r in recs)


def test_index_sharing_changes_the_result():
    """Reuse is real: the same weights with freq 2 give different logits than with freq 1."""
    outs, seed = [], int(torch.randint(0, 2**30, ()).item())
    for freq in (1, 2):
        m, _, got = _run(MINI.with_index_sharing(freq), fused=False, seed=seed)
        outs.append(got[0])
    assert (outs[0] - outs[1]).abs().max() > 1e-4


def test_index_sharing_schedule_of_full_m3():
    """Reference §5: freq 4, offset 0 -> layers 3, 7, ..., 59 compute their own top-k (15 of 57)."""
    cfg = load_model("minimax-m3").with_index_sharing(4)
    computing = [i for i in cfg.sparse_layers if cfg.computes_topk(i)]
    assert computing == list(range(3, 60, 4))
    assert len(computing) == 15


def test_layouts_give_identical_logits():
    outs = []
    for layout in sorted(LAYOUTS):
        _, _, got = _run(MINI, fused=False, seed=3, layout=layout)
        outs.append(got[0])
    assert torch.equal(outs[0], outs[1])


def test_swiglu_beta_reaches_the_decoder():
    import dataclasses

    _check(dataclasses.replace(MINI, swiglu_beta=0.5), fused=False)   # the dense-mask reference uses beta too


INDEX_BRANCH = {"indexer", "topk"}  # ops a reuse layer skips entirely; qk_norm/rope/cache_write lose their index part


def _ops(model) -> list[tuple]:
    """(layer, op, tensor names and shapes) of every dispatched call, in order."""
    return [(r["layer"], r["op"], tuple(sorted((k, tuple(v)) for k, v in r["shapes"].items())))
            for r in model.dispatcher.records]


def test_index_sharing_on_vs_off_changes_only_what_the_schedule_says():
    """The same weights and inputs with sharing off (freq 1) and on (freq 2): every call is identical except, on
    the reuse layers only, the index branch — no indexer/top-k call, and no index q/k in the norm, RoPE and cache
    write. Computing layers, dense layers and every other op are untouched."""
    seed = int(torch.randint(0, 2**30, ()).item())
    on_cfg = MINI.with_index_sharing(2)
    off, _, _ = _run(MINI, fused=False, seed=seed)
    on, _, _ = _run(on_cfg, fused=False, seed=seed)
    reuse = {i for i in on_cfg.sparse_layers if not on_cfg.computes_topk(i)}
    assert reuse and reuse < set(on_cfg.sparse_layers)

    def strip_index(calls):
        kept = []
        for layer, op, shapes in calls:
            if layer in reuse and op in INDEX_BRANCH:
                continue
            if layer in reuse:
                shapes = tuple((k, v) for k, v in shapes if not k.startswith(("iq", "ik")))  # index q/k, their norms
            kept.append((layer, op, shapes))
        return kept

    got_off, got_on = _ops(off), _ops(on)
    assert [c for c in got_on if c[0] not in reuse] == [c for c in got_off if c[0] not in reuse]
    assert strip_index(got_off) == strip_index(got_on)
    assert len(got_on) < len(got_off)
    assert not any(layer in reuse and op in INDEX_BRANCH for layer, op, _ in got_on)
