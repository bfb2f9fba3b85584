"""Expectations (YAML) and the verifier against dispatch and kernel traces."""
import pytest

from m3lab.errors import M3LabError
from m3lab.traces import DispatchTraceWriter, Expectations, list_shipped, load_trace, verify
from m3lab.traces.examples import write_synthetic_m3_trace
from m3lab.traces.expectations import Expression


def test_shipped_sets_load():
    assert {"minimax_m3_tp4", "vllm_gptoss_mi300_piecewise"} <= set(list_shipped())
    for name in list_shipped():
        exp = Expectations.load(name)
        assert exp.items and all(e.id for e in exp.items)


def test_tp4_passes_and_tp2_names_the_failed_condition(tmp_path):
    good = verify("minimax_m3_tp4", write_synthetic_m3_trace(tmp_path / "tp4.jsonl", tp=4))
    assert good.ok, good.failed
    bad = verify("minimax_m3_tp4", write_synthetic_m3_trace(tmp_path / "tp2.jsonl.gz", tp=2, layers=7))
    assert not bad.ok
    row = bad.failed.set_index("id").loc["attention_decode"]
    assert "vLLM starts this deployment (mxfp8-tp4-optimised+tp=2)" in row["why"]
    assert "2 KV heads per rank" in row["why"]
    assert row["ran"] == "torch (4 calls)" and row["calls"] == 4  # layers 3-6 are sparse
    assert 0 < row["share"] < 1
    assert set(bad.failed["id"]) == {"attention_decode"}


def test_unfused_shared_expert_fails_require_and_absent_ops(tmp_path):
    v = verify("minimax_m3_tp4", write_synthetic_m3_trace(tmp_path / "u.jsonl", fused_shared_expert=False))
    why = v.failed.set_index("id").loc["moe_expert_table", "why"]
    assert "w13[0] == 129" in why and "false on 5 of 5 calls" in why and "w13=[128," in why and "shared_gate_up" in why


def _exp(tmp_path, text):
    path = tmp_path / "e.yaml"
    path.write_text(text)
    return Expectations.load(path)


def test_missing_and_optional_and_skipped(tmp_path):
    trace = write_synthetic_m3_trace(tmp_path / "d.jsonl", layers=2)
    exp = _exp(tmp_path, """
name: t
expectations:
  - {id: needs_indexer, op: indexer, path: fast}
  - {id: maybe_indexer, op: indexer, path: fast, optional: true}
  - {id: kernels_only, kernels: ["foo"]}
""")
    v = verify(exp, trace)
    status = dict(zip(v.results["id"], v.results["status"]))
    assert status == {"needs_indexer": "missing", "maybe_indexer": "skipped", "kernels_only": "skipped"}
    assert not v.ok and "no call of indexer" in v.results["why"].iloc[0]


def test_where_layers_and_plan(tmp_path):
    path = tmp_path / "d.jsonl"
    with DispatchTraceWriter(path, device="cpu", plan={"tp": 4}) as w:
        for m in (16, 64, 65, 4096):
            w.write("o_proj", layer=5, shapes={"x": [m, 8]}, dtypes={}, path="decode" if m <= 64 else "prefill",
                    rejected=[] if m <= 64 else [("decode", f"M <= 64 (got {m})")])
    exp = _exp(tmp_path, """
expectations:
  - {id: small, op: o_proj, where: "x[0] <= 64 and plan['tp'] == 4", path: decode}
  - {id: all, op: o_proj, layers: "0-5", path: decode}
  - {id: other_layers, op: o_proj, layers: [1, 2], path: decode, optional: true}
""")
    v = verify(exp, path).results.set_index("id")
    assert v.loc["small", "status"] == "pass" and v.loc["small", "calls"] == 2
    assert v.loc["all", "status"] == "fail" and "M <= 64 (got 65)" in v.loc["all", "why"]
    assert v.loc["other_layers", "status"] == "skipped"


def test_kernel_trace_expectations(shared_dir):
    ev = load_trace(shared_dir / "data" / "kineto" / "tracelens_vllm_prefilldecode_piecewise_graph_execution.json.gz")
    v = verify("vllm_gptoss_mi300_piecewise", ev)
    assert v.ok, v.failed
    moe = v.results.set_index("id").loc["moe_mxfp4_matmul_ogs"]
    assert moe["share"] > 0.2 and moe["calls"] == 48
    exp = Expectations.from_dict({"expectations": [
        {"id": "absent", "absent_kernels": ["unified_attention"]},
        {"id": "present", "kernels": ["no_such_kernel_xyz"]}]})
    bad = verify(exp, ev)
    assert set(bad.failed["id"]) == {"absent", "present"}
    assert "expected absent but ran: kernel_unified_attention_2d" in bad.failed["why"].iloc[0]


@pytest.mark.parametrize("text, match", [
    ("expectations: []", "non-empty 'expectations'"),
    ("expectations: [{op: x}]", "needs an id"),
    ("expectations: [{id: a, op: x, colour: red}]", "unknown key"),
    ("expectations: [{id: a}]", "says nothing to check"),
    ("expectations: [{id: a, op: x, where: 'x[0] <='}]", "cannot parse"),
    ("expectations: [{id: a, op: '('}]", "bad regex"),
    ("expectations: [{id: a, op: x, layers: 'three'}]", "not a range"),
    ("expectations: [{id: a, op: x}, {id: a, op: y}]", "duplicate"),
    ("expectations: [{id: a, op: x]", "invalid YAML"),
])
def test_bad_expectations(tmp_path, text, match):
    with pytest.raises(M3LabError, match=match):
        _exp(tmp_path, text)


def test_expression_evaluates():
    e = Expression("len(x) == 2 and prod(x) > 10 and x[-1] in [4, 8] and not y")
    assert e({"x": [3, 4], "y": False}) and not e({"x": [1, 4], "y": False})
    assert e.names == ("x", "y")


@pytest.mark.parametrize("text", ['__import__("os")', "x.__class__", "open('/etc/passwd')"])
def test_unsafe_expressions_are_refused(text):
    with pytest.raises(M3LabError, match="not allowed"):
        Expression(text, "where")({"x": [1]})


def _o_proj_trace(tmp_path):
    path = tmp_path / "d.jsonl"
    with DispatchTraceWriter(path, device="cpu", plan={"tp": 4}) as w:
        w.write("o_proj", layer=1, shapes={"x": [16, 8]}, dtypes={}, path="decode")
        w.write("o_proj", layer=2, shapes={"y": [16, 8]}, dtypes={}, path="decode")
    return path


def test_a_record_lacking_a_name_does_not_match(tmp_path):
    exp = Expectations.from_dict({"expectations": [{"id": "small", "op": "o_proj", "where": "x[0] <= 64",
                                                    "path": "decode"}]})
    assert verify(exp, _o_proj_trace(tmp_path)).results.iloc[0]["calls"] == 1   # the record with y only is left out


@pytest.mark.parametrize("where", ["x[5] <= 64", "x[0] <= 'sixty'", "plan['pp'] == 1", "x[0] / 0 > 1"])
def test_a_bad_expectation_is_an_error_naming_it(tmp_path, where):
    exp = Expectations.from_dict({"expectations": [{"id": "bad_one", "op": "o_proj", "where": where}]})
    with pytest.raises(M3LabError, match="expectation 'bad_one'"):
        verify(exp, _o_proj_trace(tmp_path))


def test_unknown_expectations_name():
    with pytest.raises(M3LabError, match="not found"):
        Expectations.load("no_such_set")


def test_dispatch_kernels_of_the_expected_path(tmp_path):
    path = tmp_path / "d.jsonl"
    with DispatchTraceWriter(path, device="cpu") as w:
        w.write("attention", layer=3, shapes={}, dtypes={}, path="sparse_paged", kernels=["dense_attn_fwd"])
    exp = Expectations.from_dict({"expectations": [
        {"id": "k", "op": "attention", "path": "sparse_paged", "kernels": ["(?i)sparse"]}]})
    row = verify(exp, path).results.iloc[0]
    assert row["status"] == "fail" and "no launched kernel matches" in row["why"] and "dense_attn_fwd" in row["why"]


def test_kernel_trace_scoped_by_dispatcher_annotations(tmp_path):
    import json
    host = {"pid": 1, "tid": 1}
    events = []
    for layer, kernel in [(0, "paged_attn_dense"), (3, "sparse_paged_attention_page16"), (4, "attn_fallback_bmm")]:
        t = layer * 100
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"m3lab::attention[L{layer}]", "ts": t, "dur": 50, **host},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 1, "dur": 2,
             "args": {"correlation": layer + 1}, **host},
            {"ph": "X", "cat": "kernel", "name": kernel, "ts": t + 5, "dur": 10.0, "args": {"correlation": layer + 1}}]
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"traceEvents": events}))
    exp = Expectations.from_dict({"expectations": [
        {"id": "l3", "op": "attention", "layers": [3], "kernels": ["(?i)sparse"]},
        {"id": "dense", "op": "attention", "layers": "0-2", "kernels": ["(?i)sparse"]},
        {"id": "sparse_layers", "op": "attention", "layers": "3-", "absent_kernels": ["bmm"]}]})
    res = verify(exp, path).results.set_index("id")
    assert res.loc["l3", "status"] == "pass" and res.loc["l3", "share"] == pytest.approx(1 / 3)
    assert "within m3lab::attention" in res.loc["l3", "expected"]
    assert res.loc["dense", "status"] == "fail"
    assert res.loc["sparse_layers", "status"] == "fail" and "attn_fallback_bmm" in res.loc["sparse_layers", "why"]
