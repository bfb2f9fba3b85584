"""Dispatcher: declared fast paths, the recorded failed condition, the trace file and the verifier."""
import pytest
import torch

from m3lab.dispatch import CallContext, Condition, Dispatcher, FastPath, FastPathRegistry, m3_registry
from m3lab.capture.reference import build_traced_model, capture_dispatch_trace, run_steps
from m3lab.errors import M3LabError
from m3lab.traces import Expectations, read_dispatch_trace, verify

STEPS = [[300, 200], [1, 1]]  # a prefill step of two requests, then one decode step


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Dispatch traces of full-width M3 (first 5 layers: 3 dense + 2 sparse/MoE) on the meta device."""
    d = tmp_path_factory.mktemp("dispatch")
    out = {}
    for name, plan in {"tp2": {"tp": 2, "fused_shared_expert": True}, "tp4": {"tp": 4, "fused_shared_expert": True},
                       "tp4_unfused": {"tp": 4, "fused_shared_expert": False}}.items():
        out[name] = capture_dispatch_trace("minimax-m3", plan, STEPS, d / f"{name}.jsonl.gz", layers=5, commit="test")
    return out


def _rejected(row, path):
    return [r["condition"] for r in row["rejected"] if r["path"] == path]


def test_tp2_is_rejected_on_the_device_only_vllms_kv_head_rule_is_the_resolvers(traces):
    """The registry restates none of vLLM's conditions: one KV head per rank is vLLM's own check, which the
    resolver reports (tests/test_fastpaths_resolver.py); here AITER's path fails only on the device."""
    df = read_dispatch_trace(traces["tp2"])
    att = df[(df.op == "attention") & (df.layer >= 3)]
    assert len(att) == 4  # 2 sparse layers x 2 steps
    for _, row in att.iterrows():
        assert row["path"] == "torch"
        assert _rejected(row, "attention.aiter_sparse_pa") == ["runs on hip (got meta)"]
    v = verify(Expectations.load("minimax_m3_tp4"), traces["tp2"])
    assert not v.ok
    res = v.results.set_index("id").loc["attention_decode"]
    assert res["status"] == "fail" and "attention.aiter_sparse_pa: runs on hip (got meta)" in res["why"]


def test_tp4_passes_the_plan_conditions_and_fails_only_on_the_device(traces):
    df = read_dispatch_trace(traces["tp4"])
    header = df.attrs["header"]
    assert header["plan"]["tp"] == 4 and header["commit"] == "test" and header["device"] == "meta"
    att = df[(df.op == "attention") & (df.layer >= 3)]
    for _, row in att.iterrows():
        (why,) = _rejected(row, "attention.aiter_sparse_pa")
        assert why.startswith("runs on hip") and "got meta" in why
        assert any(r["path"].startswith("attention.triton_sparse") and r["condition"] == "runs on cuda (got meta)"
                   for r in row["rejected"])
    dense_att = df[(df.op == "attention") & (df.layer < 3)]
    assert all("sparse-attention layer" in _rejected(r, "attention.aiter_sparse_pa")[0] for _, r in dense_att.iterrows())


def test_fused_moe_has_129_experts_and_no_shared_mlp(traces):
    df = read_dispatch_trace(traces["tp4"])
    moe = df[df.op == "moe_experts"]
    assert len(moe) == 4 and all(s["w13"][0] == s["w2"][0] == 129 and s["ids"][1] == 5 for s in moe.shapes)
    assert all(_rejected(r, "moe.triton_fused_moe")[0].startswith("runs on cuda/hip") for _, r in moe.iterrows())
    assert not df.op.isin(["shared_gate_up", "shared_down"]).any()
    unfused = read_dispatch_trace(traces["tp4_unfused"])
    moe = unfused[unfused.op == "moe_experts"]
    assert all(s["w13"][0] == 128 for s in moe.shapes)
    assert (unfused.op == "shared_gate_up").sum() == 4


def test_gemm_paths_name_the_weight_format_and_m(traces):
    df = read_dispatch_trace(traces["tp4"])
    gemms = df[df.op.isin(["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])]
    for _, row in gemms.iterrows():
        (why,) = _rejected(row, "gemm.mxfp8_dot_scaled_decode")
        m = row["shapes"]["x"][0]
        assert why == "weights mxfp8 (got bf16)"
        assert _rejected(row, "gemm.unquantized") == ["runs on cuda (got meta)"]
        assert m in (1, 2, 500)


def test_a_registered_fast_path_runs_when_its_conditions_hold():
    calls = []

    def fast(x, w):
        calls.append(x.shape)
        return x @ w.T

    reg = FastPathRegistry([
        FastPath("never", ("gemm",), (Condition("M is odd", lambda c: c.attrs["m"] % 2 == 1,
                                                lambda c: f"M={c.attrs['m']}"),), ("k0",), impl=fast),
        FastPath("cpu_gemm", ("gemm",), (Condition("on the CPU", lambda c: c.device == "cpu"),), ("k1", "k2")),
        FastPath("also_ok", ("gemm",), (), ("k3",), impl=fast),
    ])
    reg.register_impl("cpu_gemm", fast)
    d = Dispatcher(plan={"tp": 1}, registry=reg)
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    out = d.call("qkv_proj", 0, "gemm", lambda x, w: None, {"x": x, "w": w}, {"m": 4})
    torch.testing.assert_close(out, x @ w.T)
    rec = d.records[-1]
    assert rec["path"] == "cpu_gemm" and rec["kernels"] == ["k1", "k2"] and calls == [(4, 8)]
    assert rec["rejected"] == [{"path": "never", "condition": "M is odd (got M=4)"}]


def test_unimplemented_path_and_registry_errors():
    reg = m3_registry()
    ctx = CallContext("moe_experts", 3, "moe", {}, {}, "hip", {"fused_shared_expert": True},
                      {"experts": 129, "routed_experts": 128, "w_format": "mxfp8"})
    assert "not implemented yet" in reg.paths["moe.aiter_mxfp8_flydsl"].first_failure(ctx)
    with pytest.raises(M3LabError, match="unknown fast path"):
        reg.register_impl("nope", lambda: None)
    with pytest.raises(M3LabError, match="already declared"):
        reg.declare(reg.paths["indexer.triton_decode"])
    names = {row["path"] for row in reg.table()}
    assert {"attention.aiter_sparse_pa", "attention.triton_sparse_decode", "indexer.triton_decode",
            "topk.triton_prefill", "gemm.mxfp8_dot_scaled_decode", "moe.triton_mxfp8_native",
            "norm.triton_gemma_rmsnorm", "activation.triton_swiglu_oai"} <= names
    assert not any(n in names for n in ("sparse_attn.paged_page16", "indexer.index_topk"))  # invented names gone


def test_registry_paths_are_the_resolvers_paths():
    """Every registry path the expectations generator maps a resolver decision to is declared."""
    from m3lab.vllm.fastpath_expectations import SHIPPED, expectations_for_preset
    names = set(m3_registry().paths)
    for preset in SHIPPED.values():
        for item in expectations_for_preset(preset)["expectations"]:
            paths = item.get("path", [])
            for p in [paths] if isinstance(paths, str) else paths:
                assert p in names, (preset, item["id"], p)


def test_mini_model_records_every_op_on_cpu():
    m = build_traced_model(None, {"tp": 1})
    run_steps(m, [[40], [1]])
    ops = {r["op"] for r in m.dispatcher.records}
    assert {"embedding", "qkv_proj", "qk_norm", "rope", "cache_write", "indexer", "topk", "attention", "o_proj",
            "router", "moe_experts", "final_norm", "lm_head"} <= ops
    assert all(r["device"] == "cpu" and r["path"] == "torch" for r in m.dispatcher.records)
