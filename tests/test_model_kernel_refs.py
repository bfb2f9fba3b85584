"""Properties of the plain-torch references in kernels/{indexer,sparse_attn,moe}/reference.py."""
import torch

from m3lab.kernels.indexer.reference import indexer_topk_ref
from m3lab.kernels.moe.reference import (append_shared_expert, fused_moe_ref, grouped_gemm_ref, route_sigmoid_bias,
                                         swiglu_oai)
from m3lab.kernels.sparse_attn.reference import dense_attention_ref, sparse_attention_ref


def test_sparse_attention_with_every_block_equals_dense():
    t, s, hq, hkv, d, bs = 5, 45, 8, 2, 16, 8  # awkward: s not a multiple of the block
    q = torch.randn(t, hq, d)
    k, v = torch.randn(s, hkv, d), torch.randn(s, hkv, d)
    q_pos = torch.arange(s - t, s)
    nb = -(-s // bs)
    pad = nb * bs - s
    kb = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).view(nb, bs, hkv, d)
    vb = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).view(nb, bs, hkv, d)
    perm = torch.randperm(nb)  # physical blocks in random order, reached through the block table
    kp, vp = torch.empty_like(kb), torch.empty_like(vb)
    kp[perm], vp[perm] = kb, vb
    blocks = torch.arange(nb).flip(0).expand(hkv, t, nb).to(torch.int32)
    out = sparse_attention_ref(q, kp, vp, perm, blocks, q_pos, d ** -0.5)
    torch.testing.assert_close(out, dense_attention_ref(q, k, v, q_pos, d ** -0.5), rtol=1e-5, atol=1e-5)


def test_sparse_attention_ignores_unselected_and_padding_blocks():
    t, hq, hkv, d, bs, nb = 3, 4, 1, 8, 4, 6
    q = torch.randn(t, hq, d)
    kb, vb = torch.randn(nb, bs, hkv, d), torch.randn(nb, bs, hkv, d)
    table = torch.arange(nb)
    q_pos = torch.tensor([21, 22, 23])
    blocks = torch.tensor([[[5, 1, -1]] * t], dtype=torch.int32)
    out = sparse_attention_ref(q, kb, vb, table, blocks, q_pos, 0.3)
    kb2, vb2 = kb.clone(), vb.clone()
    kb2[[0, 2, 3, 4]] = 100.0  # blocks not selected: must not matter
    vb2[[0, 2, 3, 4]] = 100.0
    torch.testing.assert_close(sparse_attention_ref(q, kb2, vb2, table, blocks, q_pos, 0.3), out)


def test_indexer_forces_own_block_and_pads():
    hi, d, bs, topk = 2, 8, 4, 3
    iq, ik = torch.randn(6, hi, d), torch.randn(30, d)
    q_pos = torch.tensor([0, 3, 4, 9, 17, 29])
    sel = indexer_topk_ref(iq, ik, q_pos, block_size=bs, topk=topk)
    assert sel.shape == (hi, 6, topk) and sel.dtype == torch.int32
    own = q_pos // bs
    for t in range(6):
        for h in range(hi):
            chosen = [b for b in sel[h, t].tolist() if b >= 0]
            assert int(own[t]) in chosen  # local block forced
            assert all(b <= own[t] for b in chosen)  # block-level causality
            assert len(chosen) == min(int(own[t]) + 1, topk)  # -1 only when fewer blocks exist


def test_indexer_picks_the_block_holding_the_max_key():
    d, bs = 4, 4
    ik = torch.zeros(24, d)
    ik[9] = torch.tensor([5.0, 0, 0, 0])  # block 2 holds the strongest key
    iq = torch.tensor([[[1.0, 0, 0, 0]]])
    sel = indexer_topk_ref(iq, ik, torch.tensor([23]), block_size=bs, topk=2)
    assert sorted(sel[0, 0].tolist()) == [2, 5]


def test_swiglu_oai_clamps_gate_above_and_up_both_ways():
    h = torch.tensor([[10.0, -3.0, 20.0, -20.0]])  # gate [10, -3], up [20, -20]
    out = swiglu_oai(h, alpha=1.702, limit=7.0, beta=1.0)
    g = torch.tensor([7.0, -3.0])
    u = torch.tensor([7.0, -7.0])
    torch.testing.assert_close(out[0], g * torch.sigmoid(1.702 * g) * (u + 1))


def test_router_renormalises_unbiased_scores_and_scales():
    logits = torch.randn(7, 16)
    bias = torch.zeros(16)
    bias[3] = 10.0  # the bias decides the choice ...
    w, ids = route_sigmoid_bias(logits, bias, 4, routed_scaling=2.0)
    assert (ids == 3).any(dim=1).all()
    torch.testing.assert_close(w.sum(1), torch.full((7,), 2.0))
    s = torch.sigmoid(logits).gather(1, ids)  # ... but not the weights
    torch.testing.assert_close(w, 2.0 * s / s.sum(1, keepdim=True))


def test_fused_moe_equals_per_token_loop_and_shared_row():
    t, h, i, e, k = 9, 32, 16, 5, 2
    x = torch.randn(t, h)
    w13, w2 = torch.randn(e + 1, 2 * i, h) / h ** 0.5, torch.randn(e + 1, h, i) / i ** 0.5
    w, ids = route_sigmoid_bias(torch.randn(t, e), torch.zeros(e), k)
    w, ids = append_shared_expert(w, ids, e)
    act = dict(alpha=1.702, limit=7.0, beta=1.0)
    out = fused_moe_ref(x, w13, w2, w, ids, **act)
    ref = torch.zeros(t, h)
    for r in range(t):
        for j in range(k + 1):
            ex = int(ids[r, j])
            ref[r] += w[r, j] * (swiglu_oai(x[r] @ w13[ex].T, **act) @ w2[ex].T)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert grouped_gemm_ref(x.to("meta"), w13.to("meta"), ids.to("meta")).shape == (t, k + 1, 2 * i)
