"""Pipelines under bad values and faults: values fail before anything runs, through the library's validators;
the operating system and concurrency never produce a traceback; runs survive a full disk, Ctrl-C and a second
process, and resume (with changed parameters, from another checkout) to ok."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat as nbf
import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app
from m3lab.errors import M3LabError
from notebook_files import toy_pipeline
from m3lab.pipeline.params import resolve_parameters
from m3lab.pipeline.run_folder import RunLock, load_summary, new_run_dir
from m3lab.pipeline.runner import resume_run, run_pipeline
from m3lab.pipeline.spec import load_pipeline

cli = CliRunner()
QUIET = dict(progress=False, echo=lambda s: None)


@pytest.fixture
def toy(tmp_path):
    """first (saves n) -> big (prints `big` kB of text; sleeps `pause` s) -> last (reads n)."""
    return toy_pipeline(tmp_path)


def _runs(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


# ---- 3. bad values fail before anything runs -------------------------------------------------------------------

@pytest.mark.parametrize("param, field", [("tp=3", "tp"), ("quant=int3", "quant"), ("isl=-5", "isl"),
                                          ("hardware=tpu9", "hardware"), ("model=nosuch-model", "model"),
                                          ("serving_estimates.calibration=nosuch", "calibration"),
                                          ("concurrency=5000", "concurrency"), ("routing=zipf:x", "routing"),
                                          ("preset=nosuch", "preset"), ("settings={max_num_seq: 8}", "settings")])
def test_bad_values_fail_before_anything_runs_in_one_line(param, field, tmp_path):
    res = cli.invoke(app, ["run", "-p", param, "--out", str(tmp_path / "runs")])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: parameter {field} "), res.output
    assert "Traceback" not in res.output and "--" not in lines[0].split(")")[0]
    assert not (tmp_path / "runs").exists()


def test_tp3_exits_2_in_under_5_s_naming_tp_and_the_heads(tmp_path):
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "m3lab", "run", "-p", "tp=3", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - t0
    assert res.returncode == 2 and elapsed < 5.0, (res.returncode, elapsed, res.stderr)
    assert res.stderr.count("\n") == 1 and "tp" in res.stderr and "query heads" in res.stderr
    assert not list(tmp_path.iterdir())


def test_device_cuda_without_a_gpu_fails_up_front(tmp_path):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    res = cli.invoke(app, ["run", "-p", "correctness_gates.device=cuda", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "device" in res.output and "no GPU" in res.output and "--device" not in res.output


@pytest.mark.parametrize("word", ["None", "none", "null", "~"])
def test_none_none_and_null_all_mean_null(word):
    params = resolve_parameters(load_pipeline("checklist"), [f"calibration={word}"])
    assert all(p["calibration"] is None for p in params.values() if "calibration" in p)


def test_resume_with_a_parameter_reruns_from_the_first_step_it_changes(toy):
    res = run_pipeline(toy["yaml"], [], toy["out"], **QUIET)
    assert res.ok and _runs(toy["log"]) == ["first", "big", "last"]
    res = resume_run(res.run_dir, ["scale=5"], **QUIET)
    assert res.ok and _runs(toy["log"])[3:] == ["last"]
    assert json.loads((res.run_dir / "artifacts/last/total.json").read_text())["total"] == 15
    res = resume_run(res.run_dir, ["n=4"], **QUIET)           # step 1 changes: everything runs again
    assert _runs(toy["log"])[4:] == ["first", "big", "last"]
    assert load_summary(res.run_dir)["parameters"]["last"] == {"scale": 5}
    with pytest.raises(M3LabError, match="scale"):
        resume_run(res.run_dir, ["scale=abc"], **QUIET)


# ---- 4. no tracebacks from the operating system or concurrency -------------------------------------------------

def _mount(target: Path, opts: str) -> bool:
    target.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(target)], capture_output=True).returncode == 0


def _umount(target: Path) -> None:
    subprocess.run(["umount", "-l", str(target)], capture_output=True)


@pytest.fixture
def read_only_dir(tmp_path):
    d = tmp_path / "ro"
    if _mount(d, "ro,size=64k"):
        yield d
        _umount(d)
    elif os.geteuid() != 0:
        d.chmod(0o555)
        yield d
        d.chmod(0o755)
    else:
        pytest.skip("cannot make a read-only folder here (root, and mount not permitted)")


def _one_line_error(res, *words):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.output.strip().count("\n") == 0, res.output
    for w in words:
        assert w in res.output, (w, res.output)


def test_read_only_out_folder_is_one_line(read_only_dir):
    _one_line_error(cli.invoke(app, ["run", "kernels", "--out", str(read_only_dir / "runs")]), "Read-only")


def test_report_and_resume_in_a_read_only_run_folder_are_one_line(toy, tmp_path):
    res = run_pipeline(toy["yaml"], [], toy["out"], **QUIET)
    mnt = tmp_path / "ro-run"
    if not _mount(mnt, "size=32m"):
        pytest.skip("mount not permitted here")
    try:
        shutil.copytree(res.run_dir, mnt / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        out = cli.invoke(app, ["report", str(mnt / "run")])
        _one_line_error(out, "Read-only", "report.html")
        assert "partial" not in out.output
        _one_line_error(cli.invoke(app, ["run", "--resume", str(mnt / "run")]), "Read-only")
    finally:
        _umount(mnt)


def test_out_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    _one_line_error(cli.invoke(app, ["run", "kernels", "--out", str(tmp_path / "afile")]), "is a file")
    _one_line_error(cli.invoke(app, ["sweep", "kernels", "-g", "device=[cpu]", "--out", str(tmp_path / "afile")]))


def test_gate_save_into_a_missing_folder_fails_before_the_gates(tmp_path):
    t0 = time.perf_counter()
    res = cli.invoke(app, ["gate", "--only", "mx.*", "--save", str(tmp_path / "missing" / "dir" / "x.csv")])
    _one_line_error(res, "--save", "does not exist")
    assert time.perf_counter() - t0 < 5


def test_two_sweeps_in_the_same_second_get_two_folders(toy, monkeypatch):
    import m3lab.pipeline.run_folder as rf

    class Frozen(rf.datetime):
        @classmethod
        def now(cls, tz=None):
            return rf.datetime(2026, 11, 30, 12, 0, 0)
    monkeypatch.setattr(rf, "datetime", Frozen)
    from m3lab.pipeline.sweep import parse_axes, run_sweep
    a = run_sweep(toy["yaml"], parse_axes(["scale=1"]), ["big=0"], toy["out"], echo=lambda s: None)
    b = run_sweep(toy["yaml"], parse_axes(["scale=1"]), ["big=0"], toy["out"], echo=lambda s: None)
    assert Path(a["folder"]).name == "sweep-toy-20261130-120000" and Path(b["folder"]).name.endswith("-2")
    # point folders are named by their overrides; the sweep ends with one comparison table and one report
    assert [Path(p["run_dir"]).name for p in a["points"]] == ["scale=1"]
    import pandas as pd
    table = pd.read_parquet(Path(a["folder"]) / "comparison.parquet")
    assert table.loc[0, "scale"] == "1" and table.loc[0, "last.total.total"] == 3 and table.loc[0, "status"] == "ok"
    html = (Path(a["folder"]) / "sweep.html").read_text()
    assert "scale=1/report.html" in html and "last.total.total" in html
    assert str(toy["out"]) not in (Path(a["folder"]) / "sweep.json").read_text()   # relative run folders
    assert {new_run_dir(toy["out"], "x").name, new_run_dir(toy["out"], "x").name} == {"x-20261130-120000",
                                                                                      "x-20261130-120000-2"}


@pytest.mark.parametrize("grid, words", [(["tp=[4,8"], ["tp", "not a list"]), (["tp=4,8", "tp=2"], ["twice"]),
                                         (["tp=4,4"], ["repeats"])])
def test_malformed_or_duplicate_grid_axes_are_one_line(grid, words, tmp_path):
    args = ["sweep", *sum((["-g", g] for g in grid), []), "--out", str(tmp_path)]
    _one_line_error(cli.invoke(app, args), *words)
    assert not list(tmp_path.iterdir())


def test_report_survives_a_truncated_notebook_and_rejects_a_malformed_summary(toy):
    res = run_pipeline(toy["yaml"], [], toy["out"], **QUIET)
    nb = res.run_dir / res.summary["steps"][1]["output"]
    nb.write_text(nb.read_text()[:300])
    out = cli.invoke(app, ["report", str(res.run_dir)])
    assert out.exit_code == 0, out.output
    html = (res.run_dir / "report.html").read_text()
    assert "cannot be read" in html and "[unreadable]" in html and html.count('<section class="nb"') == 3
    (res.run_dir / res.summary["steps"][2]["output"]).unlink()
    cli.invoke(app, ["report", str(res.run_dir)])
    assert "missing from the run folder" in (res.run_dir / "report.html").read_text()
    for bad in ("[1, 2]", '{"steps": [{"name": "x"}]}', "{"):
        (res.run_dir / "summary.json").write_text(bad)
        _one_line_error(cli.invoke(app, ["report", str(res.run_dir)]), "summary.json")


@pytest.mark.slow
def test_ctrl_c_exits_130_with_one_line_saying_how_to_resume(toy):
    proc = subprocess.Popen([sys.executable, "-m", "m3lab", "run", str(toy["yaml"]), "-p", "pause=60", "--quiet",
                             "--out", str(toy["out"])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while "big" not in _runs(toy["log"]) and time.time() < deadline:
            time.sleep(0.5)
        assert "big" in _runs(toy["log"]), "step 2 never started"
        os.killpg(proc.pid, signal.SIGINT)   # as a terminal's Ctrl-C: the whole process group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted: resume with: m3lab run "
                                                                             "--resume "), err
    run_dir = Path(err.strip().split("--resume ")[-1])
    summary = load_summary(run_dir)
    assert summary["status"] == "interrupted" and summary["steps"][1]["status"] == "interrupted"
    assert resume_run(run_dir, ["pause=0"], **QUIET).ok


# ---- 5. runs survive faults --------------------------------------------------------------------------------------

def test_full_disk_ends_failed_with_finished_notebooks_intact_and_resumes_to_ok(toy, tmp_path, monkeypatch):
    disk = tmp_path / "disk"
    real = _mount(disk, "size=400k")
    if not real:  # a fault-injecting writer: the second step's executed notebook cannot be written
        import papermill.iorw as iorw
        original = iorw.write_ipynb

        def failing(nb, path, *a, **k):
            if "02_big" in str(path) and os.environ.get("UX_FULL") == "1":
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return original(nb, path, *a, **k)
        monkeypatch.setattr(iorw, "write_ipynb", failing)
        monkeypatch.setenv("UX_FULL", "1")
    try:
        res = run_pipeline(toy["yaml"], ["big=600"], disk, **QUIET)   # 600 kB of output in a 400 kB disk
        assert res.summary["status"] == "failed" and load_summary(res.run_dir)["status"] == "failed"
        step = res.summary["steps"][1]
        assert step["status"] == "failed" and "No space left" in step["error"]
        first = res.run_dir / res.summary["steps"][0]["output"]
        nbf.validate(nbf.read(first, as_version=4))                  # the finished notebook is intact
        assert not (res.run_dir / step["output"]).exists()           # no half-written notebook
        assert not [p for p in res.run_dir.iterdir() if ".partial" in p.name]
        if real:
            subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        else:
            monkeypatch.setenv("UX_FULL", "0")
        res = resume_run(res.run_dir, **QUIET)
        assert res.ok and _runs(toy["log"]) == ["first", "big", "big", "last"]
        for s in res.summary["steps"]:
            nbf.validate(nbf.read(res.run_dir / s["output"], as_version=4))
    finally:
        if real:
            _umount(disk)


def test_a_run_folder_in_use_is_locked(toy):
    res = run_pipeline(toy["yaml"], [], toy["out"], **QUIET)
    with RunLock(res.run_dir):
        with pytest.raises(M3LabError, match=f"in use by pid {os.getpid()}"):
            resume_run(res.run_dir, **QUIET)
    assert resume_run(res.run_dir, **QUIET).ok      # the lock goes with its holder


def test_a_run_folder_resumes_from_another_place_and_refuses_another_pipeline(toy, tmp_path):
    res = run_pipeline(toy["yaml"], ["big=0"], toy["out"], **QUIET)
    text = (res.run_dir / "summary.json").read_text()
    assert str(tmp_path) not in text                  # every stored path is relative
    moved = tmp_path / "elsewhere" / "deep" / "pipe"
    shutil.copytree(toy["dir"], moved)                # the pipeline moves with the run folder
    shutil.copytree(res.run_dir, moved.parent / "runs" / res.run_dir.name)
    shutil.rmtree(toy["dir"])
    again = moved.parent / "runs" / res.run_dir.name
    assert resume_run(again, ["scale=3"], **QUIET).ok
    out = cli.invoke(app, ["run", "kernels", "--resume", str(again)])
    _one_line_error(out, "pipeline 'toy'", "not 'kernels'")


def test_run_into_a_full_disk_from_the_cli_has_no_traceback(toy, tmp_path):
    disk = tmp_path / "tiny"
    if not _mount(disk, "size=24k"):
        pytest.skip("mount not permitted here")
    try:
        res = cli.invoke(app, ["run", str(toy["yaml"]), "-p", "big=100", "--out", str(disk)])
        assert res.exit_code in (1, 2) and "Traceback" not in res.output, res.output
        assert "No space left on device" in res.output
        assert "resume" in res.output or res.exit_code == 2
    finally:
        _umount(disk)
