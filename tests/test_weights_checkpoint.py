"""Weights: HF safetensors with the real M3 names (BF16, MXFP8, Quark MXFP4), TP/EP sharding, errors."""
import json

import pytest
import torch

from m3lab.errors import M3LabError
from m3lab.kernels.mx.reference import dequantize_mxfp4, dequantize_mxfp8
from m3lab.model import build_model
from m3lab.spec.model import ModelSpec, load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.weights import load_weights, random_hf_tensors, random_weights, write_checkpoint
from m3lab.weights.names import PREFIX, hf_shapes

CFG = ModelSpec.mini()
TP1 = ParallelPlan()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name, kw in {"bf16": {"fmt": "bf16"}, "mxfp8": {"fmt": "mxfp8"},
                     "mxfp8_mixed": {"fmt": "mxfp8", "bf16_indexer": True}, "mxfp4": {"fmt": "mxfp4"}}.items():
        tensors = random_hf_tensors(CFG, seed=int(torch.randint(0, 1000, ())), **kw)
        out[name] = (write_checkpoint(tensors, d / name, shards=3), tensors)
    return out


def _a(i):
    return f"{PREFIX}layers.{i}.self_attn."


def test_names_follow_the_published_weight_table(shared_dir):
    table = json.loads((shared_dir / "data/hf_configs/MiniMaxAI__MiniMax-M3__weights-table__partial.json").read_text())
    full = hf_shapes(load_model("minimax-m3"))
    for pattern, shape, *_ in table["rows"]:
        if not pattern.startswith("language_model."):
            continue  # vision tower is out of scope
        name = pattern.split(" ")[0].replace("layers.0-2", "layers.1").replace("layers.0-59", "layers.4") \
            .replace("layers.3-59", "layers.4").replace("experts.0-127", "experts.5")
        assert tuple(full[name]) == tuple(shape), name


def test_bf16_load_fuses_projections_and_experts(ckpts):
    path, t = ckpts["bf16"]
    w, f = load_weights(path, CFG, TP1, dtype=torch.float32)
    i = 2  # a sparse MoE layer
    parts = [t[_a(i) + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj", "index_q_proj", "index_k_proj")]
    assert torch.equal(w[f"layers.{i}.qkv"], torch.cat(parts).float())
    e = f"{PREFIX}layers.{i}.block_sparse_moe.experts.3."
    assert torch.equal(w[f"layers.{i}.w13"][3], torch.cat([t[e + "w1.weight"], t[e + "w3.weight"]]).float())
    assert w[f"layers.{i}.router"].dtype == torch.float32 and set(f.values()) == {"bf16"}
    rnd = random_weights(CFG, TP1)
    assert {k: tuple(v.shape) for k, v in w.items()} == {k: tuple(v.shape) for k, v in rnd.items()}


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_shards_reassemble_and_replicate_kv_heads(ckpts, tp):
    path, t = ckpts["bf16"]
    plan = ParallelPlan(tp=tp, fused_shared_expert=True)
    ranks = [load_weights(path, CFG, plan, rank=r, dtype=torch.float32)[0] for r in range(tp)]
    i, d = 1, CFG.head_dim
    wq, wk, _, wiq, _ = plan.qkv_widths(CFG, sparse=True)
    q = torch.cat([w[f"layers.{i}.qkv"][:wq] for w in ranks])
    assert torch.equal(q, t[_a(i) + "q_proj.weight"].float())
    k_full = t[_a(i) + "k_proj.weight"].float()
    for r, w in enumerate(ranks):
        head = r // max(1, tp // CFG.heads_kv) if tp > CFG.heads_kv else r
        assert torch.equal(w[f"layers.{i}.qkv"][wq:wq + wk], k_full[head * d:(head + 1) * d])
        assert torch.equal(w[f"layers.{i}.qkv"][-CFG.index_dim:], t[_a(i) + "index_k_proj.weight"].float())
        assert w[f"layers.{i}.qkv"].shape[0] == sum(plan.qkv_widths(CFG, sparse=True))   # one fused GEMM
    o = torch.cat([w[f"layers.{i}.o_proj"] for w in ranks], dim=1)
    assert torch.equal(o, t[_a(i) + "o_proj.weight"].float())
    assert ranks[0][f"layers.{i}.w13"].shape[0] == CFG.experts + 1  # shared expert fused as the last row
    assert ranks[0][f"layers.{i}.w13"].shape[1] == 2 * CFG.expert_inter // tp


def test_ep_holds_whole_experts_and_a_tp_sharded_shared_expert(ckpts):
    path, t = ckpts["bf16"]
    plan = ParallelPlan(tp=2, ep=2, fused_shared_expert=True)   # fusion asked for: off under EP (vLLM)
    w, _ = load_weights(path, CFG, plan, rank=1, dtype=torch.float32)
    e = f"{PREFIX}layers.1.block_sparse_moe.experts.{CFG.experts // 2}."
    assert torch.equal(w["layers.1.w13"][0], torch.cat([t[e + "w1.weight"], t[e + "w3.weight"]]).float())
    assert w["layers.1.w13"].shape[0] == CFG.experts // 2
    s = f"{PREFIX}layers.1.block_sparse_moe.shared_experts."
    half = CFG.shared_inter // 2   # rank 1 of tp 2 keeps the second half of the shared expert's columns
    assert torch.equal(w["layers.1.shared_gate_up"], torch.cat([t[s + "gate_proj.weight"][half:],
                                                                t[s + "up_proj.weight"][half:]]).float())


def test_mxfp8_keeps_payload_and_scales_and_runs(ckpts):
    path, t = ckpts["mxfp8"]
    w, f = load_weights(path, CFG, ParallelPlan(fused_shared_expert=True), dtype=torch.float32)
    assert f["layers.1.qkv"] == "mxfp8" and f["layers.1.w13"] == "mxfp8" and f["embed"] == "bf16"
    assert w["layers.1.w13"].shape[0] == CFG.experts + 1   # same formats: the shared expert is fused
    q = _a(1) + "q_proj"
    deq = dequantize_mxfp8(w["layers.1.qkv"], w["layers.1.qkv.scale"])[:CFG.heads_q * CFG.head_dim]
    torch.testing.assert_close(deq, dequantize_mxfp8(t[q + ".weight"], t[q + ".weight_scale_inv"]))
    m = build_model(CFG, None, checkpoint=str(path), dtype=torch.float32)
    tokens = torch.randint(0, CFG.vocab, (20,))
    logits = m.step(m.new_cache(16), [(0, tokens)])
    assert torch.isfinite(logits).all()
    assert any(r["op"] == "qkv_proj" and r["dtypes"]["w"] == "float8_e4m3fn" for r in m.dispatcher.records)
    deq = {k: v for k, v in w.items() if not k.endswith(".scale")}
    for k, fmt in f.items():
        if fmt == "mxfp8":
            deq[k] = dequantize_mxfp8(w[k], w[k + ".scale"])
    ref = build_model(CFG, None)
    ref.weights, ref.formats = deq, {}
    torch.testing.assert_close(logits, ref.step(ref.new_cache(16), [(0, tokens)]), rtol=1e-4, atol=1e-4)


def test_bf16_indexer_next_to_mxfp8_qkv_is_refused(ckpts):
    """vLLM loads index q/k into the one fused qkv module with one quant method: no separate indexer GEMM."""
    path, t = ckpts["mxfp8_mixed"]
    with pytest.raises(M3LabError, match=r"layers\.1\.qkv: parts mix formats.*index_q_proj=bf16") as err:
        build_model(CFG, None, checkpoint=str(path), dtype=torch.float32)
    assert "one weight format" in err.value.hint


def test_quark_mxfp4_experts(ckpts):
    path, t = ckpts["mxfp4"]
    w, f = load_weights(path, CFG, TP1, dtype=torch.float32)
    assert f["layers.1.w13"] == "mxfp4" and f["layers.1.qkv"] == "bf16"
    e = f"{PREFIX}layers.1.block_sparse_moe.experts.2."
    assert w["layers.1.w13"].dtype == torch.uint8 and w["layers.1.w13"].shape[-1] == CFG.hidden // 2
    got = dequantize_mxfp4(w["layers.1.w13"][2], w["layers.1.w13.scale"][2])
    ref = torch.cat([dequantize_mxfp4(t[e + n + ".weight"], t[e + n + ".weight_scale"]) for n in ("w1", "w3")])
    assert torch.equal(got, ref)
    m = build_model(CFG, None, checkpoint=str(path), dtype=torch.float32)
    assert torch.isfinite(m.step(m.new_cache(16), [(0, torch.randint(0, CFG.vocab, (20,)))])).all()


def test_random_weights_at_full_width_on_meta():
    w = random_weights(load_model("minimax-m3"), ParallelPlan(tp=4, fused_shared_expert=True), device="meta",
                       dtype=torch.bfloat16)
    assert tuple(w["layers.3.w13"].shape) == (129, 1536, 6144) and w["layers.3.w13"].is_meta
    assert tuple(w["layers.3.qkv"].shape) == (2560, 6144) and tuple(w["layers.0.qkv"].shape) == (2304, 6144)


# --- errors: corrupt, truncated, missing, pickled -------------------------------------------------------------
def test_truncated_file_is_a_clear_error(ckpts, tmp_path):
    path, _ = ckpts["bf16"]
    bad = tmp_path / "trunc"
    bad.mkdir()
    for f in path.iterdir():
        data = f.read_bytes()
        (bad / f.name).write_bytes(data[: len(data) // 2] if f.name.endswith("2-of-00003.safetensors") else data)
    with pytest.raises(M3LabError, match="corrupt or truncated") as err:
        load_weights(bad, CFG, TP1)
    assert "model-00002-of-00003.safetensors" in str(err.value)


def test_garbage_header_is_a_clear_error(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(M3LabError, match="corrupt or truncated"):
        load_weights(tmp_path, CFG, TP1)


def test_missing_tensor_and_missing_shard_are_named(ckpts, tmp_path):
    path, t = ckpts["bf16"]
    name = f"{PREFIX}layers.2.self_attn.index_k_proj.weight"
    write_checkpoint({k: v for k, v in t.items() if k != name}, tmp_path / "miss", shards=1)
    with pytest.raises(M3LabError, match="index_k_proj"):
        load_weights(tmp_path / "miss", CFG, TP1)
    (tmp_path / "miss" / "model-00001-of-00001.safetensors").rename(tmp_path / "miss" / "other.safetensors")
    with pytest.raises(M3LabError, match="missing file"):
        load_weights(tmp_path / "miss", CFG, TP1)


def test_pickled_checkpoints_are_never_loaded(tmp_path):
    torch.save({"x": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(M3LabError, match="pickled"):
        load_weights(tmp_path, CFG, TP1)
    with pytest.raises(M3LabError, match="only .safetensors"):
        load_weights(tmp_path / "pytorch_model.bin", CFG, TP1)
