"""Sharding is exact: the TP ranks' partial outputs of a layer sum to the TP1 output (what the all-reduce does).

Each rank loads the same checkpoint for its plan; attention (q heads split, KV heads split or replicated,
index heads like KV, index key replicated) and the FFN (column/row-parallel MLP, TP-MoE experts with the
fused shared expert) are run per rank and summed.
"""
import pytest
import torch

from m3lab.model import build_model
from m3lab.model.step import plan_step
from m3lab.spec.model import ModelSpec
from m3lab.weights import random_hf_tensors, write_checkpoint

CFG = ModelSpec.mini()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    t = random_hf_tensors(CFG, seed=int(torch.randint(0, 1000, ())))
    return str(write_checkpoint(t, tmp_path_factory.mktemp("tp"), shards=2))


def _layer_parts(m, x, layer):
    cache = m.new_cache(16)
    meta = plan_step(cache, [(0, x.shape[0])], "cpu")
    o, _ = m._attention(layer, x, meta, cache, None)
    f = m._moe(layer, x) if CFG.mlp_types[layer] == "moe" else m._dense_mlp(layer, x)
    return o, f


@pytest.mark.parametrize("tp, ep, fused", [(2, 1, False), (4, 1, True), (2, 2, True)])
def test_rank_partials_sum_to_tp1(ckpt, tp, ep, fused):
    """TP-MoE with the shared expert apart and fused; EP (fusion asked for but off, shared expert TP-sharded)."""
    x = torch.randn(70, CFG.hidden)  # 70 tokens > topk_blocks x block: sparse selection
    full = build_model(CFG, {"tp": 1}, checkpoint=ckpt)
    plan = {"tp": tp, "ep": ep, "fused_shared_expert": fused}
    ranks = [build_model(CFG, plan, checkpoint=ckpt, rank=r) for r in range(tp)]
    assert all(m.fused_shared == (fused and ep == 1) for m in ranks)
    for layer in (0, 1):  # a dense layer and a sparse MoE layer
        o1, f1 = _layer_parts(full, x, layer)
        parts = [_layer_parts(m, x, layer) for m in ranks]
        torch.testing.assert_close(sum(p[0] for p in parts), o1, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(sum(p[1] for p in parts), f1, rtol=1e-4, atol=1e-5)
