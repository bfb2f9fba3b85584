"""Request traces for the cache simulator: one columnar :class:`Trace`, and the readers that build it.

A request is a prompt of ``prompt`` tokens answered with ``output`` tokens. Its KV blocks are keyed by a
*stream*: an int64 array of chained block keys (``keys[i]`` stands for the whole token prefix up to the
end of block ``i``, as vLLM's ``request.block_hashes`` do). Requests that extend one conversation share a
stream (turn k+1's prompt is turn k's prompt + output + new input), so a request's full blocks are
``stream[: (prompt + output) // block_size]`` and no per-request copy is kept.

Readers (plain or ``.gz`` files; errors name the file and line; ``skip_invalid=True`` skips bad lines and counts them in
``Trace.skipped`` instead):

- :func:`read_mooncake` — Mooncake (FAST'25) JSONL: ``{"timestamp" (ms), "input_length",
  "output_length", "hash_ids"}``, one prefix hash per 512-token block. Each 512-token hash is split
  deterministically into ``512 // block_size`` keys (``hash * ratio + j``); only blocks the prompt fills
  get one. Output tokens are unknown text, so their blocks get keys no other request has.
- :func:`read_agentx` — AgentX / InferenceX agentic sessions (one JSON object per line; ``block_size`` 64,
  ``requests`` of ``{type, t, in, out, hash_ids, think_time?}`` and ``{type: "subagent", requests}``);
  64-token chained hashes are merged to ``block_size`` (every ``block_size // 64``-th one: a chained hash
  already names its whole prefix). ``hash_id_scope: "local"`` ids are namespaced by session.
- :func:`fixed_length` — the benchmark workload (``vllm bench serve`` random dataset): ``n`` requests of
  ``isl`` / ``osl`` tokens with nothing shared.

:mod:`m3lab.cache.agentic` generates AgentX-like sessions as a :class:`Trace` directly.
"""
from __future__ import annotations

import gzip
import zlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from m3lab.errors import M3LabError

MOONCAKE_BLOCK = 512        # tokens per Mooncake hash id (Mooncake FAST'25 release)
MOONCAKE_SYNTHETIC = Path(__file__).parent / "data" / "mooncake_synthetic_trace.jsonl.gz"   # see data/SOURCE.md
AGENTX_BLOCK = 64           # tokens per AgentX hash id (AgentX trace format)
FORMATS = ("mooncake", "agentx", "agentic")


@dataclass
class Trace:
    """Requests in arrival order (columns [N]) over key streams (see module docstring)."""

    block_size: int
    streams: list                      # int64 arrays of block keys
    stream: np.ndarray                 # [N] index into streams
    prompt: np.ndarray                 # [N] prompt tokens
    output: np.ndarray                 # [N] output tokens
    arrival_s: np.ndarray              # [N] arrival time (s) in the trace, or the session's start for
                                       #     requests that wait on another (see ``after``)
    session: np.ndarray                # [N] session (conversation) id
    after: np.ndarray = None           # [N] request that must finish first (-1: none): closed-loop turns
    think_s: np.ndarray = None         # [N] seconds between ``after`` finishing and this request's arrival
    source: str = ""
    skipped: int = 0                   # malformed lines skipped (only with skip_invalid=True)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        n = len(self.prompt)
        if self.after is None:
            self.after = np.full(n, -1, np.int64)
        if self.think_s is None:
            self.think_s = np.zeros(n)

    def __len__(self) -> int:
        return len(self.prompt)

    def keys(self, i: int) -> list:
        """Keys of request ``i``'s full blocks over prompt + output (a list of ints)."""
        return self.streams[self.stream[i]][: (int(self.prompt[i]) + int(self.output[i])) // self.block_size].tolist()

    @property
    def num_sessions(self) -> int:
        return int(len(np.unique(self.session))) if len(self) else 0

    def summary(self) -> dict:
        """Request count and token statistics (medians, means, maxima)."""
        return {"requests": len(self), "sessions": self.num_sessions,
                "median_input_tokens": float(np.median(self.prompt)) if len(self) else 0.0,
                "median_output_tokens": float(np.median(self.output)) if len(self) else 0.0,
                "mean_input_tokens": float(np.mean(self.prompt)) if len(self) else 0.0,
                "max_input_tokens": int(self.prompt.max()) if len(self) else 0,
                "skipped_lines": self.skipped, "source": self.source}


class _Unique:
    """Keys no trace hash can take (negative), for blocks of unknown text (outputs)."""

    def __init__(self):
        self.next = -1

    def take(self, n: int) -> np.ndarray:
        out = np.arange(self.next, self.next - n, -1, dtype=np.int64)
        self.next -= n
        return out


def rechunk(src: np.ndarray, src_block: int, block_size: int, tokens: int) -> np.ndarray:
    """Keys of the full ``block_size`` blocks of ``tokens`` tokens, from chained keys per ``src_block``."""
    n_full = tokens // block_size
    if src_block % block_size == 0:
        r = src_block // block_size
        keys = (src[:, None] * r + np.arange(r, dtype=np.int64)).reshape(-1)
        return keys[:n_full]
    if block_size % src_block == 0:
        m = block_size // src_block
        return src[m - 1::m][:n_full]
    raise M3LabError(f"block_size {block_size} and the trace's {src_block}-token hashes do not divide each other",
                     field="block_size", hint=f"use a divisor or multiple of {src_block}")


def _stream(prompt_keys: np.ndarray, prompt: int, output: int, block_size: int, unique: _Unique) -> np.ndarray:
    n_out = (prompt + output) // block_size - len(prompt_keys)
    return np.concatenate([prompt_keys, unique.take(max(n_out, 0))]) if n_out > 0 else prompt_keys


def _fail(path, lineno: int, msg: str, fld: str):
    raise M3LabError(f"{path}:{lineno}: {msg}", field=fld,
                     hint="fix or remove the line, or pass skip_invalid / --skip-invalid to skip and count it")


def _int_field(rec: dict, name: str, path, lineno: int, minimum: int = 0) -> int:
    v = rec.get(name)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v != int(v) or v < minimum:
        _fail(path, lineno, f"'{name}' must be an integer >= {minimum}, got {v!r}", name)
    return int(v)


def _time_field(rec: dict, name: str, path, lineno: int, unit: str) -> float:
    v = rec.get(name)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
        _fail(path, lineno, f"'{name}' must be {unit} >= 0, got {v!r}", name)
    return v


def _hash_ids_field(rec: dict, name: str, path, lineno: int, below: int | None = None) -> list:
    ids = rec.get(name)
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                            and (below is None or h < below) for h in ids):
        what = "non-negative integers" if below is None else f"integers in [0, {below})"
        _fail(path, lineno, f"'{name}' must be a list of {what}", name)
    return ids


def _lines(path):
    p = Path(path)
    if not p.is_file():
        raise M3LabError(f"trace file {path} not found", field="trace")
    try:
        with (gzip.open(p, "rt") if p.suffix == ".gz" else p.open()) as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    yield lineno, line
    except (gzip.BadGzipFile, EOFError, zlib.error, UnicodeDecodeError) as err:
        what = "a complete gzip file" if p.suffix == ".gz" else "UTF-8 text"
        raise M3LabError(f"trace file {path} is not {what} ({type(err).__name__}: {err})", field="trace",
                         hint="pass a JSONL trace, plain or gzip-compressed whole") from None


def _parse(path, lineno: int, line: str) -> dict:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        _fail(path, lineno, f"not valid JSON ({e.msg} at column {e.colno})", "line")
    if not isinstance(rec, dict):
        _fail(path, lineno, "each line must be a JSON object", "line")
    return rec


def read_mooncake(path, block_size: int = 128, *, skip_invalid: bool = False, limit: int | None = None) -> Trace:
    """A Mooncake JSONL trace (see module docstring)."""
    unique = _Unique()
    streams, prompt, output, arrival = [], [], [], []
    skipped = 0
    for lineno, line in _lines(path):
        if limit is not None and len(prompt) >= limit:
            break
        try:
            rec = _parse(path, lineno, line)
            ts = _time_field(rec, "timestamp", path, lineno, "a number of ms")
            isl = _int_field(rec, "input_length", path, lineno, 1)
            osl = _int_field(rec, "output_length", path, lineno, 1)
            ids = _hash_ids_field(rec, "hash_ids", path, lineno)
            if not (len(ids) - 1) * MOONCAKE_BLOCK < isl <= len(ids) * MOONCAKE_BLOCK:
                _fail(path, lineno, f"{len(ids)} hash_ids of {MOONCAKE_BLOCK} tokens do not cover input_length "
                                    f"{isl}", "hash_ids")
        except M3LabError:
            if not skip_invalid:
                raise
            skipped += 1
            continue
        keys = rechunk(np.asarray(ids, np.int64), MOONCAKE_BLOCK, block_size, isl)
        streams.append(_stream(keys, isl, osl, block_size, unique))
        prompt.append(isl)
        output.append(osl)
        arrival.append(ts / 1e3)
    n = len(prompt)
    return Trace(block_size, streams, np.arange(n, dtype=np.int64), np.asarray(prompt, np.int64),
                 np.asarray(output, np.int64), np.asarray(arrival, float), np.arange(n, dtype=np.int64),
                 source=str(path), skipped=skipped, meta={"format": "mooncake"})


def _agentx_requests(entries, path, lineno):
    """Flatten one agent's requests: yields (agent path, request dict); subagents recursively."""
    if not isinstance(entries, list):
        _fail(path, lineno, "'requests' must be a list", "requests")
    for e in entries:
        if not isinstance(e, dict):
            _fail(path, lineno, "each entry of 'requests' must be an object", "requests")
        if e.get("type") == "subagent":
            for sub, r in _agentx_requests(e.get("requests"), path, lineno):
                yield (str(e.get("agent_id", id(e))),) + sub, r
        elif e.get("type") in ("n", "s"):
            yield (), e
        else:
            _fail(path, lineno, f"request type must be 'n', 's' or 'subagent', got {e.get('type')!r}", "type")


def read_agentx(path, block_size: int = 128, *, skip_invalid: bool = False, limit: int | None = None) -> Trace:
    """AgentX-format sessions (see module docstring). Turns of one agent wait on the previous turn: ``after``
    links them and ``think_s`` is the recorded ``think_time`` (else the gap between their ``t`` minus the
    previous turn's ``api_time``, at least 0)."""
    unique = _Unique()
    streams, prompt, output, arrival, session, after, think = [], [], [], [], [], [], []
    skipped = 0
    for s_idx, (lineno, line) in enumerate(_lines(path)):
        if limit is not None and len(set(session)) >= limit:
            break
        try:
            rec = _parse(path, lineno, line)
            src_block = _int_field(rec, "block_size", path, lineno, 1) if "block_size" in rec else AGENTX_BLOCK
            local = rec.get("hash_id_scope", "local") == "local"
            rows = []
            for agent, r in _agentx_requests(rec.get("requests"), path, lineno):
                t = _time_field(r, "t", path, lineno, "seconds")
                isl = _int_field(r, "in", path, lineno, 1)
                osl = _int_field(r, "out", path, lineno, 1)
                ids = _hash_ids_field(r, "hash_ids", path, lineno, below=2**32)
                if len(ids) < isl // src_block:
                    _fail(path, lineno, f"{len(ids)} hash_ids of {src_block} tokens do not cover 'in' = {isl}",
                          "hash_ids")
                rows.append((agent, float(t), isl, osl, ids, r.get("think_time"), r.get("api_time")))
        except M3LabError:
            if not skip_invalid:
                raise
            skipped += 1
            continue
        last: dict = {}
        for agent, t, isl, osl, ids, think_time, api_time in rows:
            src = np.asarray(ids, np.int64)
            if local:
                src = (np.int64(s_idx) << 32) | src
            keys = rechunk(src, src_block, block_size, isl)
            streams.append(_stream(keys, isl, osl, block_size, unique))
            prev = last.get(agent)                           # a subagent's first turn waits on nothing
            idx = len(prompt)
            prompt.append(isl)
            output.append(osl)
            arrival.append(t)
            session.append(s_idx)
            after.append(-1 if prev is None else prev[0])
            if think_time is not None:
                think.append(max(float(think_time), 0.0))
            elif prev is not None:
                think.append(max(t - prev[1] - float(prev[2] or 0.0), 0.0))
            else:
                think.append(0.0)
            last[agent] = (idx, t, api_time)
    n = len(prompt)
    return Trace(block_size, streams, np.arange(n, dtype=np.int64), np.asarray(prompt, np.int64),
                 np.asarray(output, np.int64), np.asarray(arrival, float), np.asarray(session, np.int64),
                 np.asarray(after, np.int64), np.asarray(think, float), source=str(path), skipped=skipped,
                 meta={"format": "agentx"})


def fixed_length(n: int, isl: int, osl: int, block_size: int = 128) -> Trace:
    """``n`` requests of ``isl`` input / ``osl`` output tokens sharing nothing (random-token benchmark)."""
    for name, v in (("n", n), ("isl", isl), ("osl", osl)):
        if not isinstance(v, int) or v < 1:
            raise M3LabError(f"{name}={v!r} must be a positive integer", field=name)
    unique = _Unique()
    streams = [unique.take((isl + osl) // block_size) for _ in range(n)]
    return Trace(block_size, streams, np.arange(n, dtype=np.int64), np.full(n, isl, np.int64),
                 np.full(n, osl, np.int64), np.zeros(n), np.arange(n, dtype=np.int64), source="fixed",
                 meta={"format": "fixed", "isl": isl, "osl": osl})


def read_trace(path, fmt: str = "mooncake", block_size: int = 128, *, skip_invalid: bool = False,
               limit: int | None = None) -> Trace:
    """Read a trace file by format name (``mooncake``, ``agentx``; ``agentic`` is the same as ``agentx``)."""
    if fmt == "mooncake":
        trace = read_mooncake(path, block_size, skip_invalid=skip_invalid, limit=limit)
    elif fmt in ("agentx", "agentic"):
        trace = read_agentx(path, block_size, skip_invalid=skip_invalid, limit=limit)
    else:
        raise M3LabError(f"unknown trace format {fmt!r}", field="format", hint=f"choose one of {', '.join(FORMATS)}")
    if len(trace) == 0:
        skipped = f" ({trace.skipped} malformed line(s) skipped)" if trace.skipped else ""
        raise M3LabError(f"trace file {path} holds no requests{skipped}", field="trace",
                         hint=f"pass a {fmt} trace with at least one request")
    return trace
