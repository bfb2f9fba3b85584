"""Notebook hygiene: the papermill convention every notebook follows (STYLE.md)."""
import ast
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_convention(path):
    nb = nbformat.read(path, as_version=4)
    cells = nb.cells
    assert cells[0].cell_type == "markdown", "first cell: what the step is for"
    tagged = [i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and cells[tagged[0]].cell_type == "code", "exactly one code cell tagged 'parameters'"
    for c in cells:
        if c.cell_type != "code":
            continue
        assert not c.get("outputs") and c.get("execution_count") is None, "commit notebooks without outputs"
        tree = ast.parse(c.source)
        defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        assert not defs, "no function or class definitions in notebooks: logic lives in m3lab"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"


def test_every_notebook_is_in_a_pipeline():
    from m3lab.pipeline.spec import list_pipelines, load_pipeline
    used = {s.notebook.name for name in list_pipelines() for s in load_pipeline(name).steps}
    missing = [p.name for p in NOTEBOOKS if p.name not in used]
    assert not missing, f"notebooks no pipeline runs: {missing}"


def test_every_notebook_ends_with_what_to_do_next():
    import nbformat
    for path in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")):
        last = nbformat.read(path, as_version=4).cells[-1]
        assert last.cell_type == "markdown" and "## What" in last.source and "next" in last.source, path.name
