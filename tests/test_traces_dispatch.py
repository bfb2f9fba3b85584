"""Dispatch-trace writer/reader: round trip (plain and gzip) and clear errors on bad files."""
import gzip
import json

import numpy as np
import pytest

from m3lab.errors import M3LabError
from m3lab.traces import DispatchTraceWriter, read_dispatch_header, read_dispatch_trace, rejections


def _random_calls(rng, n):
    calls = []
    for seq in range(n):
        m = int(rng.integers(1, 512))
        calls.append(dict(op=str(rng.choice(["qkv_proj", "attention", "moe_gate_up"])),
                          layer=int(rng.integers(-1, 60)),
                          shapes={"x": [m, 6144], "w": [int(rng.integers(1, 9000)), 6144]},
                          dtypes={"x": "bfloat16", "w": "float8_e4m3fn"},
                          path=str(rng.choice(["fast", "torch_ref"])), kernels=[f"k{seq}"],
                          rejected=[("other", f"M <= 64 (got M={m})")],
                          t_us=float(rng.uniform(1, 100)) if seq % 2 else None))
    return calls


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_round_trip(tmp_path, suffix):
    rng = np.random.default_rng()
    calls = _random_calls(rng, int(rng.integers(5, 30)))
    path = tmp_path / f"d{suffix}"
    with DispatchTraceWriter(path, device="cuda:0", commit="abc123", model="minimax-m3", plan={"tp": 4}) as w:
        for c in calls:
            w.write(**c)
    df = read_dispatch_trace(path)
    assert len(df) == len(calls)
    assert df.attrs["header"]["plan"] == {"tp": 4} and df.attrs["header"]["commit"] == "abc123"
    assert list(df["seq"]) == list(range(len(calls)))
    for row, c in zip(df.itertuples(), calls):
        assert (row.op, row.layer, row.path, row.shapes) == (c["op"], c["layer"], c["path"], c["shapes"])
        assert row.rejected == [{"path": "other", "condition": c["rejected"][0][1]}]
        assert row.device == "cuda:0"
        assert (np.isnan(row.t_us) if c["t_us"] is None else row.t_us == pytest.approx(c["t_us"]))
    rej = rejections(df)
    assert len(rej) == len(calls) and set(rej["rejected_path"]) == {"other"}
    assert read_dispatch_header(path)["format"] == "m3lab.dispatch"


def test_torch_dtypes_and_sizes_are_normalised(tmp_path):
    torch = pytest.importorskip("torch")
    with DispatchTraceWriter(tmp_path / "t.jsonl", device="cpu") as w:
        rec = w.write("o_proj", layer=0, shapes={"x": torch.Size([3, 4])}, dtypes={"x": torch.bfloat16},
                      path="p")
    assert rec["shapes"] == {"x": [3, 4]} and rec["dtypes"] == {"x": "bfloat16"}


def _good(tmp_path, n=5):
    path = tmp_path / "good.jsonl"
    with DispatchTraceWriter(path, device="cpu") as w:
        for i in range(n):
            w.write("attention", layer=i, shapes={"q": [1, 2]}, dtypes={}, path="p")
    return path


def test_truncated_gzip(tmp_path):
    raw = gzip.compress(_good(tmp_path, 200).read_bytes())
    bad = tmp_path / "cut.jsonl.gz"
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(M3LabError, match="truncated gzip"):
        read_dispatch_trace(bad)


def test_truncated_last_line_names_the_line(tmp_path):
    text = _good(tmp_path).read_text()
    bad = tmp_path / "cut.jsonl"
    bad.write_text(text[:-15])
    with pytest.raises(M3LabError, match="line 6 is not valid JSON"):
        read_dispatch_trace(bad)


def test_wrong_header_and_missing_keys(tmp_path):
    lines = _good(tmp_path).read_text().splitlines()
    no_header = tmp_path / "nh.jsonl"
    no_header.write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(M3LabError, match="line 1 is not an m3lab dispatch-trace header"):
        read_dispatch_trace(no_header)
    rec = json.loads(lines[3])
    del rec["path"], rec["rejected"]
    missing = tmp_path / "mk.jsonl"
    missing.write_text("\n".join(lines[:3] + [json.dumps(rec)] + lines[4:]) + "\n")
    with pytest.raises(M3LabError, match="line 4 lacks path, rejected"):
        read_dispatch_trace(missing)
    future = tmp_path / "v9.jsonl"
    future.write_text(lines[0].replace('"version":1', '"version":9') + "\n")
    with pytest.raises(M3LabError, match="version 9"):
        read_dispatch_trace(future)


def test_empty_and_missing_file(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(M3LabError, match="empty dispatch trace"):
        read_dispatch_trace(tmp_path / "e.jsonl")
    with pytest.raises(M3LabError, match="not found"):
        read_dispatch_trace(tmp_path / "nope.jsonl")
