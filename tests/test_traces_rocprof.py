"""rocprofv3 readers: the public JSON sample, CSV with current / older / legacy headers, errors."""
import gzip
import json
import re

import numpy as np
import pytest

from m3lab.errors import M3LabError
from m3lab.traces import load_trace, read_rocprof_csv, summarize

SAMPLE = "tracelens_rocprofv3_908_results.json.gz"


@pytest.fixture(scope="module")
def sample(shared_dir):
    return shared_dir / "data" / "rocprof" / SAMPLE


def test_json_sample_every_dispatch_counted(sample):
    ev = load_trace(sample)
    # independent of the reader: every (start, end) pair in the raw text (only dispatch records have them)
    raw = re.findall(r'"start_timestamp":\s*(\d+),\s*"end_timestamp":\s*(\d+)', gzip.open(sample).read().decode())
    assert ev.attrs["format"] == "rocprofv3-json" and ev.attrs["device_name"] == "AMD Instinct MI350X"
    assert len(ev) == len(raw) == 43915
    raw_ns = sum(int(end) - int(start) for start, end in raw)
    assert ev["dur_us"].sum() == pytest.approx(raw_ns / 1e3, rel=1e-12)
    assert (ev["attribution"] == "unattributed").all()
    assert not ev["name"].str.startswith("kernel_id=").any()  # every kernel_id named via kernel_symbols
    s = summarize(ev)
    assert s["share"].sum() == pytest.approx(1.0) and s["count"].sum() == len(ev)
    assert s.iloc[0]["short_name"].startswith("ncclDevKernel")  # the all-reduce dominates this run


CURRENT = ('"Kind","Agent_Id","Queue_Id","Stream_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name",'
           '"Correlation_Id","Start_Timestamp","End_Timestamp","LDS_Block_Size","Scratch_Size","VGPR_Count",'
           '"Accum_VGPR_Count","SGPR_Count","Workgroup_Size_X","Workgroup_Size_Y","Workgroup_Size_Z",'
           '"Grid_Size_X","Grid_Size_Y","Grid_Size_Z"')
OLDER = ('"Kind","Agent_Id","Queue_Id","Kernel_Id","Kernel_Name","Correlation_Id","Start_Timestamp",'
         '"End_Timestamp","Private_Segment_Size","Group_Segment_Size","Workgroup_Size_X","Workgroup_Size_Y",'
         '"Workgroup_Size_Z","Grid_Size_X","Grid_Size_Y","Grid_Size_Z"')


def _rows(rng, n):
    start = rng.integers(10**12, 2 * 10**12, n)
    dur = rng.integers(1000, 10**6, n)
    return [(i, int(s), int(s + d), f"kern_{i % 3}<float>(int)") for i, (s, d) in enumerate(zip(start, dur))], dur


def test_csv_current_header(tmp_path):
    rng = np.random.default_rng()
    rows, dur = _rows(rng, int(rng.integers(3, 40)))
    lines = [CURRENT] + [f'"KERNEL_DISPATCH",2,1,5,99,{i},{i},"{name}",{i + 1},{s},{e},0,0,8,0,16,256,1,1,1024,1,1'
                         for i, s, e, name in rows]
    path = tmp_path / "kernel_trace.csv"
    path.write_text("\n".join(lines) + "\n")
    ev = load_trace(path)
    assert ev.attrs["format"] == "rocprofv3-csv" and len(ev) == len(rows)
    assert ev["dur_us"].sum() == pytest.approx(dur.sum() / 1e3)
    assert set(ev["stream"]) == {5} and set(ev["device"]) == {2}
    assert set(ev["grid"]) == {(4, 1, 1)} and set(ev["block"]) == {(256, 1, 1)}  # 1024 work-items / 256


def test_csv_older_header_and_text_agent(tmp_path):
    rng = np.random.default_rng()
    rows, dur = _rows(rng, 5)
    lines = [OLDER] + [f'"KERNEL_DISPATCH","Agent 4",3,{i},"{name}",{i},{s},{e},0,0,64,1,1,640,1,1'
                       for i, s, e, name in rows]
    path = tmp_path / "old.csv"
    path.write_text("\n".join(lines) + "\n")
    ev = read_rocprof_csv(path)
    assert set(ev["device"]) == {4} and set(ev["stream"]) == {3} and set(ev["grid"]) == {(10, 1, 1)}
    assert ev["dur_us"].sum() == pytest.approx(dur.sum() / 1e3)


def test_csv_legacy_rocprof_results(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text('"Index","KernelName","gpu-id","queue-id","grd","wgr","BeginNs","EndNs"\n'
                    '0,"k1",1,0,"(2048,1,1)","(256,1,1)",1000,3000\n')
    ev = load_trace(path)
    assert ev["dur_us"].tolist() == [2.0] and ev["grid"].tolist() == [(8, 1, 1)]


def test_csv_missing_columns_and_truncation(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text('"Kind","Kernel_Name","Start_Timestamp"\n"K","k",5\n')
    with pytest.raises(M3LabError, match="lacks column\\(s\\) End_Timestamp"):
        read_rocprof_csv(bad)
    cut = tmp_path / "cut.csv"
    cut.write_text(CURRENT + '\n"KERNEL_DISPATCH",2,1,5,99,1,1,"k",1,100,200,0,0,8,0,16,256,1,1,1024,1,1\n'
                   '"KERNEL_DISPATCH",2,1,5,99,2,2,"k",2,300\n')
    with pytest.raises(M3LabError, match="line 3 is incomplete"):
        read_rocprof_csv(cut)


def test_json_without_dispatch_records(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"rocprofiler-sdk-tool": [{"metadata": {}}]}))
    with pytest.raises(M3LabError, match="lacks buffer_records.kernel_dispatch"):
        load_trace(path)
