"""The repo's MoE, indexer and sparse-attention kernels as the reference model's declared fast paths.

``m3_registry(with_kernels=True, also_on=("cpu",))`` attaches them (``REPO_KERNELS``) and lets the device
conditions accept the CPU, every other condition being vLLM's: sparse layers, KV block 128, head dim 128, a
bf16/fp16/fp8 KV cache. So the model is the mini M3 structure at those widths (hidden 256, 8 experts, top-2,
2 KV heads of 128) in fp32 with an fp16 K/V cache (fp32 index keys). After a reference prefill (the interpreter
is slow), a 2-row prefill chunk per request and two decode steps on the fast paths give the logits of the same
steps on the plain-torch references (same weights, same caches; the references equal the dense-mask model:
tests/test_model_reference.py), and the dispatch records name the kernels the launchers ran. Inputs whose top-k
has a near-tie (dense-mask margin) are redrawn, as in tests/test_model_reference.py.
"""
import copy
import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.dispatch import Dispatcher  # noqa: E402
from m3lab.dispatch.registry import m3_registry  # noqa: E402
from m3lab.kernels.mx.reference import quantize_mxfp8  # noqa: E402
from m3lab.model import build_model, dense_mask_logits  # noqa: E402
from m3lab.spec.model import MINI_M3_CONFIG, parse_hf_config  # noqa: E402

MARGIN = 1e-3
ATOL = 2e-4


def mini_at_vllm_widths():
    """The mini M3 structure with vLLM's attention widths (KV block 128, head and index dim 128)."""
    cfg = copy.deepcopy(MINI_M3_CONFIG)
    cfg["text_config"]["head_dim"] = 128
    cfg["text_config"]["rotary_dim"] = 64
    cfg["text_config"]["sparse_attention_config"].update(sparse_index_dim=128, sparse_block_size=128)
    return parse_hf_config(cfg, name="minimax-m3-mini-128", source="tests: mini M3 at vLLM's attention widths")


SPEC = mini_at_vllm_widths()


def _fast(plan):
    return Dispatcher(plan=plan, registry=m3_registry(with_kernels=True, also_on=("cpu",)))


def _steps(m, seqs, lens, dispatcher):
    """Reference prefill, then a 2-token chunk per request and 2 decode steps on ``dispatcher``; -> their logits."""
    cache = m.new_cache(16, layout="triton", dtype=torch.float16, index_dtype=torch.float32)
    m.dispatcher = Dispatcher(plan=m.plan)
    m.step(cache, [(r, s[:n]) for r, (s, n) in enumerate(zip(seqs, lens))])
    m.dispatcher = dispatcher
    got, pos = [], list(lens)
    for width in (2, 1, 1):
        got.append(m.step(cache, [(r, s[p:p + width]) for r, (s, p) in enumerate(zip(seqs, pos))], all_logits=True))
        pos = [p + width for p in pos]
    return torch.cat(got)


def _kernels(records, op, path_prefix):
    return [(r["path"], r["kernels"]) for r in records if r["op"] == op and r["path"].startswith(path_prefix)]


@pytest.mark.parametrize("fused", [True, False])
def test_mini_model_on_the_repo_fast_paths_matches_the_references(fused):
    cfg = SPEC.with_index_sharing(2)   # sparse layers 1 and 3 compute the top-k, 2 reuses it
    bs, k = cfg.sparse.block_size, cfg.sparse.topk_blocks
    plan = {"tp": 1, "fused_shared_expert": fused}
    for _ in range(4):
        seed = int(torch.randint(0, 2**30, ()).item())
        m = build_model(cfg, plan, seed=seed)
        gen = torch.Generator().manual_seed(seed + 1)
        lens = [k * bs + 21, k * bs + 3]             # longer than topk x block: the choice is sparse
        seqs = [torch.randint(0, cfg.vocab, (n + 4,), generator=gen) for n in lens]
        fast = _fast(plan)
        got = _steps(m, seqs, lens, fast)
        if min(dense_mask_logits(m, s)[1] for s in seqs) < MARGIN:
            continue
        ref = _steps(m, seqs, lens, Dispatcher(plan=m.plan))
        assert torch.isfinite(got).all() and got.shape == ref.shape == (8, cfg.vocab)
        assert (got - ref).abs().max().item() < ATOL
        _check_records(fast.records, cfg, fused)
        return
    pytest.fail("no input without a top-k near-tie in 4 draws")


def _check_records(records, cfg, fused):
    steps = 3                                       # one 2-row chunk step, two decode steps
    moe = [r for r in records if r["op"] == "moe_experts"]
    assert len(moe) == steps * len(cfg.moe_layers)
    for r in moe:
        assert r["path"] == "moe.triton_fused_moe"
        assert r["kernels"] == ["align_kernel", "gate_up_kernel", "down_kernel"]   # what the launcher ran
        assert r["shapes"]["w13"][0] == cfg.experts + fused and r["shapes"]["ids"][1] == cfg.topk + fused
        assert (r["attrs"]["shared_expert"] == "fused") is fused
    assert any(r["op"] == "shared_gate_up" for r in records) is not fused
    sparse_att = [r for r in records if r["op"] == "attention" and r["layer"] in cfg.sparse_layers]
    assert len(sparse_att) == steps * len(cfg.sparse_layers)
    assert {r["path"] for r in sparse_att[:3]} == {"attention.triton_sparse_prefill"}
    assert {r["path"] for r in sparse_att[3:]} == {"attention.triton_sparse_decode"}
    assert all(r["kernels"] == ["sparse_attn_kernel", "merge_kernel"] for r in sparse_att)   # split 2 on the CPU
    dense_att = [r for r in records if r["op"] == "attention" and r["layer"] not in cfg.sparse_layers]
    assert dense_att and all(r["path"] == "torch" and r["rejected"][0]["condition"].startswith("sparse-attention")
                             for r in dense_att)
    computing = len(cfg.topk_layers)
    assert _kernels(records, "indexer", "indexer.triton_prefill") == \
        [("indexer.triton_prefill", ["index_score_kernel"])] * computing
    assert _kernels(records, "topk", "topk.triton_prefill") == [("topk.triton_prefill", ["select_kernel"])] * computing
    # decode: the indexer call scores and selects (as vLLM's minimax_m3_index_decode); the top-k op launches nothing
    assert _kernels(records, "indexer", "indexer.triton_decode") == \
        [("indexer.triton_decode", ["index_score_kernel", "select_kernel"])] * (2 * computing)
    assert _kernels(records, "topk", "topk.triton_decode") == [("topk.triton_decode", [])] * (2 * computing)
    assert {r["op"] for r in records if r["op"] in ("indexer", "topk")} and \
        {r["layer"] for r in records if r["op"] == "indexer"} == set(cfg.topk_layers)


def test_without_the_cpu_flag_the_fast_paths_stay_off():
    m = build_model(SPEC, {"tp": 1}, seed=0, dispatcher=Dispatcher(plan={"tp": 1}, registry=m3_registry(True)))
    cache = m.new_cache(4)
    m.step(cache, [(0, torch.arange(5))])
    recs = m.dispatcher.records
    assert all(r["path"] == "torch" for r in recs)
    (moe,) = {r["rejected"][-1]["condition"] for r in recs if r["op"] == "moe_experts"}
    assert moe.startswith("runs on cuda/hip (got cpu)")


def test_under_expert_parallelism_the_shared_expert_stays_apart_and_the_record_says_why():
    """TP 2, EP 2 with fusion asked for (rank 0): the TP-sharded shared expert cannot be a row of the table of whole
    experts (vLLM turns fusion off under EP as well); the routed experts still run on the grouped kernel (vLLM's fused
    MoE takes an expert map), ids of the other rank's experts are -1."""
    plan = {"tp": 2, "ep": 2, "fused_shared_expert": True}
    m = build_model(SPEC, plan, seed=1)
    ref_m = build_model(SPEC, plan, seed=1)
    toks = torch.randint(0, SPEC.vocab, (6,), generator=torch.Generator().manual_seed(2))
    fast = _fast(plan)
    m.dispatcher = fast
    got = m.step(m.new_cache(4), [(0, toks[:4]), (1, toks[4:])], all_logits=True)
    ref = ref_m.step(ref_m.new_cache(4), [(0, toks[:4]), (1, toks[4:])], all_logits=True)
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=0)
    moe = [r for r in fast.records if r["op"] == "moe_experts"]
    assert moe and all(r["path"] == "moe.triton_fused_moe" and r["shapes"]["w13"][0] == SPEC.experts // 2
                       and r["shapes"]["ids"][1] == SPEC.topk for r in moe)
    assert all("cannot be a row of the local expert table" in r["attrs"]["shared_expert"] for r in moe)
    assert sum(r["op"] == "shared_gate_up" for r in fast.records) == len(SPEC.moe_layers)


def test_routed_and_shared_experts_in_different_formats_stay_apart():
    """MXFP8 routed experts and a BF16 shared expert (as the loader leaves such a checkpoint), fusion asked for:
    not fused, and the record says why; the MXFP8 experts take the MXFP8 path (our kernel, dequantising in the
    interpreter) and equal the reference."""
    m = build_model(SPEC, {"tp": 1, "fused_shared_expert": False}, seed=3)
    for i in SPEC.moe_layers:
        for name in ("w13", "w2"):
            q, s = quantize_mxfp8(m.weights[f"layers.{i}.{name}"])
            m.weights[f"layers.{i}.{name}"], m.weights[f"layers.{i}.{name}.scale"] = q, s
            m.formats[f"layers.{i}.{name}"] = "mxfp8"
    m.plan = dataclasses.replace(m.plan, fused_shared_expert=True)   # fusion asked for
    toks = [(0, torch.arange(3)), (1, torch.arange(7, 9))]
    m.dispatcher = Dispatcher(plan=m.plan)
    ref = m.step(m.new_cache(4), toks, all_logits=True)
    (moe, *_) = [r for r in m.dispatcher.records if r["op"] == "moe_experts"]
    assert "different formats (mxfp8 / bf16)" in moe["attrs"]["shared_expert"]
    why = {r["path"]: r["condition"] for r in moe["rejected"]}
    assert why["moe.triton_fused_moe"] == "expert weights bf16 (got mxfp8)"
    assert why["moe.triton_mxfp8_native"].startswith("runs on cuda/hip (got cpu)")
    m.dispatcher = _fast(m.plan)
    got = m.step(m.new_cache(4), toks, all_logits=True)
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=0)
    moe = [r for r in m.dispatcher.records if r["op"] == "moe_experts"]
    assert len(moe) == len(SPEC.moe_layers) and all(
        r["path"] == "moe.triton_mxfp8_native" and r["kernels"] == ["align_kernel", "gate_up_kernel", "down_kernel"]
        and r["shapes"]["w13"][0] == SPEC.experts for r in moe)


def test_the_conditions_are_vllms_widths_and_kv_dtypes():
    """The default mini model (KV block 16, head dim 32) and an fp32 KV cache are not vLLM's sparse kernels' cases:
    attached and allowed on the CPU, the paths still do not run, and the record names the width or dtype."""
    from m3lab.spec.model import ModelSpec
    for spec, kv, want in ((ModelSpec.mini(), torch.float16, "KV block size 128 (got block size 16)"),
                           (SPEC, torch.float32, "KV cache bf16/fp16/fp8 (got float32)")):
        m = build_model(spec, {"tp": 1}, seed=0, dispatcher=_fast({"tp": 1}))
        m.step(m.new_cache(4, dtype=kv), [(0, torch.arange(3))])
        att = [r for r in m.dispatcher.records if r["op"] == "attention" and r["layer"] in spec.sparse_layers]
        assert att and all(r["path"] == "torch" for r in att)
        assert all(x["condition"] == want for r in att for x in r["rejected"]
                   if x["path"].startswith("attention.triton"))
