"""Trace figures build from the analysers' DataFrames and label unit and device."""
import numpy as np
import pytest

pytest.importorskip("plotly")

from m3lab.plots.traces import time_share_bar, timeline, verification_bar  # noqa: E402
from m3lab.traces import summarize, verify  # noqa: E402
from m3lab.traces.table import make_events  # noqa: E402
from m3lab.traces.examples import write_synthetic_m3_trace  # noqa: E402


def _events(n):
    rng = np.random.default_rng()
    return make_events([{"name": f"k{rng.integers(5)}", "kind": "kernel", "start_us": float(i * 10),
                         "dur_us": float(rng.uniform(1, 9)), "stream": int(rng.integers(2)), "device": 0,
                         "attribution": str(rng.choice(["cpu_op", "graph_launch"]))} for i in range(n)],
                       fmt="kineto", source="x", device_name="MI300X")


def test_time_share_and_timeline():
    ev = _events(50)
    fig = time_share_bar(summarize(ev), top=3)
    assert len(fig.data[0].x) == 3 and "MI300X" in fig.layout.title.text and "%" in fig.layout.xaxis.title.text
    tl = timeline(ev, max_events=20)
    assert sum(len(t.x) for t in tl.data) == 20 and "µs" in tl.layout.xaxis.title.text


def test_verification_bar(tmp_path):
    v = verify("minimax_m3_tp4", write_synthetic_m3_trace(tmp_path / "d.jsonl", tp=2))
    fig = verification_bar(v.results)
    assert "fail" in list(fig.data[0].text)
