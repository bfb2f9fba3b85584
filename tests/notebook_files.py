"""Test helper: tiny pipeline notebooks written to disk (a title, a tagged ``parameters`` cell, code cells)."""
from pathlib import Path

import nbformat as nbf


def write_notebook(path: Path, params: str, *code: str) -> Path:
    """Write a notebook at ``path``: markdown title, ``params`` as the papermill parameters cell, then ``code``."""
    cells = [nbf.v4.new_markdown_cell(f"# {path.stem}"), nbf.v4.new_code_cell(params, metadata={"tags": ["parameters"]})]
    cells += [nbf.v4.new_code_cell(c) for c in code]
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbf.write(nbf.v4.new_notebook(cells=cells, metadata={"kernelspec": kernel}), path)
    return path
