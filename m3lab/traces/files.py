"""Opening trace files: plain or gzip, with one-line errors for truncated or corrupt input.

Every reader in :mod:`m3lab.traces` opens files through :func:`read_text` / :func:`read_json` (or, for large
JSON traces, :func:`iter_json_items`), so a truncated gzip stream, a JSON document cut short or a binary file
all end in one :class:`~m3lab.errors.M3LabError` that names the file, the place and the fix.
"""
from __future__ import annotations

import gzip
import io
import json
import zlib
from pathlib import Path
from typing import Any, Iterator

import ijson
from ijson.common import ObjectBuilder

from m3lab.errors import M3LabError

GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: str | Path) -> bool:
    """True when the file starts with the gzip magic bytes (the suffix is not trusted)."""
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def _check_exists(path: Path) -> None:
    if path.is_dir():
        raise M3LabError(f"{path} is a folder, not a trace file", field="TRACE",
                         hint="give one file (a profiler folder holds one trace per rank: name one of them)")
    if not path.is_file():
        raise M3LabError(f"trace file not found: {path}", field="TRACE", hint="check the path")


def _stream_error(path: Path, err: Exception) -> M3LabError:
    if isinstance(err, EOFError):
        return M3LabError(f"{path}: truncated gzip stream ({err})", field="TRACE",
                          hint="the file was cut short while copying or writing; fetch it again")
    if isinstance(err, UnicodeDecodeError):
        return M3LabError(f"{path}: not UTF-8 text at byte {err.start}", field="TRACE",
                          hint="expected a JSON, JSON Lines, CSV or log file (optionally .gz)")
    return M3LabError(f"{path}: corrupt gzip stream ({err})", field="TRACE",
                      hint="the file is damaged; fetch it again")


def read_text(path: str | Path) -> str:
    """The whole file as text, gunzipped when it is gzip (sniffed from the magic bytes)."""
    path = Path(path)
    _check_exists(path)
    try:
        if is_gzip(path):
            with gzip.open(path, "rb") as fh:
                raw = fh.read()
        else:
            raw = path.read_bytes()
        return raw.decode("utf-8")
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as err:
        raise _stream_error(path, err) from None


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` (1-based, newline stripped), streaming, gzip or plain."""
    path = Path(path)
    _check_exists(path)
    try:
        raw = gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")
        with io.TextIOWrapper(raw, encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                yield number, line.rstrip("\r\n")
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as err:
        raise _stream_error(path, err) from None


def head_text(path: str | Path, n_chars: int = 4096) -> str:
    """The first ``n_chars`` characters (decompressed), for sniffing the format."""
    path = Path(path)
    _check_exists(path)
    try:
        raw = gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")
        with raw:
            data = raw.read(n_chars)
    except (EOFError, OSError, zlib.error) as err:
        raise _stream_error(path, err) from None
    return data.decode("utf-8", errors="replace")


def read_json(path: str | Path) -> Any:
    """Parse a whole JSON document; a truncated or malformed one names the line and column."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        where = "end of file" if err.pos >= len(text.rstrip()) else f"line {err.lineno} column {err.colno}"
        raise M3LabError(f"{path}: invalid JSON at {where}: {err.msg}", field="TRACE",
                         hint="the file is truncated or not JSON; re-export the trace") from None


STREAM_CHUNK = 1 << 20   # bytes the streaming parser asks for at a time


class _Reading:
    """A binary file (gunzipped when it is gzip) whose reads report ``progress(bytes_read, file_bytes)`` of the
    file on disk."""

    def __init__(self, path: Path, progress=None):
        self.raw = open(path, "rb")
        magic = self.raw.read(2)
        self.raw.seek(0)
        self.fh = gzip.GzipFile(fileobj=self.raw) if magic == GZIP_MAGIC else self.raw
        self.total, self.progress = path.stat().st_size, progress

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        if self.progress is not None:
            self.progress(self.raw.tell(), self.total)
        return data

    def close(self) -> None:
        self.fh.close()
        self.raw.close()


def iter_json_items(path: str | Path, prefix: str, progress=None) -> Iterator[Any]:
    """The values at ``prefix`` of a JSON document (an ijson prefix: ``"traceEvents.item"``, ``"item"``), parsed
    as a stream by ijson's C backend, so a large file never sits in memory whole. ``progress(bytes_read,
    file_bytes)`` follows the file on disk. A damaged gzip stream raises :class:`M3LabError`; a malformed
    document raises ``ijson.JSONError`` (fall back to :func:`read_json` for its message, or for what only
    Python's json reads, such as NaN)."""
    path = Path(path)
    _check_exists(path)
    reading = _Reading(path, progress)
    try:
        yield from ijson.items(reading, prefix, use_float=True, buf_size=STREAM_CHUNK)
    except (EOFError, OSError, zlib.error) as err:
        raise _stream_error(path, err) from None
    finally:
        reading.close()


def json_value_before(path: str | Path, key: str, stop: str) -> tuple[bool, Any]:
    """``(found, value)`` of the top-level ``key`` of a JSON object when it comes before the top-level ``stop``
    (how PyTorch writes ``deviceProperties`` before ``traceEvents``): reads only the head of a large file."""
    path = Path(path)
    _check_exists(path)
    reading, builder = _Reading(path), None
    try:
        for prefix, event, value in ijson.parse(reading, use_float=True):
            if prefix == stop:
                break
            if prefix == key or prefix.startswith(key + "."):
                builder = builder or ObjectBuilder()
                builder.event(event, value)
                if prefix == key and event not in ("start_array", "start_map", "map_key"):
                    return True, builder.value
    except (ijson.JSONError, EOFError, OSError, zlib.error):
        pass   # the main pass reports what is wrong with the file
    finally:
        reading.close()
    return False, None
