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

#: 24 distinct colours (plotly's default palette has 10, so a legend of 11+ series repeats them).
PALETTE_NAME = "Dark24"
#: A list cell with more items than this is shown as "N values: first … last" with the list folded.
LIST_ITEMS_SHOWN = 12


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


SIGNIFICANT = 3   # significant figures of every number a notebook or a command shows


def format_number(v: float, sig: int = SIGNIFICANT) -> str:
    """``sig`` significant figures, thousands separators, no exponent from 0.001 to 1e15 (``350``, ``1,230``,
    ``21.8``, ``0.00116``, ``1.23e+18``); NaN is empty."""
    v = float(v)
    if math.isnan(v):
        return ""
    if v == 0 or math.isinf(v):
        return f"{v:g}"
    if not 1e-3 <= abs(v) < 1e15:
        return f"{v:.{sig - 1}e}"
    decimals = sig - 1 - math.floor(math.log10(abs(v)))
    return f"{round(v, decimals):,.{max(decimals, 0)}f}"


def format_value(v: Any) -> str:
    """A number as a table shows it: integers whole with separators (``4,131``), other numbers
    :func:`format_number`; anything else as text."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) and type(v).__module__ != "numpy":
        return str(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(f):
        return ""
    return f"{int(f):,}" if f.is_integer() and abs(f) < 1e15 else format_number(f)


def format_bytes(v: Any) -> str:
    """``70_600_000_000`` -> ``70.6 GB`` (decimal units, as hardware datasheets count)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:,.3g} {unit}" if abs(v) / scale < 1000 else f"{v / scale:,.0f} {unit}"
    return f"{v:,.0f} B"


def is_bytes_column(name: Any) -> bool:
    """Columns that hold byte counts: ``bytes``, ``bytes_per_gpu``, ``kv_bytes_per_token`` … (not ``gb``/ratios)."""
    text = str(name).lower()
    return ("bytes" in text.split("_") or text.startswith("bytes") or text.endswith("_bytes")) and \
        "share" not in text and "ratio" not in text and "over" not in text


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


#: Units read off m3lab's key names (``ttft_s``, ``tpot_ms``, ``output_tokens_per_s_per_gpu`` ...), first match wins.
UNITS = (("tokens_per_s_per_gpu", "tok/s/GPU"), ("_per_s_per_gpu", "/s/GPU"), ("_gbps", "GB/s"), ("_gb", "GB"),
         ("_ms", "ms"), ("_us", "µs"), ("_s", "s"), ("_pct", "%"), ("hit_rate", "fraction"), ("usage", "fraction"),
         ("share", "fraction"), ("utilisation", "fraction"), ("ratio", "×"), ("tokens", "tokens"),
         ("requests", "requests"), ("blocks", "blocks"), ("steps", "steps"), ("preemptions", "count"))


def unit_of(name: Any) -> str:
    """The unit a key's name states (see :data:`UNITS`); byte counts are shown in GB / MB instead; else ``""``."""
    key = str(name).lower().replace(" ", "_")
    if is_bytes_column(key):
        return "/s" if key.endswith("_per_s") else ""
    return next((unit for suffix, unit in UNITS if key.endswith(suffix) or suffix.strip("_") in key.split("_")
                 and not suffix.startswith("_")), "")


def _shown(key: Any, v: Any) -> Any:
    if is_bytes_column(key) and isinstance(v, (int, float)) and not isinstance(v, bool):
        return format_bytes(v)
    if isinstance(v, (list, tuple)) and len(v) <= LIST_ITEMS_SHOWN:
        return ", ".join(format_value(x) for x in v)
    return format_value(v) if isinstance(v, (int, float)) or type(v).__module__ == "numpy" else v


def table(values: dict, name: str = "value", keys=None):
    """A dict as a small table with units (3 significant figures, bytes in GB / MB): a flat dict gives
    ``[quantity, <name>, unit]``; a dict of dicts (scenario -> quantity -> value) one column per scenario.
    ``keys``: the quantities shown, in that order (default: all)."""
    import pandas as pd
    nested = values and all(isinstance(v, dict) for v in values.values())
    columns = values if nested else {name: values}
    keys = list(keys or dict.fromkeys(k for col in columns.values() for k in col))
    rows = [{"quantity": k, **{c: _shown(k, col.get(k)) for c, col in columns.items()}, "unit": unit_of(k)}
            for k in keys]
    return pd.DataFrame(rows).set_index("quantity")


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
