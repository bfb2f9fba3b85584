"""Sweeps that are stopped and finished later, and that say what failed: sweep.json follows the points as they
finish, an interrupted sweep is resumed to its comparison (``m3lab sweep --resume``), ``m3lab report SWEEP``
rebuilds it, failed points show their reason on the terminal and in sweep.html, list axes name folders that read."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app
from m3lab.pipeline.sweep import point_name
from notebook_files import write_notebook

cli = CliRunner()


def _pipeline(folder: Path, gate: Path) -> Path:
    """One step: waits while ``gate`` exists, fails for n == 2, saves a labelled throughput n * 100."""
    folder.mkdir(parents=True, exist_ok=True)
    write_notebook(folder / "01_point.ipynb", "n = 1  # the point\nns = [1]  # a list axis",
                   f"import os, time\nwhile os.path.exists({str(gate)!r}) and n == 3:\n    time.sleep(0.2)",
                   "from m3lab import artifacts\nif n == 2:\n    raise ValueError('n=2 is broken')\n"
                   "artifacts.save('estimate', {'output_tokens_per_s_per_gpu': n * 100.0, "
                   "'label': 'projected: a test estimate', 'kind': 'projected'})")
    (folder / "pipe.yaml").write_text("name: pipe\nsteps:\n  - notebook: 01_point.ipynb\n")
    return folder / "pipe.yaml"


def test_failed_points_show_their_reason_and_sweep_html_keeps_labels_and_a_chart(tmp_path):
    yaml_path = _pipeline(tmp_path / "p", tmp_path / "no-gate")
    res = cli.invoke(app, ["sweep", str(yaml_path), "-g", "n=1,2", "--out", str(tmp_path / "runs")])
    assert res.exit_code == 1, res.output
    assert "n=2: failed: point: ValueError: n=2 is broken" in res.output           # the terminal says why
    assert "-> FAILED: point: ValueError: n=2 is broken" in res.output
    folder = Path(res.output.split("sweep folder: ")[1].split(" (")[0])
    html = (folder / "sweep.html").read_text()
    assert "n=2 is broken" in html and "projected: a test estimate" in html and "Plotly" in html
    table = pd.read_parquet(folder / "comparison.parquet")
    assert list(table.columns[:6]) == ["point", "n", "status", "error", "point.estimate.output_tokens_per_s_per_gpu",
                                       "point.estimate.kind"]
    assert table["status"].tolist() == ["ok", "failed"] and "n=2 is broken" in table["error"][1]
    assert str(tmp_path) not in html   # links are relative


def test_list_axes_name_folders_that_read():
    assert point_name(["tp=8", "concurrencies=[1, 8, 32]"]) == "tp=8,concurrencies=1+8+32"
    assert point_name(["ratios=[[1, 1], [2, 1]]"]) == "ratios=1x1+2x1"
    assert point_name(["concurrencies=[1, -8]"]) == "concurrencies=1+-8"


@pytest.mark.slow
def test_an_interrupted_sweep_is_resumed_to_its_comparison(tmp_path):
    gate = tmp_path / "gate"
    gate.write_text("hold point 3 until Ctrl-C")
    yaml_path = _pipeline(tmp_path / "p", gate)
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "m3lab", "sweep", str(yaml_path), "-g", "n=1,3", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        record = None
        while time.time() < deadline:
            found = list(out.glob("sweep-*/sweep.json"))
            record = json.loads(found[0].read_text()) if found else None
            if record and record["points"][0]["status"] == "ok" and list(out.glob("sweep-*/n=3/summary.json")):
                break                                       # point 1 finished and is in sweep.json; point 2 runs
            time.sleep(0.5)
        assert record and record["points"][0]["status"] == "ok", "point 1 never finished"
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "m3lab sweep --resume" in err.strip().splitlines()[-1], err
    folder = Path(err.strip().split("--resume ")[-1])
    record = json.loads((folder / "sweep.json").read_text())
    assert [p["status"] for p in record["points"]] == ["ok", "interrupted"]
    assert (folder / "comparison.parquet").is_file()    # what finished is compared already
    gate.unlink()
    res = cli.invoke(app, ["sweep", "--resume", str(folder)])
    assert res.exit_code == 0, res.output
    table = pd.read_parquet(folder / "comparison.parquet")
    assert table["status"].tolist() == ["ok", "ok"]
    assert table["point.estimate.output_tokens_per_s_per_gpu"].tolist() == [100.0, 300.0]
    assert "300" in (folder / "sweep.html").read_text()
    (folder / "comparison.parquet").unlink()
    rebuilt = cli.invoke(app, ["report", str(folder)])
    assert rebuilt.exit_code == 0 and rebuilt.output.strip().endswith("sweep.html"), rebuilt.output
    assert (folder / "comparison.parquet").is_file()


def test_resume_and_report_of_a_folder_that_is_not_a_sweep_are_one_line(tmp_path):
    res = cli.invoke(app, ["sweep", "--resume", str(tmp_path)])
    assert res.exit_code == 2 and "not a sweep folder" in res.output and len(res.output.strip().splitlines()) == 1
    res = cli.invoke(app, ["sweep", "checklist", "--resume", str(tmp_path)])
    assert res.exit_code == 2 and "--resume takes the sweep folder alone" in res.output
