"""Plain-text tables that never split a token: what ``m3lab planes`` and ``m3lab repetition`` print.

:func:`render` lays rows out in aligned columns when they fit the terminal's width (``COLUMNS``, else 80),
and otherwise prints one block per row (the first column as a heading, then ``name: value`` lines), so a
name or a number is never cut or folded. Numbers keep 3 significant figures (:func:`m3lab.nb.format_number`).
"""
from __future__ import annotations

import shutil
import textwrap
from typing import Sequence

GAP = "  "


def width() -> int:
    """The terminal's width: ``COLUMNS`` when set, else the terminal's, else 80."""
    return shutil.get_terminal_size((80, 24)).columns


def wrap(text: str, indent: str = "") -> str:
    """Prose wrapped at word boundaries to the terminal's width (a long token stays whole on its own line)."""
    return textwrap.fill(text, width=width(), subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


def render(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[bool] | None = None,
           max_width: int | None = None) -> list[str]:
    """Lines of a table of text cells: aligned columns (``right[i]``: right-align column i) if every line fits
    ``max_width``, else one block per row."""
    max_width = max_width or width()
    right = right or [False] * len(headers)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    if sum(widths) + len(GAP) * (len(widths) - 1) <= max_width:
        def line(cells):
            return GAP.join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()
        return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]
    out = []
    for r in rows:
        out.append(r[0])
        out += [f"  {h}: {c}" for h, c in zip(headers[1:], r[1:]) if c]
    return out
