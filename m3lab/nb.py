"""Notebook set-up: one call at the top of every m3lab notebook.

    from m3lab import nb, artifacts
    nb.setup()

Makes plotly figures render as the plotly MIME bundle (interactive in JupyterLab, and embedded
interactively by ``m3lab report``) and sets readable pandas display options.
"""
from __future__ import annotations


def setup(renderer: str = "plotly_mimetype") -> None:
    """Configure plotly's renderer and pandas' display options for this kernel."""
    import pandas as pd
    import plotly.io as pio

    pio.renderers.default = renderer
    pd.set_option("display.max_columns", 40)
    pd.set_option("display.width", 160)
    pd.set_option("display.float_format", lambda v: f"{v:,.4g}")


def in_pipeline() -> bool:
    """True when the notebook is executed by ``m3lab run`` (papermill)."""
    import os

    from m3lab.artifacts import RUN_DIR_ENV
    return bool(os.environ.get(RUN_DIR_ENV))
