"""Acceptance of the foundation: the README's main job runs every checklist step on CPU, and the report holds
every step with its figures still interactive, labelled measured, projected or published, and nothing in it
misleads: no empty chart, no absolute path, no file the repository does not have. The report is rendered in
headless Chromium when it is installed; the screenshots stay in the test's tmp folder."""
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from m3lab.pipeline.params import notebook_parameters
from m3lab.pipeline.runner import run_pipeline
from m3lab.pipeline.spec import load_pipeline
from m3lab.pipeline.validate import DEPLOYMENT_PARAMETERS
from m3lab.spec.serving import default_deployment

LABEL = re.compile(r"measured|projected|published|analytic", re.I)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _figures(run_dir: Path, summary: dict):
    for s in summary["steps"]:
        nb = nbformat.read(run_dir / s["output"], as_version=4)
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                fig = out.get("data", {}).get("application/vnd.plotly.v1+json")
                if fig is not None:
                    yield s["name"], fig


def _title(fig: dict) -> str:
    title = fig["layout"].get("title", {})
    return title.get("text", "") if isinstance(title, dict) else str(title)


def _has_data(fig: dict) -> bool:
    """A chart shows something: some trace has a finite non-zero value (or it is a table)."""
    for trace in fig.get("data", []):
        if trace.get("type") == "table":
            return True
        for axis in ("x", "y", "z", "values"):
            vals = trace.get(axis)
            if isinstance(vals, dict):     # plotly's typed-array encoding: present and non-empty
                if vals.get("bdata"):
                    return True
                continue
            for v in _flat(vals or []):
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v != 0:
                    return True
    return False


def _flat(values):
    """Values of a trace axis, nested lists (a heatmap's z rows) flattened."""
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        else:
            yield v


KERNEL_STEPS = ("gemm_tiling", "grouped_moe", "sparse_attention")
RECORDED = re.compile(r"recorded: measured on \S+, commit \w+, \d{4}-\d\d-\d\d")
LONG_FLOAT = re.compile(r"\d\.\d{7,}")


def _shown_text(run_dir: Path, summary: dict):
    """What a reader sees of each non-figure output: its HTML (a table) if any, else its text."""
    for s in summary["steps"]:
        nb = nbformat.read(run_dir / s["output"], as_version=4)
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if "application/vnd.plotly.v1+json" not in data:
                    yield s["name"], data.get("text/html") or data.get("text/plain") or out.get("text", "")


def test_checklist_notebooks_share_one_deployment_vocabulary():
    """Every checklist notebook with a deployment declares the same keys with the same defaults (None: the
    preset's), so -p tp=8 moves every step; the default deployment is the checklist's."""
    declared = {}
    for step in load_pipeline("checklist").steps:
        params = notebook_parameters(step.notebook)
        if any(k in params for k in DEPLOYMENT_PARAMETERS):
            declared[step.name] = {k: repr(step.parameters.get(k, params[k].default)) if k in params else "missing"
                                   for k in DEPLOYMENT_PARAMETERS}
    assert set(declared) >= {"local_shapes", "repetition", "byte_planes", "fast_paths", "iterative_profiling",
                             "serving_estimates"}
    assert len({tuple(v.items()) for v in declared.values()}) == 1, declared
    d = default_deployment()
    assert (d.model.name, d.quant.name, d.plan.tp, d.workload.isl, d.workload.osl, d.workload.concurrency) == \
        ("minimax-m3", "mxfp8", 4, 8192, 1024, 32)


def _screenshots(report: Path, steps: int, out: Path) -> list[Path]:
    """One PNG per step: the report with only that step's section shown (Chromium captures the window only)."""
    html = report.read_text(encoding="utf-8")
    shots = []
    for i in range(steps):
        page = report.parent / f".screenshot-{i}.html"
        css = (f"<style>nav{{display:none}} section.nb{{display:none}} #step-{i}{{display:block}}"
               "#summary,#summary~p,#summary~table,#summary~details{display:none}</style></head>")
        page.write_text(html.replace("</head>", css, 1), encoding="utf-8")
        png = out / f"step-{i}.png"
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--hide-scrollbars", "--window-size=1400,16000", "--virtual-time-budget=20000",
                        f"--screenshot={png}", page.as_uri()], capture_output=True, timeout=300)
        page.unlink()
        shots.append(png)
    return shots


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["checklist", "kernels"])
def test_builtin_pipeline_runs_every_step_on_cpu(pipeline, tmp_path):
    res = run_pipeline(pipeline, [], tmp_path, progress=False, echo=lambda s: None)
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert summary["status"] == "ok", summary["steps"]
    steps = load_pipeline(pipeline).steps
    assert [s["name"] for s in summary["steps"]] == [s.name for s in steps]
    assert all(s["status"] == "ok" for s in summary["steps"])
    assert summary["environment"]["packages"]["vllm"] == "0.33.0", "the set-up installs vLLM; every run records it"

    html = (res.run_dir / "report.html").read_text()
    assert html.count('<section class="nb"') == len(steps)
    for s in summary["steps"]:   # each step in the TOC, numbered by its notebook, with its status
        assert f'{s["output"][:2]} {s["name"]} <span class="status-ok">[ok]</span>' in html, s["name"]
    assert "PosixPath(" not in html and str(tmp_path) not in html      # no absolute path of this machine
    assert "MISSION.md" not in html and "METHOD.md" not in html

    figures = list(_figures(res.run_dir, summary))
    for step, fig in figures:
        assert LABEL.search(_title(fig)), f"{step}: figure title says neither measured nor projected: {_title(fig)!r}"
        assert _has_data(fig), f"{step}: empty chart {_title(fig)!r}"
        if step in KERNEL_STEPS and "recorded" in _title(fig):   # on a CPU: the recorded rows' own commit and date
            assert RECORDED.search(_title(fig)), f"{step}: {_title(fig)!r}"
    for step, text in _shown_text(res.run_dir, summary):
        assert not LONG_FLOAT.search(text), f"{step}: an unrounded number in {text[:300]!r}"
        assert not text.lstrip().startswith("{"), f"{step}: a bare dict: {text[:200]!r}"
    if pipeline == "kernels":
        kernel_figs = [_title(f) for step, f in figures if step in KERNEL_STEPS and "analytic" not in _title(f)
                       and "projected" not in _title(f)]
        assert kernel_figs and all("recorded: measured on" in t for t in kernel_figs)
    assert figures and html.count("Plotly.newPlot") == len(figures)   # every figure stays interactive
    assert html.count("plotly.js v") == 1                              # plotly.js embedded once

    if CHROMIUM:
        from PIL import Image
        out = tmp_path / "screenshots"
        out.mkdir()
        for png in _screenshots(res.run_dir / "report.html", len(steps), out):
            im = Image.open(png).convert("L")
            assert im.getextrema()[0] < 100, f"{png.name}: blank page"   # something dark was drawn
