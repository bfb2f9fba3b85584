"""Notebook set-up: one call at the top of every m3lab notebook.

    from m3lab import nb, artifacts
    nb.setup()

Makes plotly figures render as the plotly MIME bundle (interactive in JupyterLab, and embedded
interactively by ``m3lab report``) with a palette of distinct colours, and shows DataFrames as tables
that teach: no truncated cells, numbers to 3 significant figures, byte counts in GB / MB / kB, long lists
summarised with the full list one click away (:func:`frame_html`); a bare dict shows as a small table with
units (:func:`table`).
"""
from __future__ import annotations

import html
import math
from typing import Any

from m3lab.analysis.display import (LIST_ITEMS_SHOWN, SIGNIFICANT, UNITS, format_bytes, format_number,  # noqa: F401
                                    format_value, is_bytes_column, table, unit_of)

#: 24 distinct colours (plotly's default palette has 10, so a legend of 11+ series repeats them).
PALETTE_NAME = "Dark24"


def setup(renderer: str = "plotly_mimetype") -> None:
    """Configure plotly's renderer and template, and pandas' display, for this kernel."""
    import pandas as pd
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.colors import qualitative

    pio.renderers.default = renderer
    template = go.layout.Template(pio.templates["plotly"])
    template.layout.colorway = getattr(qualitative, PALETTE_NAME)
    template.layout.title.font.size = 15
    pio.templates["m3lab"] = template
    pio.templates.default = "m3lab"
    pd.set_option("display.max_columns", 40)
    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.width", 160)
    pd.set_option("display.float_format", format_number)
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, frame_html)
        shell.display_formatter.formatters["text/html"].for_type(dict, _dict_html)   # no bare dicts


def _cell(v: Any, bytes_col: bool) -> str:
    if isinstance(v, (list, tuple)) or type(v).__name__ == "ndarray":
        items = list(v)
        if len(items) > LIST_ITEMS_SHOWN:
            full = html.escape(", ".join(map(str, items)))
            return (f"<details><summary>{len(items)} values: {html.escape(str(items[0]))} … "
                    f"{html.escape(str(items[-1]))}</summary>{full}</details>")
        return html.escape(", ".join(map(str, items)))
    if isinstance(v, bool) or v is None:
        return html.escape(str(v))
    if bytes_col and (isinstance(v, (int, float)) or type(v).__module__ == "numpy"):
        try:
            return format_bytes(float(v))
        except (TypeError, ValueError):
            pass
    return html.escape(format_value(v))


def facts(values: dict, name: str = "value"):
    """A flat dict of facts (``memory_facts``, a summary) as a table with units (:func:`table`)."""
    return table(values, name)


def _dict_html(values: dict) -> str | None:
    """How a notebook shows a bare dict: as :func:`table` when its values are scalars or dicts of scalars
    (one level), else None (IPython's own repr)."""
    def scalar(v):
        return v is None or isinstance(v, (str, int, float, bool, list, tuple)) or type(v).__module__ == "numpy"
    flat = {f"{k} · {j}" if isinstance(v, dict) else k: (w if isinstance(v, dict) else v)
            for k, v in values.items() for j, w in (v.items() if isinstance(v, dict) else [(None, v)])}
    if not values or not all(scalar(v) for v in flat.values()):
        return None
    nested = all(isinstance(v, dict) for v in values.values()) and all(scalar(w) for v in values.values()
                                                                          for w in v.values())
    return frame_html(table(values if nested else flat))


#: Rows shown of a long DataFrame: the first and the last half of this many.
MAX_ROWS = 200


def frame_html(df) -> str:
    """A DataFrame as an HTML table: every cell whole, byte columns in GB / MB, long lists folded; a frame
    longer than ``MAX_ROWS`` shows its first and last rows and says how many there are."""
    import pandas as pd

    note = ""
    if len(df) > MAX_ROWS:
        note = f"<p><small>{len(df):,} rows; the first and last {MAX_ROWS // 2} shown</small></p>"
        df = pd.concat([df.head(MAX_ROWS // 2), df.tail(MAX_ROWS // 2)])
    shown = df.astype(object).copy()
    for j, col in enumerate(df.columns):
        shown.iloc[:, j] = [_cell(v, is_bytes_column(col)) for v in df.iloc[:, j]]
    with pd.option_context("display.max_colwidth", None):
        return shown.to_html(escape=False, notebook=True, max_rows=None) + note
