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


def toy_pipeline(tmp_path: Path) -> dict:
    """first (saves n) -> big (prints `big` kB of text; sleeps `pause` s) -> last (reads n): the pipeline file,
    the log of executions (one word per step run), the runs folder and the pipeline's folder."""
    d = tmp_path / "pipe"
    d.mkdir()
    log = tmp_path / "executions.log"
    write_notebook(d / "01_first.ipynb", "n = 3  # rows", "from m3lab import artifacts",
                   f"open({str(log)!r}, 'a').write('first\\n')", "artifacts.save('meta', {'n': n})")
    write_notebook(d / "02_big.ipynb", "big = 1  # kB of output\npause = 0.0  # seconds to sleep", "import time",
                   f"open({str(log)!r}, 'a').write('big\\n')", "time.sleep(pause)", "print('x' * (1000 * big))")
    write_notebook(d / "03_last.ipynb", "scale = 2  # multiplier", "from m3lab import artifacts",
                   f"open({str(log)!r}, 'a').write('last\\n')",
                   "artifacts.save('total', {'total': artifacts.load('meta')['n'] * scale})")
    (d / "toy.yaml").write_text("name: toy\ndescription: test pipeline\nsteps:\n  - notebook: 01_first.ipynb\n"
                                "  - notebook: 02_big.ipynb\n  - notebook: 03_last.ipynb\n")
    return {"yaml": d / "toy.yaml", "log": log, "out": tmp_path / "runs", "dir": d}
