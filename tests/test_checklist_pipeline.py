"""Acceptance of the foundation: the README's main job runs every checklist step on CPU, and the
report holds every step with its figures still interactive and labelled measured or projected."""
import json
import re

import nbformat
import pytest

from m3lab.pipeline.runner import run_pipeline
from m3lab.pipeline.spec import load_pipeline

LABEL = re.compile(r"measured|projected|published|analytic", re.I)


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["checklist", "kernels"])
def test_builtin_pipeline_runs_every_step_on_cpu(pipeline, tmp_path):
    res = run_pipeline(pipeline, [], tmp_path, progress=False, echo=lambda s: None)
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert summary["status"] == "ok", summary["steps"]
    steps = load_pipeline(pipeline).steps
    assert [s["name"] for s in summary["steps"]] == [s.name for s in steps]
    assert all(s["status"] == "ok" for s in summary["steps"])

    html = (res.run_dir / "report.html").read_text()
    assert html.count('<section class="nb"') == len(steps)
    for s in steps:
        assert f">{s.name} <" in html or s.name in html

    figures = 0
    for s in summary["steps"]:
        nb = nbformat.read(res.run_dir / s["output"], as_version=4)
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                fig = out.get("data", {}).get("application/vnd.plotly.v1+json")
                if fig is None:
                    continue
                figures += 1
                title = fig["layout"].get("title", {})
                text = title.get("text", "") if isinstance(title, dict) else str(title)
                assert LABEL.search(text), f"{s['name']}: figure title says neither measured nor projected: {text!r}"
    assert figures and html.count("Plotly.newPlot") == figures  # every figure stays interactive
    assert html.count("plotly.js v") <= 1 or html.count("Plotly.newPlot") > 0
