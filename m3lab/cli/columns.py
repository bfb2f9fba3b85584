"""Plain-text tables that read at any terminal width: no name is cut or folded in the middle of a word.

:func:`render` lays rows out in the terminal's width:

- every column takes the width of its widest cell; numbers (columns with a format) are right-aligned;
- when the first (name) column does not fit beside the others, a name too long for it gets a line of its own
  and the row's other cells follow on the next line (a name wider than the terminal ends in ``…``);
- ``detail`` columns (long comma-separated lists) go on indented lines under their row when the table would
  not fit with them, wrapped only between words;
- ``group``: rows sharing that column's value are listed under one heading line, indented;
- on a terminal too narrow for the other columns beside a name, each row becomes a block: its name, then
  ``header value`` pairs wrapped between words.

The result is a list of lines, each at most ``width`` characters.
"""
from __future__ import annotations

import math
import shutil
import textwrap
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

GAP = 2          # spaces between columns
NAME_MIN = 12    # the name column never gets narrower than this
NBSP = "\u00a0"   # textwrap does not break at it


@dataclass(frozen=True)
class Column:
    """One column: its key in the rows, its header, a format for numbers, and whether it is a detail."""

    key: str
    header: str | None = None
    fmt: str | None = None       # e.g. ",.1f" or ".1%": right-aligned ("" keeps the text, right-aligned)
    detail: bool = False         # goes under the row ("  header: value") when the table is too wide

    @property
    def title(self) -> str:
        return self.header if self.header is not None else self.key


def cell(value: Any, fmt: str | None = None) -> str:
    """A cell's text: '' for None/NaN, ``format(value, fmt)`` for numbers, else ``str(value)``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if fmt and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, fmt)
    return str(value)


def cut(text: str, width: int) -> str:
    """``text`` if it fits in ``width`` characters, else its start and '…'."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def wrap(text: str, width: int, indent: str = "", subsequent: str | None = None) -> list[str]:
    """``text`` wrapped between words (never inside one) in ``width`` characters."""
    lines = textwrap.wrap(text, width=max(width, 20), initial_indent=indent,
                          subsequent_indent=indent if subsequent is None else subsequent,
                          break_long_words=False, break_on_hyphens=False)
    return [cut(line, width) for line in lines] or [indent.rstrip()]


def terminal_width(default: int = 80) -> int:
    """The terminal's width: ``COLUMNS`` when set, else the terminal's, else ``default``."""
    return shutil.get_terminal_size((default, 24)).columns


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool], width: int,
               title: str | None = None) -> list[str]:
    """:func:`render` for rows of ready-made text cells: ``right[i]`` right-aligns column ``i``."""
    cols = [Column(f"c{i}", h, "" if r else None) for i, (h, r) in enumerate(zip(headers, right))]
    return render([{c.key: v for c, v in zip(cols, row)} for row in rows], cols, width, title=title)


def _line(cells: Sequence[str], widths: Sequence[int], right: Sequence[bool]) -> str:
    parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)]
    return (" " * GAP).join(parts).rstrip()


def render(rows: Iterable[dict[str, Any]], columns: Sequence[Column], width: int, *, title: str | None = None,
           group: str | None = None) -> list[str]:
    """Lines of a table of ``rows`` (dicts keyed by each column's ``key``) in ``width`` characters."""
    rows = list(rows)
    width = max(width, 40)
    indent = "  " if group else ""
    inner = width - len(indent)
    text = [{c.key: cell(r.get(c.key), c.fmt) for c in columns} for r in rows]
    natural = {c.key: max([len(c.title)] + [len(t[c.key]) for t in text]) for c in columns}
    inline = list(columns)
    if sum(natural[c.key] for c in inline) + GAP * (len(inline) - 1) > inner:
        inline = [c for c in columns if not c.detail]
    details = [c for c in columns if c not in inline and any(t[c.key] for t in text)]
    inline = [c for c in inline if not c.detail or any(t[c.key] for t in text)]
    rest = sum(natural[c.key] for c in inline[1:]) + GAP * (len(inline) - 1)
    first = inline[0].key
    if rest + NAME_MIN > inner:   # even the numbers do not fit beside a name: one block per row
        return _blocks(rows, text, columns, width, title, group)
    widths = [max(min(natural[first], inner - rest), NAME_MIN)] + [natural[c.key] for c in inline[1:]]
    right = [c.fmt is not None for c in inline]
    lines = wrap(title, width) if title else []
    lines.append(indent + _line([c.title for c in inline], widths, right))
    lines.append(indent + _line(["-" * w for w in widths], widths, right))
    current = object()
    for r, t in zip(rows, text):
        if group and r.get(group) != current:
            current = r.get(group)
            lines.append(cut(cell(current), width))
        name = t[first]
        if len(name) > widths[0]:
            lines.append(indent + cut(name, inner))
            name = ""
        lines.append(indent + _line([name] + [t[c.key] for c in inline[1:]], widths, right))
        for c in details:
            if t[c.key]:
                lines.extend(wrap(f"{c.title}: {t[c.key]}", width, indent + "    ", indent + "      "))
    return lines


def _blocks(rows: list[dict], text: list[dict], columns: Sequence[Column], width: int, title: str | None,
            group: str | None) -> list[str]:
    """One block per row: the first column's value on its own line, the others as ``header value`` pairs."""
    lines = wrap(title, width) if title else []
    current = object()
    for r, t in zip(rows, text):
        if group and r.get(group) != current:
            current = r.get(group)
            lines.append(cut(cell(current), width))
        lines.append(cut(t[columns[0].key], width))
        # a pair ("read 312 MB") never breaks: its spaces are non-breaking while the line is wrapped
        pairs = ", ".join(f"{c.title} {t[c.key]}".replace(" ", NBSP) for c in columns[1:] if t[c.key])
        if pairs:
            lines.extend(x.replace(NBSP, " ") for x in wrap(pairs, width, "    ", "      "))
    return lines
