"""Sweeps and tuning on a REAL local Ray instance (2 CPUs; a custom resource ``gpu_slot`` stands in for GPUs)."""
import json
import os
from pathlib import Path

import nbformat as nbf
import pytest
from typer.testing import CliRunner

from m3lab.errors import M3LabError

ray = pytest.importorskip("ray")  # installed by the README set-up and CI ('ray[default]')


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    path = os.environ.get("PYTHONPATH")  # workers import m3lab as the driver does (an editable install needs none)
    ray.init(num_cpus=2, resources={"gpu_slot": 2}, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}} if path else None)
    yield ray
    ray.shutdown()


def _tiny_pipeline(folder: Path) -> Path:
    """One trivial notebook: saves n*n, and raises for n == 2 (the failing point)."""
    cells = [nbf.v4.new_markdown_cell("# square"),
             nbf.v4.new_code_cell("n = 1  # the number to square", metadata={"tags": ["parameters"]}),
             nbf.v4.new_code_cell("from m3lab import artifacts\nif n == 2:\n    raise ValueError('n=2 is broken')\n"
                                  "artifacts.save('square', {'value': n * n})")]
    nb = nbf.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                   "language": "python"}})
    folder.mkdir(parents=True, exist_ok=True)
    nbf.write(nb, folder / "01_square.ipynb")
    (folder / "tiny.yaml").write_text("name: tiny\nsteps:\n  - notebook: 01_square.ipynb\n")
    return folder / "tiny.yaml"


def test_grid_file_is_checked(tmp_path):
    from m3lab.pipeline.grid_file import is_grid_file, load_grid

    _tiny_pipeline(tmp_path)
    g = tmp_path / "grid.yaml"
    g.write_text("pipeline: tiny.yaml\naxes: {n: [1, 3]}\noverrides: {}\nexecutor: ray\n"
                 "ray: {num_cpus: 1, resources: {gpu_slot: 1}}\n")
    grid = load_grid(g)
    assert is_grid_file(g) and not is_grid_file(tmp_path / "tiny.yaml")
    assert grid.axes == {"n": [1, 3]} and grid.executor == "ray" and grid.pipeline == str(tmp_path / "tiny.yaml")
    for text, field in (("pipeline: tiny.yaml\naxes: {n: [1, 1]}\n", "axes.n"),
                        ("pipeline: tiny.yaml\naxes: {n: [1]}\noverrides: {n: 2}\n", "overrides.n"),
                        ("pipeline: tiny.yaml\naxes: {n: [1]}\nexecutor: dask\n", "executor"),
                        ("pipeline: tiny.yaml\naxes: {n: [1]}\nsteps: []\n", "steps")):
        g.write_text(text)
        with pytest.raises(M3LabError) as err:
            load_grid(g)
        assert err.value.field == field
    from m3lab.cli.main import app
    g.write_text("pipeline: tiny.yaml\naxes: {n: [1]}\n")
    res = CliRunner().invoke(app, ["sweep", str(g), "--executor", "dask", "--out", str(tmp_path / "runs")])
    assert res.exit_code == 2 and "executor 'dask' is unknown" in res.output and not (tmp_path / "runs").exists()


def test_ray_sweep_reports_the_failing_point_and_finishes_the_others(local_ray, tmp_path):
    from m3lab.cli.main import app

    _tiny_pipeline(tmp_path)
    grid = tmp_path / "grid.yaml"
    grid.write_text("pipeline: tiny.yaml\naxes:\n  n: [1, 2, 3]\nexecutor: ray\n"
                    "ray: {num_cpus: 1, resources: {gpu_slot: 1}}\n")
    res = CliRunner().invoke(app, ["sweep", str(grid), "--out", str(tmp_path / "runs"), "--quiet"])
    assert res.exit_code == 1, res.output  # one point failed
    assert "2 ok, 1 failed" in res.output
    assert "n=2: FAILED: square: ValueError: n=2 is broken" in res.output   # a failed run, with its reason
    folder = Path(res.output.split("sweep folder: ")[1].split(" (")[0])
    record = json.loads((folder / "sweep.json").read_text())
    assert record["executor"].startswith("ray")
    assert [p["status"] for p in record["points"]] == ["ok", "failed", "ok"]
    assert "n=2 is broken" in record["points"][1]["error"]
    values = [json.loads((folder / p["run_dir"] / "artifacts" / "square" / "square.json").read_text())["value"]
              for p in record["points"] if p["status"] == "ok"]
    assert values == [1, 9]
    import pandas as pd
    table = pd.read_parquet(folder / "comparison.parquet")
    assert table["square.square.value"].tolist()[0::2] == [1, 9]


@pytest.mark.parametrize("address", ["127.0.0.1:1", "192.0.2.1:6379"])   # refused; a TEST-NET host nobody answers
def test_a_ray_sweep_against_an_unreachable_address_fails_in_one_line_within_30_s(tmp_path, address):
    import subprocess
    import sys
    import time

    pipe = _tiny_pipeline(tmp_path)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "m3lab", "sweep", str(pipe), "-g", "n=1", "--executor", "ray",
                          "--address", address, "--out", str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=120)
    assert time.monotonic() - t0 < 30, "a wrong address must not hang"
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and f"cannot join the Ray cluster at {address}" \
        in res.stderr
    assert not (tmp_path / "runs").exists()   # no sweep folder with a point left pending


def test_a_crashing_task_is_reported_while_the_others_finish(local_ray):
    from m3lab.pipeline.ray_executor import run_tasks

    def work(x):
        if x == 2:
            raise RuntimeError("boom at 2")
        return x * 10

    lines = []
    out = run_tasks(work, [(1,), (2,), (3,)], options={"num_cpus": 0, "resources": {"gpu_slot": 1}},
                    labels=["a", "b", "c"], echo=lines.append)
    assert [o.ok for o in out] == [True, False, True]
    assert [o.value for o in out] == [10, None, 30]
    assert "boom at 2" in out[1].error and out[1].error.startswith("RuntimeError")
    assert any("b: FAILED" in line for line in lines) and sum("done" in line for line in lines) == 2


def test_tuning_candidates_spread_over_one_worker_per_device(local_ray):
    from m3lab.pipeline.ray_executor import run_on_devices

    def bench(cfg):
        import os
        import time
        if cfg["BLOCK_SIZE_M"] == 32:
            raise ValueError("does not compile")
        time.sleep(0.05)
        return {"us": 100.0 / cfg["BLOCK_SIZE_M"], "pid": os.getpid()}

    cands = [{"BLOCK_SIZE_M": m} for m in (16, 32, 64, 128, 256)]
    out = run_on_devices(bench, cands, resource="gpu_slot", echo=lambda s: None)
    assert [o.ok for o in out] == [True, False, True, True, True]
    assert "does not compile" in out[1].error
    assert len({o.value["pid"] for o in out if o.ok}) == 2  # one actor per gpu_slot, round-robin
    assert min((o for o in out if o.ok), key=lambda o: o.value["us"]).index == 4
    with pytest.raises(M3LabError, match="no 'GPU' resource"):
        run_on_devices(bench, cands, resource="GPU", echo=lambda s: None)
