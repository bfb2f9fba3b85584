"""The pipeline runner: parameter validation, artifacts between steps, report, failure and resume."""
import json
from pathlib import Path

import nbformat as nbf
import pytest

from m3lab.errors import M3LabError
from notebook_files import write_notebook
from m3lab.pipeline.params import notebook_parameters, parse_overrides, resolve_parameters
from m3lab.pipeline.runner import resume_run, run_pipeline
from m3lab.pipeline.spec import list_pipelines, load_pipeline


@pytest.fixture
def toy(tmp_path):
    """A three-step pipeline: produce -> consume -> flaky (raises until a marker file exists)."""
    d = tmp_path / "pipe"
    d.mkdir()
    counter = tmp_path / "executions.log"
    marker = tmp_path / "fixed"
    write_notebook(d / "01_produce.ipynb", "n = 5  # rows to make\nlabel = 'x'  # a label",
              "from m3lab import artifacts\nimport pandas as pd",
              f"open({str(counter)!r}, 'a').write('produce\\n')",
              "artifacts.save('table', pd.DataFrame({'i': range(n), 'label': label}))",
              "artifacts.save('meta', {'n': n, 'label': label})")
    write_notebook(d / "02_consume.ipynb", "scale = 2.0  # multiplier\nn = 1  # unused here",
              "from m3lab import artifacts",
              f"open({str(counter)!r}, 'a').write('consume\\n')",
              "t = artifacts.load('table'); meta = artifacts.load('meta')",
              "assert len(t) == meta['n'], (len(t), meta)",
              "artifacts.save('total', {'total': float(t.i.sum() * scale)})")
    write_notebook(d / "03_flaky.ipynb", "strict = True  # raise unless fixed",
              "from pathlib import Path\nfrom m3lab import artifacts",
              f"open({str(counter)!r}, 'a').write('flaky\\n')",
              f"if strict and not Path({str(marker)!r}).exists():\n    raise RuntimeError('flaky step is broken')",
              "artifacts.save('done', {'total': artifacts.load('total')['total']})")
    (d / "toy.yaml").write_text(
        "name: toy\ndescription: test pipeline\nsteps:\n"
        "  - notebook: 01_produce.ipynb\n    parameters: {label: 'y'}\n"
        "  - notebook: 02_consume.ipynb\n"
        "  - notebook: 03_flaky.ipynb\n")
    return {"yaml": d / "toy.yaml", "counter": counter, "marker": marker, "out": tmp_path / "runs"}


def test_builtin_pipelines_load():
    assert {"checklist", "kernels"} <= set(list_pipelines())
    for name in list_pipelines():
        pipe = load_pipeline(name)
        assert pipe.steps
        for step in pipe.steps:
            assert step.notebook.is_file()
            notebook_parameters(step.notebook)  # every notebook has a parseable parameters cell


def test_parameters_cell_is_read_with_defaults_and_help(toy):
    params = notebook_parameters(load_pipeline(toy["yaml"]).step("produce").notebook)
    assert list(params) == ["n", "label"]
    assert params["n"].default == 5 and params["n"].help == "rows to make"


def test_overrides_parse_as_yaml():
    assert parse_overrides(["tp=8", "shapes.isl=4096", "q=mxfp8", "ms=[1, 8]", "f=0.5", "b=false"]) == [
        (None, "tp", 8), ("shapes", "isl", 4096), (None, "q", "mxfp8"), (None, "ms", [1, 8]),
        (None, "f", 0.5), (None, "b", False)]
    with pytest.raises(M3LabError, match="KEY=VALUE"):
        parse_overrides(["tp"])


def test_override_applies_to_every_declaring_step_or_one(toy):
    pipe = load_pipeline(toy["yaml"])
    assert resolve_parameters(pipe, ["n=7"]) == {"produce": {"label": "y", "n": 7}, "consume": {"n": 7}, "flaky": {}}
    assert resolve_parameters(pipe, ["consume.n=3"])["produce"] == {"label": "y"}
    assert resolve_parameters(pipe, ["scale=3"])["consume"] == {"scale": 3.0}  # int widens to float


@pytest.mark.parametrize("bad, words", [
    (["bogus=1"], ["'bogus'", "valid keys", "label", "n", "scale", "strict"]),
    (["n=abc"], ["'n'", "int", "abc"]),
    (["strict=1"], ["'strict'", "bool"]),
    (["nostep.n=1"], ["no step named 'nostep'", "produce"]),
    (["flaky.n=1"], ["has no parameter 'n'", "strict"]),
])
def test_bad_parameters_fail_before_anything_runs(toy, bad, words):
    with pytest.raises(M3LabError) as err:
        run_pipeline(toy["yaml"], bad, toy["out"], progress=False, echo=lambda s: None)
    for w in words:
        assert w in str(err.value)
    assert not toy["out"].exists() and not toy["counter"].exists()  # nothing was created or executed


def test_failure_keeps_earlier_steps_and_resume_completes(toy):
    res = run_pipeline(toy["yaml"], ["n=4"], toy["out"], progress=False, echo=lambda s: None)
    assert not res.ok and res.failed_step["name"] == "flaky"
    assert "RuntimeError: flaky step is broken" in res.failed_step["error"]
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert [s["status"] for s in summary["steps"]] == ["ok", "ok", "failed"]
    # earlier outputs are kept, and the failed notebook holds its traceback
    assert (res.run_dir / "artifacts" / "consume" / "total.json").is_file()
    failed_nb = nbf.read(res.run_dir / "03_flaky.ipynb", as_version=4)
    assert any(o.get("output_type") == "error" for c in failed_nb.cells for o in c.get("outputs", []))
    assert "flaky step is broken" in (res.run_dir / "report.html").read_text()
    assert not list(res.run_dir.rglob("*.partial*"))  # no half-written files

    toy["marker"].write_text("fixed")
    res2 = resume_run(res.run_dir, progress=False, echo=lambda s: None)
    assert res2.ok and res2.run_dir == res.run_dir
    assert toy["counter"].read_text().split() == ["produce", "consume", "flaky", "flaky"]  # no re-execution
    assert json.loads((res.run_dir / "artifacts" / "flaky" / "done.json").read_text()) == {"total": 12.0}
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["parameters"]["produce"] == {"label": "y", "n": 4}
    assert summary["resumed"]


def test_summary_records_environment_durations_and_artifacts(toy):
    toy["marker"].write_text("fixed")
    res = run_pipeline(toy["yaml"], [], toy["out"], progress=False, echo=lambda s: None)
    assert res.ok
    s = json.loads((res.run_dir / "summary.json").read_text())
    env = s["environment"]
    assert env["packages"]["papermill"] and env["packages"]["pandas"] and env["device"] and env["git_commit"]
    steps = {st["name"]: st for st in s["steps"]}
    assert steps["produce"]["artifacts"] == ["meta.json", "table.parquet"]
    assert all(st["duration_s"] > 0 for st in s["steps"])
    assert res.run_dir.name.startswith("toy-")


def test_report_holds_every_step_with_toc(toy):
    toy["marker"].write_text("fixed")
    res = run_pipeline(toy["yaml"], [], toy["out"], progress=False, echo=lambda s: None)
    html = (res.run_dir / "report.html").read_text()
    for name in ("produce", "consume", "flaky"):
        assert f"#step-" in html and name in html
    assert html.count('<section class="nb"') == 3
    assert "Plotly.newPlot" not in html or "plotly.js" in html.lower()
    assert "<nav>" in html and "Run summary" in html


def test_sweep_runs_every_grid_point_after_validating_all(toy):
    from m3lab.pipeline.sweep import grid_points, parse_axes, run_sweep

    axes = parse_axes(["n=2,3", "scale=[1.5]"])
    assert axes == {"n": [2, 3], "scale": [1.5]}
    assert grid_points(axes) == [["n=2", "scale=1.5"], ["n=3", "scale=1.5"]]
    with pytest.raises(M3LabError, match="'n'"):
        run_sweep(toy["yaml"], parse_axes(["n=2,x"]), out_dir=toy["out"], echo=lambda s: None)
    assert not toy["out"].exists()  # the bad point was caught before anything ran

    toy["marker"].write_text("fixed")
    rec = run_sweep(toy["yaml"], axes, ["flaky.strict=false"], toy["out"], echo=lambda s: None)
    assert [p["status"] for p in rec["points"]] == ["ok", "ok"]
    totals = [json.loads((Path(p["run_dir"]) / "artifacts" / "consume" / "total.json").read_text())["total"]
              for p in rec["points"]]
    assert totals == [1.5, 4.5]  # sum(range(n)) * scale
    assert json.loads((Path(rec["folder"]) / "sweep.json").read_text())["points"][1]["overrides"][-1] == "scale=1.5"
