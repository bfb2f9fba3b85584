"""Kineto reader: the public samples (graph replay counted, not lost) and small synthetic traces."""
import gzip
import json

import pytest

from m3lab.errors import M3LabError
from m3lab.traces import load_trace, read_kineto, summarize

SAMPLES = {"sglang": "tracelens_sglang_Qwen3-8B_decode_MI300X.json.gz",
           "vllm": "tracelens_vllm_prefilldecode_piecewise_graph_execution.json.gz"}


def _raw_kernels(path):
    events = json.load(gzip.open(path))["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_every_kernel_is_counted(shared_dir, sample):
    path = shared_dir / "data" / "kineto" / SAMPLES[sample]
    raw = _raw_kernels(path)
    ev = load_trace(path)
    kernels = ev[ev["kind"] == "kernel"]
    assert ev.attrs["format"] == "kineto"
    assert len(kernels) == len(raw)
    assert kernels["dur_us"].sum() == pytest.approx(sum(e["dur"] for e in raw), rel=1e-12)
    s = summarize(ev)
    assert s["share"].sum() == pytest.approx(1.0)
    assert s["count"].sum() == len(ev)
    assert (s[["cpu_op", "launch", "graph_launch", "unattributed"]].sum(axis=1) == s["count"]).all()


def test_piecewise_graph_kernels_attributed_to_graph_launch(shared_dir):
    ev = read_kineto(shared_dir / "data" / "kineto" / SAMPLES["vllm"])
    graph = ev[ev["attribution"] == "graph_launch"]
    assert len(graph) > 0 and set(graph["launch"]) == {"hipGraphLaunch"}
    assert graph["cpu_op"].isna().all()
    # several replays: kernels grouped by the graph launch's correlation id
    assert graph["correlation"].nunique() > 1
    direct = ev[ev["attribution"] == "cpu_op"]
    assert "vllm::unified_attention_with_output" in set(direct["cpu_op"])
    assert direct["input_dims"].map(lambda d: isinstance(d, list)).all()


def _trace(tmp_path, events, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_synthetic_graph_launch_and_orphans(tmp_path):
    host = {"pid": 1, "tid": 1}
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "step", "ts": -5, "dur": 100, **host},
        {"ph": "X", "cat": "user_annotation", "name": "m3lab::o_proj[L0]", "ts": -1, "dur": 12, **host},
        {"ph": "X", "cat": "user_annotation", "name": "m3lab::sibling[L0]", "ts": 12, "dur": 2, **host},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 10,
         "args": {"External id": 7, "Input Dims": [[4, 8], [8, 16]], "Input type": ["float", "float"]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 2,
         "args": {"External id": 7, "correlation": 100}, **host},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 20, "dur": 5, "args": {"correlation": 200},
         **host},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 5, "dur": 3.5,
         "args": {"correlation": 100, "stream": 7, "device": 0, "grid": [4, 1, 1], "block": [128, 1, 1]}},
        *[{"ph": "X", "cat": "kernel", "name": f"g{i}", "ts": 30 + i, "dur": 1.25,
           "args": {"correlation": 200, "stream": 7, "device": 0}} for i in range(3)],
        {"ph": "X", "cat": "kernel", "name": "orphan", "ts": 50, "dur": 2.0, "args": {"correlation": 999}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset", "ts": 60, "dur": 1.0, "args": {"correlation": 998}},
        {"ph": "f", "cat": "ac2g", "id": 100, "ts": 5},
    ]
    ev = read_kineto(_trace(tmp_path, events))
    assert list(ev["attribution"]) == ["cpu_op", "graph_launch", "graph_launch", "graph_launch",
                                       "unattributed", "unattributed"]
    mm = ev.iloc[0]
    assert mm["cpu_op"] == "aten::mm" and mm["input_dims"] == [[4, 8], [8, 16]] and mm["grid"] == (4, 1, 1)
    assert ev["dur_us"].sum() == pytest.approx(3.5 + 3 * 1.25 + 2.0 + 1.0)
    assert set(ev["kind"]) == {"kernel", "memset"}
    assert list(ev["annotation"][:4]) == ["m3lab::o_proj[L0]", "step", "step", "step"]
    assert ev["annotation"][4:].isna().all()


def test_bare_event_list_is_accepted(tmp_path):
    path = tmp_path / "list.json"
    path.write_text(json.dumps([{"ph": "X", "cat": "Kernel", "name": "k", "ts": 1, "dur": 2, "args": {}}]))
    assert read_kineto(path)["dur_us"].tolist() == [2.0]


def test_truncated_and_malformed(tmp_path):
    good = _trace(tmp_path, [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "args": {}}] * 50)
    cut = tmp_path / "cut.json"
    cut.write_text(good.read_text()[:-40])
    with pytest.raises(M3LabError, match=r"cut.json: invalid JSON at (line 1 column \d+|end of file).*truncated"):
        load_trace(cut)
    other = tmp_path / "x.json"
    other.write_text('{"a": 1}')
    with pytest.raises(M3LabError, match="not a Chrome trace"):
        read_kineto(other)
    no_ts = _trace(tmp_path, [{"ph": "X", "cat": "kernel", "name": "k", "dur": 2, "args": {}}], name="n.json")
    with pytest.raises(M3LabError, match="event 0 .* lacks ts/dur"):
        read_kineto(no_ts)
