"""How m3lab shows a number, a byte count or a small dict to a reader: 3 significant figures, bytes in GB / MB,
units read off the key's name. One place for every table a notebook, a figure or a command prints
(:mod:`m3lab.nb` registers them for notebooks; the CLI and the figures call them directly).
"""
from __future__ import annotations

import math
from typing import Any

#: A list cell with more items than this is shown as "N values: first … last" with the list folded.
LIST_ITEMS_SHOWN = 12


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
