"""The recorded GPU run of ``m3lab run kernels`` (traces/pipeline_runs): 07, 08 and 09 measured live by default on
the H200, every figure of theirs labelled with the device and the run's commit, no target passed on missing points."""
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_kernels_run_on_the_h200_measured_07_08_09_live():
    runs = sorted((REPO / "traces" / "pipeline_runs").glob("kernels_NVIDIA_H200_*.json"))
    assert runs
    for path in runs:
        run = json.loads(path.read_text())
        assert run["status"] == "ok" and "H200" in run["device"] and path.stem.endswith(run["commit"])
        steps = {s["step"]: s for s in run["steps"]}
        for name in ("gemm_tiling", "grouped_moe", "sparse_attention"):
            s = steps[name]
            assert s["live"] and s["measured_live"], name
            assert not any("device" in p for p in s["parameters"]), "the device was the default (auto)"
            measured = [f for f in s["figures"] if "analytic" not in f and "projected" not in f]
            assert measured and all(f"measured live on NVIDIA_H200, commit {run['commit']}" in f for f in measured)
            for row in s["targets"]:
                assert "not measured" not in row or row.endswith(("| info", "not measured")), row   # incomplete
