"""The run report: every executed notebook of a run in one self-contained HTML page.

A table of contents and the run summary come first; each notebook follows with its markdown,
code, tables and figures. Plotly figures (the ``application/vnd.plotly.v1+json`` outputs that
:func:`m3lab.nb.setup` makes) stay interactive: plotly.js is embedded once, inline, so the file
opens offline. Images are inlined as data URIs.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from m3lab.atomic import write_text
from m3lab.pipeline.run_folder import REPORT, load_summary

PLOTLY_MIME = "application/vnd.plotly.v1+json"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;display:flex;color:#1d2330}
nav{position:sticky;top:0;height:100vh;overflow:auto;min-width:240px;max-width:280px;background:#f4f6fa;
    padding:1rem;border-right:1px solid #dde2ea;font-size:14px}
nav a{display:block;color:#234;text-decoration:none;margin:.25rem 0}
nav a.sub{margin-left:1rem;color:#556;font-size:13px}
main{flex:1;padding:1rem 2rem;max-width:1200px;overflow-x:auto}
section.nb{border-top:3px solid #345;margin-top:2rem;padding-top:.5rem}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;font-size:12.5px;border-radius:4px}
pre.out{background:#fff;border-left:3px solid #ccd}
pre.err{background:#fff0f0;border-left:3px solid #c33}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #dde;padding:2px 6px;text-align:left;
    vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums}
div.out{overflow-x:auto}
.status-ok{color:#1a7f37;font-weight:600}.status-failed{color:#c33;font-weight:600}
.status-pending,.status-running{color:#888}.status-interrupted,.status-missing,.status-unreadable{color:#b7950b;font-weight:600}
"""


def build_report(run_dir: str | Path) -> Path:
    """(Re)build ``report.html`` of a run folder from its executed notebooks and summary."""
    import nbformat

    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    sections, toc = [], []
    for i, step in enumerate(summary["steps"]):
        path = run_dir / step["output"]
        anchor = f"step-{i}"
        number = _number(step["output"], i)
        status = step["status"]
        problem = None
        if not path.is_file():
            problem = ("its executed notebook is missing from the run folder" if status == "ok"
                       else f"not executed ({status})")
            status = "missing" if status == "ok" else status
        else:
            try:
                nb = nbformat.read(path, as_version=4)
            except Exception as err:  # truncated or damaged JSON: show the rest of the run
                problem = f"its executed notebook {step['output']} cannot be read ({type(err).__name__}); " \
                          f"re-run the step with: m3lab run --resume {run_dir}"
                status = "unreadable"
        toc.append(f'<a href="#{anchor}">{number} {html.escape(step["name"])} '
                   f'<span class="status-{status}">[{status}]</span></a>')
        if problem:
            sections.append(f'<section class="nb" id="{anchor}"><h1>{number} · {html.escape(step["name"])}</h1>'
                            f'<p class="status-{status}">{html.escape(problem)}</p></section>')
            continue
        body, headings = render_notebook(nb, anchor)
        toc.extend(f'<a class="sub" href="#{a}">{html.escape(t)}</a>' for a, t in headings)
        sections.append(f'<section class="nb" id="{anchor}"><p><small>step {number} · '
                        f'{html.escape(step["output"])} · <span class="status-{status}">'
                        f'{status}</span></small></p>{body}</section>')
    page = _page(summary, "\n".join(toc), "\n".join(sections))
    return write_text(run_dir / REPORT, page)


def render_notebook(nb: Any, anchor: str) -> tuple[str, list[tuple[str, str]]]:
    """HTML of one notebook and its (anchor, title) headings for the table of contents."""
    from nbconvert.filters.markdown import markdown2html

    parts, headings = [], []
    for j, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            parts.append(markdown2html(cell.source))
            for k, m in enumerate(re.finditer(r"^#{1,2}\s+(.+)$", cell.source, flags=re.M)):
                a = f"{anchor}-h{j}-{k}"
                parts.append(f'<a id="{a}"></a>')
                headings.append((a, m.group(1).strip()))
        elif cell.cell_type == "code":
            if "injected-parameters" in cell.metadata.get("tags", []):
                parts.append("<p><small>parameters injected by the run:</small></p>")
            parts.append(_highlight(cell.source))
            parts.extend(_render_output(o, f"{anchor}-c{j}-{n}") for n, o in enumerate(cell.get("outputs", [])))
    return "\n".join(parts), headings


# What a batch kernel's progress bars leave behind: tqdm's warning where ipywidgets is missing (two lines: the
# warning and the source line it quotes), and a widget whose state no executed notebook keeps (its text is a
# frozen "0%" bar). Neither is a result; the report leaves them out.
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_TQDM_WARNING = re.compile(r"^[^\n]*TqdmWarning: IProgress not found[^\n]*\n(?:[ \t]+[^\n]*\n?)?", re.M)


def _render_output(out: Any, div_id: str) -> str:
    kind = out.get("output_type")
    if kind == "stream":
        text = _ANSI.sub("", "".join(out.get("text", "")))
        text = _TQDM_WARNING.sub("", text) if out.get("name") == "stderr" else text
        return f'<pre class="out">{html.escape(text)}</pre>' if text.strip() else ""
    if WIDGET_VIEW in out.get("data", {}):
        return ""
    if kind == "error":
        tb = _ANSI.sub("", "\n".join(out.get("traceback", [])))
        return f'<pre class="err">{html.escape(tb)}</pre>'
    data = out.get("data", {})
    if PLOTLY_MIME in data:
        fig = json.dumps(wrap_title(data[PLOTLY_MIME])).replace("</", "<\\/")
        return (f'<div id="{div_id}" class="plotly-graph-div"></div><script>(function(){{var f={fig};'
                f'Plotly.newPlot("{div_id}",f.data,f.layout||{{}},{{responsive:true}});}})();</script>')
    if "text/html" in data:
        return f'<div class="out">{align_numbers("".join(data["text/html"]))}</div>'
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            return f'<img src="data:{mime};base64,{"".join(data[mime]).strip()}"/>'
    if "image/svg+xml" in data:
        return "".join(data["image/svg+xml"])
    if "text/markdown" in data:
        from nbconvert.filters.markdown import markdown2html
        return markdown2html("".join(data["text/markdown"]))
    if "text/plain" in data:
        return f'<pre class="out">{html.escape("".join(data["text/plain"]))}</pre>'
    return ""


_NUMBER = re.compile(r"^\s*[-+]?(?:[\d,]*\.?\d+(?:[eE][-+]?\d+)?|nan|NaN|inf|-inf)\s*(?:%|[kMGT]?B|×|x)?\s*$")
_TD = re.compile(r"<td([^>]*)>(.*?)</td>", re.S)


def align_numbers(table_html: str) -> str:
    """Mark the cells of an HTML table that hold a number ``class="num"`` (right-aligned); text stays left."""
    def mark(m: re.Match) -> str:
        attrs, text = m.group(1), m.group(2)
        if "class=" in attrs or not _NUMBER.match(html.unescape(re.sub(r"<[^>]+>", "", text))):
            return m.group(0)
        return f'<td class="num"{attrs}>{text}</td>'
    return _TD.sub(mark, table_html)


def wrap_title(fig: dict, width: int = 95) -> dict:
    """Break a plotly figure title longer than ``width`` characters into lines (plotly clips long titles at the
    figure's edge), and make room for the extra lines above the plot."""
    layout = fig.get("layout", {})
    title = layout.get("title")
    text = title.get("text") if isinstance(title, dict) else title
    if not isinstance(text, str) or len(re.sub(r"<[^>]+>", "", text)) <= width:
        return fig
    head, sep, sub = text.partition("<br>")
    lines, line = [], ""
    for word in re.split(r"(?<=[ —;,:])", head):
        if len(line) + len(word) > width and line:
            lines.append(line.rstrip())
            line = ""
        line += word
    lines.append(line.rstrip())
    new = "<br>".join(lines) + (sep + sub if sep else "")
    extra = 22 * (len(lines) - 1)
    margin = dict(layout.get("margin") or {})
    margin["t"] = max(margin.get("t", 80), 80) + extra
    layout = {**layout, "title": {**(title if isinstance(title, dict) else {}), "text": new}, "margin": margin}
    return {**fig, "layout": layout}


def _number(output: str, position: int) -> str:
    """A step's number: its notebook's (``04_fast_paths.ipynb`` -> 04), else its position in the pipeline."""
    m = re.match(r"(\d+)_", output)
    return m.group(1) if m else f"{position:02d}"


def _highlight(source: str) -> str:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer
    return highlight(source, PythonLexer(), HtmlFormatter(noclasses=True, style="friendly"))


def _summary_row(step: dict) -> str:
    dur = "" if step.get("duration_s") is None else f"{step['duration_s']:.1f} s"
    arts = html.escape(", ".join(step.get("artifacts") or []))
    err = html.escape(step.get("error") or "")
    return (f"<tr><td style='text-align:left'>{html.escape(step['name'])}</td>"
            f"<td class='status-{step['status']}'>{step['status']}</td><td>{dur}</td>"
            f"<td style='text-align:left'>{arts}</td><td style='text-align:left'>{err}</td></tr>")


def _page(summary: dict, toc: str, body: str) -> str:
    from plotly.offline import get_plotlyjs

    env = summary.get("environment", {})
    rows = "".join(_summary_row(s) for s in summary["steps"])
    params = html.escape(json.dumps(summary.get("parameters", {}), indent=1))
    values = html.escape(json.dumps(summary.get("parameter_values", {}), indent=1))
    title = f"m3lab run {summary.get('run_id', '')}"
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style><script type="text/javascript">{get_plotlyjs()}</script></head><body>
<nav><b>{html.escape(title)}</b><a href="#summary">Run summary</a>{toc}</nav><main>
<h1 id="summary">{html.escape(title)}</h1>
<p>pipeline <b>{html.escape(summary.get('pipeline', ''))}</b> · status
<span class="status-{summary.get('status')}">{summary.get('status')}</span> · created {summary.get('created')}
· device {html.escape(str(env.get('device')))} · commit {html.escape(str(env.get('git_commit')))}</p>
<table><tr><th>step</th><th>status</th><th>duration</th><th>artifacts</th><th>error</th></tr>{rows}</table>
<details><summary>parameters (non-default values injected per step)</summary><pre>{params}</pre></details>
<details><summary>every parameter value each step ran with (defaults included)</summary><pre>{values}</pre></details>
<details><summary>package versions</summary><pre>{html.escape(json.dumps(env.get('packages', {}), indent=1))}</pre></details>
{body}</main></body></html>"""
