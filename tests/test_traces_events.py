"""Format sniffing, kernel-name shortening and the summaries."""
import gzip
import json

import numpy as np
import pandas as pd
import pytest

from m3lab.errors import M3LabError
from m3lab.traces import load_trace, short_kernel_name, sniff_format, summarize
from m3lab.traces.table import make_events
from m3lab.traces.examples import write_synthetic_m3_trace


def test_sniff_all_formats(tmp_path):
    (tmp_path / "k.json").write_text(json.dumps({"traceEvents": []}))
    (tmp_path / "r.json.gz").write_bytes(gzip.compress(b'{"rocprofiler-sdk-tool": []}'))
    (tmp_path / "c.csv").write_text('"Kind","Kernel_Name","Start_Timestamp","End_Timestamp"\n')
    (tmp_path / "a.log").write_text("x\n[aiter] [fused_moe] using 1stage default for (1, 2)\n")
    write_synthetic_m3_trace(tmp_path / "d.jsonl", layers=1)
    got = {p.name: sniff_format(p) for p in sorted(tmp_path.iterdir())}
    assert got == {"a.log": "aiter-log", "c.csv": "rocprofv3-csv", "d.jsonl": "m3lab.dispatch",
                   "k.json": "kineto", "r.json.gz": "rocprofv3-json"}


def test_wrong_format_and_binary(tmp_path):
    (tmp_path / "x.txt").write_text("hello world\n")
    with pytest.raises(M3LabError, match="unrecognised trace format"):
        load_trace(tmp_path / "x.txt")
    (tmp_path / "b.bin").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(M3LabError):
        load_trace(tmp_path / "b.bin")
    (tmp_path / "bad.gz").write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(M3LabError, match="gzip"):
        load_trace(tmp_path / "bad.gz")


@pytest.mark.parametrize("name, short", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
     "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", "at::native::vectorized_elementwise_kernel"),
    ("void paged_attention_kernel<__hip_bfloat16, (vllm::Fp8KVCacheDataType)0, 3>(int, float)",
     "paged_attention_kernel"),
    ("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bLi64EEEvPT0_", "aiter::add_rmsnorm_quant_kernel"),
    ("kernel_unified_attention_2d", "kernel_unified_attention_2d"),
])
def test_short_kernel_name(name, short):
    assert short_kernel_name(name) == short


def test_summarize_events_shares_and_attribution():
    rng = np.random.default_rng()
    n = int(rng.integers(20, 200))
    names = rng.choice(["a", "b", "c"], n)
    attribution = rng.choice(["cpu_op", "graph_launch", "unattributed"], n)
    dur = rng.uniform(0.5, 50, n)
    ev = make_events([{"name": a, "kind": "kernel", "start_us": float(i), "dur_us": d, "attribution": at}
                      for i, (a, d, at) in enumerate(zip(names, dur, attribution))], fmt="kineto", source="x")
    s = summarize(ev)
    assert s["total_us"].is_monotonic_decreasing
    for row in s.itertuples():
        sel = names == row.name
        assert row.count == sel.sum() and row.total_us == pytest.approx(dur[sel].sum())
        assert row.share == pytest.approx(dur[sel].sum() / dur.sum())
        assert row.graph_launch == (sel & (attribution == "graph_launch")).sum()
    assert s.attrs["total_us"] == pytest.approx(dur.sum())
    assert summarize(ev.iloc[:0]).empty


def test_summarize_dispatch(tmp_path):
    d = load_trace(write_synthetic_m3_trace(tmp_path / "d.jsonl.gz", tp=2, layers=5))
    s = summarize(d)
    assert s["calls"].sum() == len(d)
    attn = s[(s["op"] == "attention") & (s["path"] == "torch")].iloc[0]
    assert attn["layers"] == 5 and attn["rejected_paths"] == "attention.aiter_sparse_pa"
    assert s["share"].sum() == pytest.approx(1.0)
    assert isinstance(s, pd.DataFrame)


def test_summarize_by_other_columns():
    rng = np.random.default_rng()
    n = int(rng.integers(10, 60))
    ops = rng.choice(["aten::mm", None], n)
    ev = make_events([{"name": f"void gemm<{i % 3}>(int)", "kind": "kernel", "start_us": float(i),
                       "dur_us": 1.0, "cpu_op": op} for i, op in enumerate(ops)], fmt="kineto", source="x")
    merged = summarize(ev, by="short_name")
    assert merged["name"].tolist() == ["gemm"] and merged["count"].iloc[0] == n
    by_op = summarize(ev, by="cpu_op").set_index("name")["count"]
    assert by_op.sum() == n and by_op.get("(none)", 0) == sum(o is None for o in ops)
    with pytest.raises(M3LabError, match="no column"):
        summarize(ev, by="colour")


def test_aiter_line_deep_in_a_log_is_sniffed(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("INFO warming up\n" * 2000 + "[aiter] [fused_moe] using 1stage default for (304, 8)\n")
    assert sniff_format(path) == "aiter-log"
