"""JupyterLab and the run report, used the way a person uses them: a real browser (Playwright driving Debian's
chromium) clicks through ``m3lab lab`` and ``report.html``. Screenshots are kept in pytest's tmp folder (paths
printed). A fresh CI machine installs chromium with ``.ci/browser_setup.sh``."""
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import nbformat as nbf
import pytest

playwright_sync = pytest.importorskip("playwright.sync_api")  # in m3lab's test extras

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("M3LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-dev-shm-usage"]
NOTEBOOK = "01_local_shapes.ipynb"


def _chromium() -> str:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"chromium not found at {CHROMIUM}: run .ci/browser_setup.sh (or set M3LAB_CHROMIUM)")
    return CHROMIUM


@pytest.fixture(scope="module")
def browser():
    with playwright_sync.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def _shot(page, path: Path) -> None:
    page.screenshot(path=str(path), full_page=False)
    print(f"screenshot: {path}")


def _settings(folder: Path) -> None:
    """JupyterLab user settings for an unattended test: no news/update pop-ups, no autosave."""
    (folder / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (folder / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    (folder / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (folder / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none"}))  # every cell in the page, as on a screen that scrolls
    (folder / "@jupyterlab" / "docmanager-extension").mkdir(parents=True)
    (folder / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings").write_text(
        json.dumps({"autosave": False}))


@pytest.fixture
def lab(tmp_path):
    """``m3lab lab`` on a copy of the notebooks (nothing in the checkout is written); yields its URL."""
    nbs = tmp_path / "notebooks"
    shutil.copytree(REPO / "notebooks", nbs)
    _settings(tmp_path / "lab-settings")
    env = {**os.environ, "M3LAB_NOTEBOOKS": str(nbs), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "lab-settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}
    proc = subprocess.Popen([sys.executable, "-m", "m3lab", "lab", "--port", "18888"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        url, log, deadline = None, [], time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                if proc.poll() is not None:
                    break
                continue
            log.append(line)
            m = re.search(r"JupyterLab: (http://127\.0\.0\.1:\d+/\S*token=\w+)", line)
            url = m.group(1) if m else None
        assert url, "m3lab lab printed no URL:\n" + "".join(log)
        base, token = url.split("/lab")[0], url.split("token=")[1]
        for _ in range(120):  # the server answers once it is up
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        yield {"base": base, "token": token, "notebooks": nbs}
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


def test_notebook_01_runs_in_jupyterlab(browser, lab, tmp_path):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    page.goto(f"{lab['base']}/lab/tree/{NOTEBOOK}?token={lab['token']}")
    expected = sum(c.cell_type == "code" for c in nbf.read(lab["notebooks"] / NOTEBOOK, as_version=4).cells)
    page.wait_for_function(f"document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell').length == {expected}")
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=90_000)  # the kernel has started
    _shot(page, tmp_path / "lab-1-opened.png")

    page.get_by_role("menuitem", name="Run", exact=True).click()  # as a person: Run > Run All Cells
    page.get_by_role("menuitem", name="Run All Cells", exact=False).first.click()
    deadline = time.monotonic() + 100
    done = False
    while time.monotonic() < deadline:
        prompts = page.locator(".jp-NotebookPanel .jp-CodeCell .jp-InputPrompt").all_inner_texts()
        if prompts and all(re.search(r"\[\d+\]", p) for p in prompts):
            done = True
            break
        if page.locator(".jp-NotebookPanel .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
                        ).filter(has_text="Traceback").count():
            break
        time.sleep(1)
    _shot(page, tmp_path / "lab-2-ran.png")
    errors = page.locator(".jp-NotebookPanel .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
                          ).filter(has_text=re.compile(r"Traceback|Error:")).all_inner_texts()
    assert not errors, f"a cell shows an error:\n{errors[0][:2000]}"
    assert done, f"not every code cell ran within the time limit: {prompts}"

    plot = page.locator(".jp-NotebookPanel .js-plotly-plot").first
    plot.scroll_into_view_if_needed()
    plot.locator(".main-svg").first.wait_for()
    assert page.locator(".jp-NotebookPanel .js-plotly-plot").count() >= 1
    _shot(page, tmp_path / "lab-3-figure.png")
    page.close()


def _report_run(tmp_path) -> Path:
    """A tiny run folder made by the pipeline runner: one notebook with a heading and a plotly bar chart."""
    from m3lab.pipeline.report import build_report
    from m3lab.pipeline.runner import run_pipeline

    d = tmp_path / "pipe"
    d.mkdir()
    cells = [nbf.v4.new_markdown_cell("# Bars\n\nA tiny step."),
             nbf.v4.new_code_cell("height = 3  # bar height", metadata={"tags": ["parameters"]}),
             nbf.v4.new_code_cell("from m3lab import nb\nimport plotly.graph_objects as go\nnb.setup()"),
             nbf.v4.new_markdown_cell("## The figure"),
             nbf.v4.new_code_cell("go.Figure(go.Bar(x=['a', 'b'], y=[height, 1]), "
                                  "layout_title_text='tiny bars (count, projected)')")]
    nbf.write(nbf.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                        "display_name": "Python 3"}}),
              d / "01_bars.ipynb")
    (d / "bars.yaml").write_text("name: bars\nsteps:\n  - notebook: 01_bars.ipynb\n")
    res = run_pipeline(d / "bars.yaml", [], tmp_path / "runs", progress=False, echo=lambda s: None)
    assert res.ok, res.failed_step
    return build_report(res.run_dir)


def test_report_has_a_table_of_contents_and_figures_respond_to_hover(browser, tmp_path):
    report = _report_run(tmp_path)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(report.as_uri())
    links = page.locator("nav a")
    texts = links.all_inner_texts()
    assert any("Run summary" in t for t in texts) and any("bars" in t for t in texts)
    assert any("The figure" in t for t in texts)  # headings of the notebook are listed under their step
    for href in links.evaluate_all("els => els.map(e => e.getAttribute('href'))"):
        assert page.locator(href).count() == 1, f"table of contents link {href} has no target"
    page.locator("nav a", has_text="The figure").click()
    bar = page.locator(".plotly-graph-div .bars path").first
    bar.wait_for()
    _shot(page, tmp_path / "report-1-toc.png")
    box = bar.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    hover = page.locator(".plotly-graph-div .hoverlayer .hovertext")
    hover.first.wait_for(timeout=10_000)
    assert "3" in hover.first.text_content()  # the hovered bar's value
    _shot(page, tmp_path / "report-2-hover.png")
    page.close()


def test_report_path_matrix_reads_as_a_teaching_figure(browser, tmp_path):
    """Notebook 04's path matrix in the report: a discrete legend (one entry per category), deployment names above
    the grid, only the rows where deployments differ, the path and its deciding vLLM line in the hover; then the
    worked 'why did this path not run' example names the condition that changed."""
    from m3lab import artifacts
    from m3lab.analysis.paths import CATEGORIES, path_cells
    from m3lab.pipeline.report import build_report
    from m3lab.pipeline.runner import run_pipeline

    (tmp_path / "p04.yaml").write_text("name: p04\nsteps:\n  - notebook: 04_fast_paths.ipynb\n")
    res = run_pipeline(tmp_path / "p04.yaml", [], tmp_path / "runs", progress=False, echo=lambda s: None)
    assert res.ok, res.failed_step
    report = build_report(res.run_dir)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(report.as_uri())
    fig = page.locator(".plotly-graph-div", has=page.locator(".gtitle", has_text="Code path per op")).first
    fig.scroll_into_view_if_needed()
    fig.locator(".main-svg").first.wait_for()
    _shot(page, tmp_path / "report-04-path-matrix.png")
    legend = fig.locator(".legend .traces .legendtext").all_text_contents()
    assert legend == list(CATEGORIES), legend        # discrete: one entry per category
    grid_top = fig.locator(".nsewdrag").first.bounding_box()["y"]
    names = fig.locator(".xtick text")
    assert names.count() >= 8 and all(box["y"] + box["height"] <= grid_top + 1 for box in
                                       (names.nth(i).bounding_box() for i in range(names.count())))   # on top
    rows = fig.locator(".ytick text").all_text_contents()
    table = artifacts.load("fast_path_resolution", run=res.run_dir, step="fast_paths")
    every = set(table["op"] + " · " + table["layer_kind"])
    assert "attention · sparse" in rows and set(rows) < every                    # only the rows where they differ
    assert len(rows) == path_cells(table, reference="MXFP8 TP4 optimised")["row"].nunique()
    marker = fig.locator(".scatterlayer .trace .points path").nth(3)
    box = marker.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    hover = fig.locator(".hoverlayer .hovertext")
    hover.first.wait_for(timeout=10_000)
    text = hover.first.text_content()
    assert "path:" in text and "decided by:" in text and "vllm/" in text, text   # the path's name lives here
    _shot(page, tmp_path / "report-04-hover.png")
    body = page.locator("body").inner_text()
    assert "because VLLM_ROCM_USE_AITER is 0" in body and "Why did this path not run?" in body
    page.close()


def test_report_shows_notebook_10s_accuracy_table(browser, tmp_path, monkeypatch):
    """Notebook 10's accuracy table in the report: every run the repository ships (M3 before and after, Qwen3.5,
    GLM-5.2) as a row per metric, each ratio the one m3lab computes (3 significant figures), read in the page."""
    from m3lab.analysis.display import format_number
    from m3lab.pipeline.report import build_report
    from m3lab.pipeline.runner import run_pipeline
    from m3lab.serving.accuracy import accuracy_table

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    (tmp_path / "p10.yaml").write_text("name: p10\nsteps:\n  - notebook: 10_serving_estimates.ipynb\n"
                                       "    parameters: {concurrencies: [8], num_prompts: 64}\n")
    res = run_pipeline(tmp_path / "p10.yaml", [], tmp_path / "runs", progress=False, echo=lambda s: None)
    assert res.ok, res.failed_step
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(build_report(res.run_dir).as_uri())
    heading = page.locator("h2", has_text="How far the estimate lands from every measurement m3lab ships")
    heading.scroll_into_view_if_needed()
    table = heading.locator("xpath=following::table[1]")
    table.wait_for()
    _shot(page, tmp_path / "report-10-accuracy.png")
    header = table.locator("thead th").all_inner_texts()
    assert {"run", "measured", "estimate", "estimate_over_measured"} <= set(h.strip() for h in header), header
    col = [h.strip() for h in header].index("estimate_over_measured")
    shown = [row.locator("td, th").nth(col).inner_text().strip() for row in table.locator("tbody tr").all()]
    want = accuracy_table()
    assert shown == [format_number(v) for v in want["estimate_over_measured"]]
    runs = set(t.strip() for t in table.locator("tbody tr td:nth-of-type(1)").all_inner_texts())
    assert runs == set(want["run"]) and len(runs) == 4
    page.close()


def test_sweep_html_reads_in_chromium(browser, tmp_path):
    """sweep.html as a person opens it: the chart with one bar per finished point, the headline number's column
    on screen at 1,400 px beside its label, the failed point's reason, and each point's report link resolving."""
    from typer.testing import CliRunner

    from m3lab.cli.main import app
    from notebook_files import write_notebook

    d = tmp_path / "p"
    d.mkdir()
    write_notebook(d / "01_point.ipynb", "n = 1  # the point",
                   "from m3lab import artifacts\nif n == 2:\n    raise ValueError('n=2 is broken')\n"
                   "artifacts.save('estimate', {'output_tokens_per_s_per_gpu': n * 100.0, "
                   "'label': 'projected: a test estimate', 'kind': 'projected'})")
    (d / "pipe.yaml").write_text("name: pipe\nsteps:\n  - notebook: 01_point.ipynb\n")
    res = CliRunner().invoke(app, ["sweep", str(d / "pipe.yaml"), "-g", "n=1,2,3", "--out", str(tmp_path / "runs")])
    assert res.exit_code == 1, res.output
    folder = Path(res.output.split("sweep folder: ")[1].split(" (")[0])
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto((folder / "sweep.html").as_uri())
    page.locator(".plotly-graph-div .bars path").first.wait_for()
    assert page.locator(".plotly-graph-div .bars path").count() == 2             # n=1 and n=3; n=2 failed
    _shot(page, tmp_path / "sweep-html.png")
    head = page.locator("th", has_text="output_tokens_per_s_per_gpu").first
    box = head.bounding_box()
    assert box["x"] + box["width"] <= 1400, box                                   # the headline is on screen
    body = page.locator("body").inner_text()
    assert "n=2 is broken" in body and "projected: a test estimate" in body and "2 of 3 points ok" in body
    for href in page.locator("a", has_text="report").evaluate_all("els => els.map(e => e.href)"):
        assert Path(href.removeprefix("file://")).is_file(), href
    page.close()
