"""The GPU capture script, run on the CPU with the mini model: both trace files are written and readable."""
import gzip
import json

import pytest

from m3lab.capture.gpu import capture
from m3lab.traces import read_dispatch_trace


@pytest.mark.slow
def test_capture_writes_dispatch_and_profiler_traces(tmp_path):
    s = capture(str(tmp_path), model="minimax-m3-mini", plan={"tp": 2}, layers=2, prefill=(40,), decodes=1,
                device="cpu", commit="abc1234")
    assert s["name"] == "m3_tp2_L0-1_cpu_abc1234"
    d = read_dispatch_trace(tmp_path / f"{s['name']}.dispatch.jsonl.gz")
    assert d.attrs["header"]["commit"] == "abc1234" and d.attrs["header"]["plan"]["tp"] == 2
    assert (d.t_us > 0).all() and set(d.layer) == {-1, 0, 1}
    assert "gemm.mxfp8_dot_scaled_decode" in d.attrs["header"]["kernels_attached"]
    assert s["check_vs_reference"]["rel_err_logits"] == 0  # on the CPU every op runs its reference
    with gzip.open(tmp_path / f"{s['name']}.kineto.json.gz", "rt") as fh:
        trace = json.load(fh)
    assert trace["m3lab"]["commit"] == "abc1234" and trace["m3lab"]["device"] == "cpu"
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("m3lab::attention[L1]") for n in names)  # dispatcher ranges label the profile
