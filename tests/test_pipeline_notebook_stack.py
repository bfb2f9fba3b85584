"""``m3lab run`` on a Python without the notebook stack (an offline ``pip install --no-deps -e .`` on a GPU image):
one line naming the missing packages and the install command, exit 2, and no run folder made or left ``running``."""
import importlib.util
import json

from typer.testing import CliRunner

from m3lab.cli.main import app
from m3lab.pipeline import notebook_stack
from notebook_files import write_notebook

cli = CliRunner()


def _without(monkeypatch, *names):
    real = importlib.util.find_spec
    monkeypatch.setattr(notebook_stack.importlib.util, "find_spec",
                        lambda name, *a, **kw: None if name in names else real(name, *a, **kw))


def _pipeline(tmp_path):
    write_notebook(tmp_path / "01_one.ipynb", "n = 1  # a number", "n + 1")
    (tmp_path / "one.yaml").write_text("name: one\nsteps:\n  - notebook: 01_one.ipynb\n")
    return tmp_path / "one.yaml"


def test_missing_papermill_and_ipykernel_is_one_line_and_no_run_folder(tmp_path, monkeypatch):
    _without(monkeypatch, "papermill", "ipykernel")
    res = cli.invoke(app, ["run", str(_pipeline(tmp_path)), "--out", str(tmp_path / "runs")])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "papermill, ipykernel" in lines[0] and "python3 -m pip install papermill ipykernel" \
        in lines[0], res.output
    assert not (tmp_path / "runs").exists()


def test_resume_without_the_stack_leaves_the_run_as_it_was(tmp_path, monkeypatch):
    from m3lab.pipeline.runner import run_pipeline
    res = run_pipeline(_pipeline(tmp_path), [], tmp_path / "runs", progress=False, echo=lambda s: None)
    summary = json.loads((res.run_dir / "summary.json").read_text())
    summary["status"], summary["steps"][0]["status"] = "failed", "failed"
    (res.run_dir / "summary.json").write_text(json.dumps(summary))
    _without(monkeypatch, "papermill")
    out = cli.invoke(app, ["run", "--resume", str(res.run_dir)])
    assert out.exit_code == 2 and "papermill" in out.output and len(out.output.strip().splitlines()) == 1
    assert json.loads((res.run_dir / "summary.json").read_text())["status"] == "failed"   # not stuck "running"


def test_the_stack_is_there_in_the_test_venv():
    assert notebook_stack.missing_packages() == []
