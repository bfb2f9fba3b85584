"""What every ``--json`` flag prints (exactly one JSON object on stdout), and the progress of long commands
(on stderr, so ``--json`` output stays one object)."""
from __future__ import annotations

import json
import math
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import typer

from m3lab.cli.columns import wrap


def jsonable(value: Any) -> Any:
    """NaN/inf -> None, numpy scalars and arrays -> Python, tuples -> lists, keys -> str (recursively)."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if hasattr(value, "tolist") and not isinstance(value, (list, dict, str)):
        return jsonable(value.tolist())
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        return jsonable(value.item())
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def echo_json(obj: dict[str, Any]) -> None:
    """Print ``obj`` as one JSON object (values made JSON-safe; anything else by ``str``)."""
    typer.echo(json.dumps(jsonable(obj), default=str))


PROGRESS_AFTER_S = 3.0   # off a terminal: the first progress line once the work has taken this long
PROGRESS_EVERY_S = 5.0   # ... and then at most one line per this many seconds


def progress_wanted(as_json: bool) -> bool:
    """Progress on a terminal always; off one, not with --json (a script reading the JSON reads its stderr too)."""
    return not as_json or sys.stderr.isatty()


@contextmanager
def progress(label: str, *, unit: str = "", scale: float = 1.0, enabled: bool = True) -> Iterator[Callable]:
    """Progress of a long command, on stderr: yields ``update(done, total, what="")``.

    On a terminal: a live bar with the elapsed and remaining time, gone when the work ends. Elsewhere (a pipe,
    a log file): one line ``label: what (done/total unit, N s)`` once the work has taken PROGRESS_AFTER_S
    seconds, then at most every PROGRESS_EVERY_S seconds (a short command prints none). ``scale`` divides
    ``done`` and ``total`` for display (1e6 with unit 'MB').
    """
    if not enabled:
        yield lambda done, total, what="": None
        return
    start, last = time.monotonic(), [-math.inf]
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        count = TextColumn(f"{{task.fields[done_text]}}/{{task.fields[total_text]}} {unit}".rstrip())
        bar = Progress(TextColumn(label), BarColumn(), count, TimeElapsedColumn(), TimeRemainingColumn(),
                       TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
        task = bar.add_task("", total=None, done_text="0", total_text="?")
        with bar:
            def update(done, total, what=""):
                bar.update(task, completed=done, total=total, description=what,
                           done_text=f"{done / scale:,.0f}", total_text=f"{total / scale:,.0f}")
            yield update
        return

    def update(done, total, what=""):
        now = time.monotonic()
        if now - start >= PROGRESS_AFTER_S and now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            where = f"{done / scale:,.0f}/{total / scale:,.0f}{' ' + unit if unit else ''}, {now - start:.0f} s"
            typer.echo(f"{label}: {what + ' ' if what else ''}({where})", err=True)
    yield update


def accuracy_lines(band: dict, width: int) -> list[str]:
    """The accuracy band of every ``m3lab estimate`` (:mod:`m3lab.serving.accuracy`) as its one line, wrapped
    between words only on a terminal narrower than it."""
    from m3lab.serving.accuracy import band_line  # local: pulls in pandas

    return wrap(band_line(band), width, "", "  ")
