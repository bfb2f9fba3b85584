"""kernels/moe in the Triton interpreter (fp32/fp16) against the plain-torch reference: alignment layout,
T = 1, one expert taking every token, experts with no tokens, T not a multiple of BLOCK_M, EP with half
the experts remote, fused vs separate shared expert, both routing-weight conventions, MX weights and
activations, both program orders. Every output is poisoned (NaN) before the kernel writes it."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.gates.checks import TOLERANCES, poison_, rel_rms  # noqa: E402
from m3lab.gates.moe import m3_act, make_routing, make_weights  # noqa: E402
from m3lab.kernels.moe import align, launcher, routing  # noqa: E402
from m3lab.kernels.moe.reference import fused_moe_ref, route_sigmoid_bias  # noqa: E402
from m3lab.kernels.launches import recording  # noqa: E402
from m3lab.kernels.moe.tables import MoeConfig  # noqa: E402

H, I, E = 64, 48, 6
CFG = MoeConfig(16, 32, 32, 2, 4, 1, "token", 32, 32, 4, 1)


def _run(x, w, weights, ids, **kw):
    out = poison_(torch.empty(x.shape, dtype=x.dtype))
    launcher.fused_moe(x, w["w13"], w["w2"], weights, ids, **m3_act(), w13_scale=w.get("w13_scale"),
                       w2_scale=w.get("w2_scale"), fmt=w["fmt"], out=out, **{"config": CFG, **kw})
    return out


def _ref(x, w, weights, ids, **kw):
    f = (lambda t: t.float()) if w["fmt"] == "bf16" else (lambda t: t)
    return fused_moe_ref(x.float(), f(w["w13"]), f(w["w2"]), weights, ids, **m3_act(), w13_scale=w.get("w13_scale"),
                         w2_scale=w.get("w2_scale"), fmt=w["fmt"], **kw)


def _check(out, ref, dtype):
    err = rel_rms(out, ref)
    assert err <= TOLERANCES[str(dtype).removeprefix("torch.")], err


def _layout_ok(a: align.Alignment, ids: torch.Tensor, block_m: int, experts: int):
    """Every valid slot appears once, in its expert's run, runs padded to block_m, blocks labelled."""
    flat = ids.reshape(-1).long()
    n_post = int(a.num_post)
    s = a.sorted_ids[:n_post].long()
    assert n_post % block_m == 0 and (a.sorted_ids[n_post:] == flat.numel()).all()
    real = s[s < flat.numel()]
    valid = torch.nonzero((flat >= 0) & (flat < experts)).flatten()
    assert torch.equal(real.sort().values, valid)
    blk = a.expert_ids[: n_post // block_m].long()
    assert (a.expert_ids[n_post // block_m:] == -1).all() and (blk >= 0).all() and (blk[1:] >= blk[:-1]).all()
    for b, e in enumerate(blk.tolist()):
        chunk = s[b * block_m:(b + 1) * block_m]
        chunk = chunk[chunk < flat.numel()]
        assert (flat[chunk] == e).all()


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("t,k,block_m", [(1, 5, 16), (37, 3, 16), (130, 2, 32)])
def test_alignment_layout(impl, t, k, block_m):
    ids = torch.randint(-1, E, (t, k), dtype=torch.int32)
    ids[0, 0] = E - 1
    a = align.align(ids, block_m, E, impl=impl)
    _layout_ok(a, ids, block_m, E)
    assert a.expert_ids.numel() == align.max_sizes(ids.numel(), E, block_m)[1]


def test_alignment_impls_agree_and_expert_map():
    ids = torch.randint(0, 10, (50, 4), dtype=torch.int32)
    emap = torch.tensor([0, -1, 1, -1, 2, -1, 3, -1, 4, -1], dtype=torch.int32)   # odd experts remote
    a, b = (align.align(ids, 16, 5, expert_map=emap, impl=i) for i in ("triton", "torch"))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    _layout_ok(a, torch.where(emap[ids.long()] >= 0, emap[ids.long()], -1), 16, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("t", [1, 37])    # 37: not a multiple of BLOCK_M (16)
def test_fused_moe_matches_reference(dtype, t):
    w = make_weights(E + 1, H, I, "bf16", dtype, "cpu")
    r = make_routing(t, E, 2, "cpu")
    x = torch.randn(t, H, dtype=dtype)
    _check(_run(x, w, r.weights, r.ids), _ref(x, w, r.weights, r.ids), dtype)


def test_all_tokens_one_expert_and_empty_experts():
    t = 21
    w = make_weights(E, H, I, "bf16", torch.float32, "cpu")
    x = torch.randn(t, H)
    ids = torch.full((t, 1), 3, dtype=torch.int32)          # expert 3 takes everything, the rest none
    weights = torch.rand(t, 1)
    out = _run(x, w, weights, ids)
    _check(out, _ref(x, w, weights, ids), torch.float32)
    ids2 = torch.tensor([[0, 5]] * t, dtype=torch.int32)    # experts 1..4 empty, between used ones
    wts = torch.rand(t, 2)
    _check(_run(x, w, wts, ids2, order="expert"), _ref(x, w, wts, ids2), torch.float32)


def test_ep_half_the_experts_remote():
    t = 19
    w = make_weights(E, H, I, "bf16", torch.float32, "cpu")
    x = torch.randn(t, H)
    r = make_routing(t, E, 3, "cpu", shared=False)
    emap = torch.tensor([0 if e % 2 == 0 else -1 for e in range(E)], dtype=torch.int32)
    emap[emap == 0] = torch.arange(E // 2, dtype=torch.int32)
    local = {k: w[k][0::2] for k in ("w13", "w2")}
    out = _run(x, {**w, **local}, r.weights, r.ids, expert_map=emap)
    ids_local = torch.where(r.ids % 2 == 0, r.ids // 2, -1)           # the model's local ids, -1 remote
    out_local_ids = _run(x, {**w, **local}, r.weights, ids_local)
    ref = _ref(x, {**w, **local}, r.weights, ids_local)
    _check(out, ref, torch.float32)
    _check(out_local_ids, ref, torch.float32)
    assert rel_rms(out, _ref(x, w, r.weights, r.ids)) > 0.1      # the remote experts really are left out


def test_fused_shared_expert_equals_separate_and_conventions_agree():
    t = 9
    w = make_weights(E + 1, H, I, "bf16", torch.float32, "cpu")
    x = torch.randn(t, H)
    logits, bias = torch.randn(t, E), torch.randn(E) * 0.1
    a = routing.route(logits, bias, topk=2, routed_scaling=2.0, shared_id=E, convention="scaled_weights")
    b = routing.route(logits, bias, topk=2, routed_scaling=2.0, shared_id=E, convention="scaled_output")
    assert torch.equal(a.ids, b.ids) and a.output_scale == 1.0 and b.output_scale == 2.0
    assert torch.allclose(a.weights[:, -1], torch.ones(t)) and torch.allclose(b.weights[:, -1], torch.full((t,), 0.5))
    fused_a = _run(x, w, a.weights, a.ids)
    fused_b = _run(x, w, b.weights, b.ids, output_scale=b.output_scale)
    rw, rid = route_sigmoid_bias(logits, bias, 2, 2.0)
    routed = {k: w[k][:E] for k in ("w13", "w2")}
    shared = {k: w[k][E:] for k in ("w13", "w2")}
    separate = _run(x, {**w, **routed}, rw, rid.int()) + _run(x, {**w, **shared}, torch.ones(t, 1),
                                                              torch.zeros(t, 1, dtype=torch.int32))
    _check(fused_a, separate, torch.float32)
    sliced = _run(x, {**w, **routed}, a.weights[:, :2], a.ids[:, :2]) + _run(   # strided views of the fused table
        x, {**w, **shared}, a.weights[:, 2:], torch.zeros_like(a.ids[:, 2:]))
    _check(fused_a, sliced, torch.float32)
    _check(fused_b, fused_a, torch.float32)
    _check(fused_a, _ref(x, w, a.weights, a.ids), torch.float32)


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("act_format", ["bf16", "mxfp8"])
def test_mx_weights(fmt, act_format):
    t, i = 11, 64
    w = make_weights(E + 1, H, i, fmt, torch.float32, "cpu")
    r = make_routing(t, E, 2, "cpu")
    x = torch.randn(t, H)
    out = _run(x, w, r.weights, r.ids, act_format=act_format)
    _check(out, _ref(x, w, r.weights, r.ids, act_format=act_format), torch.float32)


def test_bad_operands_name_the_field():
    w = make_weights(E, H, I, "bf16", torch.float32, "cpu")
    x = torch.randn(3, H)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="w2"):
        launcher.fused_moe(x, w["w13"], w["w2"][:, :, :-1], torch.ones(3, 2), ids, **m3_act())
    with pytest.raises(ValueError, match="act_format"):
        launcher.fused_moe(x, w["w13"], w["w2"], torch.ones(3, 2), ids, **m3_act(), act_format="mxfp8")
    with pytest.raises(ValueError, match="order"):
        launcher.fused_moe(x, w["w13"], w["w2"], torch.ones(3, 2), ids, **m3_act(), order="diagonal")


@pytest.fixture
def poisoned_buffers(monkeypatch):
    """Every torch.empty (the launcher's intermediates too) comes back NaN-filled: a slot the combine reads but
    no kernel wrote shows up as NaN."""
    real = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison_(real(*a, **kw)))


@pytest.mark.parametrize("combine", ["atomic", "store"])
@pytest.mark.parametrize("t,k,experts,remote", [(2, 3, 40, False), (2, 3, 40, True), (13, 2, 6, True)])
def test_naive_blocks_and_both_combines(poisoned_buffers, combine, t, k, experts, remote):
    """T·k·4 <= E takes vLLM's naive assignment (one block per slot, no alignment launch); both combines, with
    skipped slots (-1 and remote experts) that no kernel writes."""
    w = make_weights(experts, H, I, "bf16", torch.float32, "cpu")
    x = torch.randn(t, H)
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(t)]).to(torch.int32)
    ids[0, -1] = -1
    wts = torch.rand(t, k)
    emap = None
    if remote:
        emap = torch.arange(experts, dtype=torch.int32)
        emap[1::3] = -1
    cfg = MoeConfig(16, 32, 32, 2, 4, 1, "token", 32, 32, 4, 1, COMBINE=combine)
    with recording() as launched:
        out = _run(x, w, wts, ids, config=cfg, expert_map=emap)
    ref_ids = ids if emap is None else torch.where(ids >= 0, emap[ids.long().clamp(min=0)], -1)
    _check(out, _ref(x, w, wts, ref_ids), torch.float32)
    naive = t * k * launcher.NAIVE_FACTOR <= experts
    assert ("align_kernel" not in launched) == naive and ("combine_kernel" in launched) == (combine == "store")


def test_combine_rule_is_checked():
    with pytest.raises(ValueError, match="COMBINE"):
        MoeConfig(COMBINE="sum")
