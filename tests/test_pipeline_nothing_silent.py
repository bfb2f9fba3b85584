"""Pipeline inputs are used or refused (a mistyped step field, non-UTF-8 or malformed YAML, list elements), and the
recovery advice works (a lost executed notebook is run again; a run that could not start leaves no folder).
Each CLI case is the review's command: its exit status and its first line."""
import errno
import json
import subprocess
import sys
import time

import nbformat as nbf
import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app
from m3lab.pipeline.run_folder import load_summary
from m3lab.pipeline.runner import resume_run, run_pipeline
from notebook_files import toy_pipeline

cli = CliRunner()
QUIET = dict(progress=False, echo=lambda s: None)


@pytest.fixture
def toy(tmp_path):
    return toy_pipeline(tmp_path)


def _first_line(res) -> str:
    return res.output.strip().splitlines()[0] if res.output.strip() else ""


def _refused(res, *words) -> str:
    """rc 2, one line, no traceback, naming ``words``."""
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    for w in words:
        assert w in res.output, (w, res.output)
    return _first_line(res)


@pytest.mark.parametrize("body, words", [
    ("name: x\nsteps:\n  - name: a\n    notebook: 01_first.ipynb\n    parameter: {n: 8}\n",
     ("unknown field 'parameter'", "did you mean 'parameters'")),
    ("name: x\nsteps:\n  - notebook: 01_first.ipynb\n    extra: 1\n", ("unknown field 'extra'",)),
    ("name: x\nsteps: [{notebook: 01_first.ipynb}]\nstep: []\n", ("unknown field(s) ['step']",)),
])
def test_a_mistyped_pipeline_field_is_refused_before_anything_runs(toy, body, words):
    path = toy["dir"] / "typo.yaml"
    path.write_text(body)
    first = _refused(cli.invoke(app, ["run", str(path), "--out", str(toy["out"])]), *words)
    assert first.startswith("Error: pipeline file") and not toy["out"].exists() and not toy["log"].exists()


@pytest.mark.parametrize("command", ["run", "sweep"])
@pytest.mark.parametrize("content, words", [
    (b"# caf\xe9\nname: x\nsteps:\n  - notebook: 01_first.ipynb\n", ("not UTF-8 text", "byte 0xe9")),
    (bytes(range(128, 256)) * 3, ("not UTF-8 text",)),
])
def test_non_utf8_pipeline_and_grid_files_are_one_line(toy, command, content, words):
    path = toy["dir"] / "latin1.yaml"
    path.write_bytes(content)
    _refused(cli.invoke(app, [command, str(path), "--out", str(toy["out"])]), *words)
    assert not toy["out"].exists()


def test_a_malformed_grid_file_reports_its_yaml_error_not_a_missing_grid(toy):
    path = toy["dir"] / "badgrid.yaml"
    path.write_text("pipeline: toy.yaml\naxes: {n: [1, 2]\n")
    first = _refused(cli.invoke(app, ["sweep", str(path), "--out", str(toy["out"])]), "not valid YAML", "line 3")
    assert "needs a grid" not in first


@pytest.mark.parametrize("value, words", [("[1,x]", ("element 1 is 'x'", "list of int")),
                                          ("[1,-8]", ("concurrencies[1]=-8", ">= 1")),
                                          ("[1,2.5]", ("element 1 is 2.5",))])
def test_list_parameter_elements_are_checked_before_any_step(value, words, tmp_path):
    t0 = time.monotonic()
    res = cli.invoke(app, ["run", "-p", f"concurrencies={value}", "--out", str(tmp_path / "runs")])
    _refused(res, "concurrencies", *words)
    assert not (tmp_path / "runs").exists() and time.monotonic() - t0 < 30   # not after the first steps ran


@pytest.mark.parametrize("param, words", [("capacities_tokens=[null,5]", ("less than one block",)),
                                          ("policies=[lru,fifo]", ("'fifo' is not an eviction policy",)),
                                          ("sharding_tps=[1,3]", ("tp 3",))])
def test_other_list_parameters_are_checked_by_the_library(param, words, tmp_path):
    _refused(cli.invoke(app, ["run", "-p", param, "--out", str(tmp_path / "runs")]), *words)


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_resume_runs_again_a_step_whose_executed_notebook_is_lost(toy, damage):
    res = run_pipeline(toy["yaml"], [], toy["out"], **QUIET)
    nb = res.run_dir / res.summary["steps"][1]["output"]
    if damage == "delete":
        nb.unlink()
    else:
        nb.write_text(nb.read_text()[:200])
    said = []
    again = resume_run(res.run_dir, progress=False, echo=said.append)
    assert again.ok and toy["log"].read_text().split() == ["first", "big", "last", "big"]
    assert any("02_big.ipynb" in line and "running it again" in line for line in said), said
    nbf.validate(nbf.read(nb, as_version=4))


def test_a_run_that_cannot_write_its_first_summary_leaves_no_folder(toy, monkeypatch):
    import m3lab.pipeline.runner as runner

    def full(path, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(runner, "write_json", full)
    first = _refused(cli.invoke(app, ["run", str(toy["yaml"]), "--out", str(toy["out"])]),
                     "No space left on device", "start the run again")
    assert "--resume" not in first
    assert toy["out"].is_dir() and not list(toy["out"].iterdir())   # no half folder holding only .lock


def test_summary_records_every_parameter_value_not_only_overrides(toy):
    res = run_pipeline(toy["yaml"], ["scale=5"], toy["out"], **QUIET)
    summary = load_summary(res.run_dir)
    assert summary["parameters"] == {"first": {}, "big": {}, "last": {"scale": 5}}
    assert summary["parameter_values"] == {"first": {"n": 3}, "big": {"big": 1, "pause": 0.0},
                                           "last": {"scale": 5}}
    assert json.loads((res.run_dir / "summary.json").read_text())["parameter_values"]["big"]["pause"] == 0.0


def test_a_library_progress_bar_leaves_nothing_in_the_report(tmp_path):
    """A batch kernel's tqdm bar is a frozen widget, or tqdm's 'IProgress not found' warning without ipywidgets
    (the review saw it in step 04): the report shows neither."""
    from m3lab.pipeline.report import build_report
    from notebook_files import write_notebook

    d = tmp_path / "p"
    d.mkdir()
    warning = ("/venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: @ not found. Please update "
               "jupyter and ipywidgets.\n  from .autonotebook import tqdm as notebook_tqdm\n")   # @: kept out of the
    # cell's source, which the report shows
    write_notebook(d / "01_bar.ipynb", "n = 3  # items", "from tqdm.auto import tqdm\nfor _ in tqdm(range(n)):\n    pass",
                   f"import sys\nsys.stderr.write({warning!r}.replace('@', 'IProg' + 'ress'))\nprint('result 42')")
    (d / "bar.yaml").write_text("name: bar\nsteps:\n  - notebook: 01_bar.ipynb\n")
    res = run_pipeline(d / "bar.yaml", [], tmp_path / "runs", **QUIET)
    page = build_report(res.run_dir).read_text()
    assert res.ok and "result 42" in page
    assert "IProgress" not in page and "0/3 [" not in page


def test_shipped_tables_cite_repository_paths_not_this_machines():
    from m3lab.serving.speculation import acceptance_table
    from m3lab.serving.vllm_bench import shipped_bench_table

    for table in (shipped_bench_table(), acceptance_table()):
        assert not any(str(s).startswith("/") for s in table["source"]), table["source"].tolist()
    assert shipped_bench_table()["source"].str.startswith("m3lab/serving/data/inferencex_").all()


def test_a_parameters_comment_with_an_equals_sign_prints_nothing_on_success(tmp_path):
    """The review: `m3lab run -p calibration=none` printed papermill's "Unable to parse line 8 'accept_len = 2.7
    # ... spec_tokens=3 ...'" on a successful run."""
    from notebook_files import write_notebook

    d = tmp_path / "p"
    d.mkdir()
    write_notebook(d / "01_eq.ipynb", "accept_len = 2.7  # tokens per step with spec_tokens=3\nn = 1  # rows",
                   "print(accept_len * n)")
    (d / "eq.yaml").write_text("name: eq\nsteps:\n  - notebook: 01_eq.ipynb\n")
    res = subprocess.run([sys.executable, "-m", "m3lab", "run", str(d / "eq.yaml"), "-p", "n=2", "--out",
                          str(tmp_path / "runs")], capture_output=True, text=True, timeout=300)  # pytest would
    assert res.returncode == 0, res.stderr                                                     # catch the log
    assert res.stderr == "", res.stderr
