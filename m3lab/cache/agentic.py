"""Seeded AgentX-like agentic sessions: turns that extend one context, subagents that fork from a shared
prefix, think times, irregular outputs, heavy-tailed contexts up to ~1M tokens.

Where the defaults come from (``AgenticConfig``):

- **published** (AgentX / InferenceX agentic traces, the AgentX release):
  median request ≈ 142k input tokens and 444 output tokens; 44% of sessions spawn subagents; hashes
  are chained per 64-token block. ``turns_median``, ``step_median`` and ``first_input_median`` are set
  so that the generated median input lands on 142k (checked by a test, ±10%), ``output_median`` = 444
  and ``subagent_share`` = 0.44.
- **assumed** (no published figure was available here; change them to match your deployment): the
  shared system prompt (12k tokens, every session), its log-normal spreads (sigma), the number of
  subagents per spawning session (1 + Poisson(0.5)), their own shared type prompts (3 types of 6k
  tokens) and turn counts (median 10), think times (log-normal, median 3 s: tool execution),
  compaction at ``max_context`` (the context restarts from the system prompt plus a 20k summary),
  and session starts as a Poisson process (``session_rate``).

A main agent's turn k+1 sends turn k's prompt + its output + new input (tool results), so its blocks
extend turn k's stream. A subagent starts after the turn that spawned it, from the system prompt and its
type's prompt (shared across sessions), runs its own turns, and the parent's next turn waits for it
(a blocking task tool). The result is a :class:`~m3lab.cache.trace.Trace`;
:func:`write_agentx` writes sessions in the AgentX format that :func:`~m3lab.cache.trace.read_agentx` reads.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from m3lab.cache.trace import AGENTX_BLOCK, Trace, rechunk
from m3lab.errors import M3LabError

AGENTX_MEDIAN_INPUT = 142_000      # published: median request input tokens (AgentX)
AGENTX_MEDIAN_OUTPUT = 444         # published: median request output tokens
AGENTX_SUBAGENT_SHARE = 0.44       # published: share of sessions that spawn subagents
MAX_SESSIONS = 100_000             # about 4.4 M requests (~40 s to generate, minutes to replay on one core)


@dataclass(frozen=True)
class AgenticConfig:
    """Generator settings; see the module docstring for which are published and which are assumed."""

    sessions: int = 1000
    seed: int = 0
    block_size: int = 128
    system_tokens: int = 12_000
    first_input_median: float = 3_000
    first_input_sigma: float = 1.0
    turns_median: float = 26
    turns_sigma: float = 0.8
    turns_max: int = 400
    step_median: float = 2_700          # new input tokens per turn (tool results, user messages)
    step_sigma: float = 1.4
    output_median: float = AGENTX_MEDIAN_OUTPUT
    output_sigma: float = 1.2
    output_max: int = 32_768
    think_median_s: float = 3.0
    think_sigma: float = 1.2
    max_context: int = 1_000_000
    compact_tokens: int = 20_000
    subagent_share: float = AGENTX_SUBAGENT_SHARE
    subagents_extra_mean: float = 0.5
    subagent_types: int = 3
    subagent_prompt_tokens: int = 6_000
    subagent_task_median: float = 1_500
    subagent_turns_median: float = 10
    session_rate: float = 0.05          # sessions started per second (open-loop trace time)

    def __post_init__(self):
        if not isinstance(self.sessions, int) or self.sessions < 1:
            raise M3LabError(f"sessions={self.sessions!r} must be a positive integer", field="sessions")
        if self.sessions > MAX_SESSIONS:
            raise M3LabError(f"sessions={self.sessions:,} is more than the generator's limit of {MAX_SESSIONS:,} "
                             f"(about 44 requests each, held in memory)", field="sessions",
                             hint="simulate a sample: the hit rates settle within a few thousand sessions")
        if not 0 <= self.subagent_share <= 1:
            raise M3LabError(f"subagent_share={self.subagent_share} must be in [0, 1]", field="subagent_share")
        if self.block_size % AGENTX_BLOCK and AGENTX_BLOCK % self.block_size:
            raise M3LabError(f"block_size {self.block_size} must divide or be a multiple of {AGENTX_BLOCK}",
                             field="block_size")


class _Keys:
    """Key streams at AgentX's 64-token granularity: shared prefixes get fixed keys, everything else new ones."""

    def __init__(self, cfg: AgenticConfig):
        self.cfg = cfg
        n_sys = cfg.system_tokens // AGENTX_BLOCK
        self.system = np.arange(n_sys, dtype=np.int64)
        self.next = n_sys
        self.types = []
        for _ in range(cfg.subagent_types):
            extra = (cfg.system_tokens + cfg.subagent_prompt_tokens) // AGENTX_BLOCK - n_sys
            self.types.append(np.concatenate([self.system, self.fresh(extra)]))

    def fresh(self, n: int) -> np.ndarray:
        out = np.arange(self.next, self.next + n, dtype=np.int64)
        self.next += n
        return out

    def stream(self, prefix: np.ndarray, tokens: int) -> np.ndarray:
        return np.concatenate([prefix, self.fresh(max(tokens // AGENTX_BLOCK - len(prefix), 0))])


def _lognormal(rng, median: float, sigma: float, size) -> np.ndarray:
    return median * np.exp(sigma * rng.standard_normal(size))


class _Builder:
    def __init__(self, cfg: AgenticConfig, keep_hash_streams: bool):
        self.cfg, self.keep = cfg, keep_hash_streams
        self.rng = np.random.default_rng(cfg.seed)
        self.keys = _Keys(cfg)
        self.streams, self.streams64 = [], []
        self.cols = {k: [] for k in ("stream", "prompt", "output", "arrival", "session", "after", "think", "agent")}

    def _add_stream(self, s64: np.ndarray, tokens: int) -> int:
        self.streams.append(rechunk(s64, AGENTX_BLOCK, self.cfg.block_size, tokens))
        if self.keep:
            self.streams64.append(s64)
        return len(self.streams) - 1

    def agent(self, session: int, agent: int, start: float, prefix: np.ndarray, first: int, turns: int,
              after: int, spawn_at: dict) -> int:
        """Append one agent's turns; ``spawn_at``: turn -> subagent type to run after that turn."""
        cfg, rng, c = self.cfg, self.rng, self.cols
        out = np.clip(np.rint(_lognormal(rng, cfg.output_median, cfg.output_sigma, turns)), 1, cfg.output_max)
        step = np.maximum(np.rint(_lognormal(rng, cfg.step_median, cfg.step_sigma, turns)), 1)
        think = _lognormal(rng, cfg.think_median_s, cfg.think_sigma, turns)
        # contexts: P[k+1] = P[k] + out[k] + step[k+1], restarting from the prefix when over max_context
        segments, p = [], []
        ctx = first
        seg_start = 0
        for k in range(turns):
            if k:
                ctx = ctx + int(out[k - 1]) + int(step[k])
                if ctx + out[k] > cfg.max_context:
                    segments.append((seg_start, k))
                    seg_start = k
                    ctx = len(prefix) * AGENTX_BLOCK + cfg.compact_tokens + int(step[k])
            p.append(min(ctx, cfg.max_context - int(out[k])))
        segments.append((seg_start, turns))
        for a, b in segments:
            end = p[b - 1] + int(out[b - 1])
            sid = self._add_stream(self.keys.stream(prefix, end), end)
            for k in range(a, b):
                c["stream"].append(sid)
                c["prompt"].append(p[k])
                c["output"].append(int(out[k]))
                c["arrival"].append(start)
                c["session"].append(session)
                c["agent"].append(agent)
                c["after"].append(after)
                c["think"].append(float(think[k]) if after >= 0 else 0.0)
                after = len(c["prompt"]) - 1
                if k in spawn_at:
                    after = self.subagent(session, start, spawn_at[k], after)
        return after

    def subagent(self, session: int, start: float, kind: int, after: int) -> int:
        cfg, rng = self.cfg, self.rng
        turns = int(np.clip(np.rint(_lognormal(rng, cfg.subagent_turns_median, cfg.turns_sigma, 1)[0]), 1,
                            cfg.turns_max))
        prefix = self.keys.types[kind]
        first = (cfg.system_tokens + cfg.subagent_prompt_tokens
                 + int(max(1, round(_lognormal(rng, cfg.subagent_task_median, 1.0, 1)[0]))))
        return self.agent(session, 1 + kind, start, prefix, first, turns, after, {})

    def session(self, s: int, start: float) -> None:
        cfg, rng = self.cfg, self.rng
        turns = int(np.clip(np.rint(_lognormal(rng, cfg.turns_median, cfg.turns_sigma, 1)[0]), 1, cfg.turns_max))
        first = cfg.system_tokens + int(max(1, round(_lognormal(rng, cfg.first_input_median,
                                                                cfg.first_input_sigma, 1)[0])))
        spawn_at = {}
        if rng.random() < cfg.subagent_share:
            n_sub = min(1 + int(rng.poisson(cfg.subagents_extra_mean)), turns)
            for k in rng.choice(turns, size=n_sub, replace=False):
                spawn_at[int(k)] = int(rng.integers(cfg.subagent_types))
        self.agent(s, 0, start, self.keys.system, first, turns, -1, spawn_at)

    def trace(self) -> Trace:
        c = self.cols
        as64 = lambda k: np.asarray(c[k], np.int64)  # noqa: E731
        meta = {"format": "agentic", "config": asdict(self.cfg), "agent": as64("agent")}
        if self.keep:
            meta["streams64"] = self.streams64
        return Trace(self.cfg.block_size, self.streams, as64("stream"), as64("prompt"), as64("output"),
                     np.asarray(c["arrival"], float), as64("session"), as64("after"), np.asarray(c["think"], float),
                     source=f"agentic(seed={self.cfg.seed}, sessions={self.cfg.sessions})", meta=meta)


def generate(cfg: AgenticConfig | None = None, *, keep_hash_streams: bool = False, progress=None,
             **overrides) -> Trace:
    """AgentX-like sessions as a :class:`Trace` (``overrides`` replace fields of ``cfg``);
    ``progress(sessions_done, sessions)`` is called every 1,000 sessions."""
    cfg = AgenticConfig(**{**(asdict(cfg) if cfg else {}), **overrides})
    b = _Builder(cfg, keep_hash_streams)
    starts = np.cumsum(b.rng.exponential(1.0 / cfg.session_rate, cfg.sessions))
    for s in range(cfg.sessions):
        if progress is not None and s % 1000 == 0:
            progress(s, cfg.sessions)
        b.session(s, float(starts[s]))
    return b.trace()


def write_agentx(trace: Trace, path) -> Path:
    """Write a generated trace (``generate(..., keep_hash_streams=True)``) as AgentX JSONL: one session per
    line, 64-token hash ids, request times ``t`` from the session start (think times only: service times
    are not known before a simulation)."""
    if "streams64" not in trace.meta:
        raise M3LabError("write_agentx needs generate(..., keep_hash_streams=True)", field="trace")
    s64, agent = trace.meta["streams64"], trace.meta["agent"]
    path = Path(path)
    sessions: dict = {}
    t_of = np.zeros(len(trace))
    for i in range(len(trace)):
        a = int(trace.after[i])
        t_of[i] = (t_of[a] if a >= 0 else 0.0) + float(trace.think_s[i])
        req = {"type": "n", "t": round(float(t_of[i]), 3), "model": "minimax-m3", "in": int(trace.prompt[i]),
               "out": int(trace.output[i]), "hash_ids": s64[trace.stream[i]][: int(trace.prompt[i]) // AGENTX_BLOCK]
               .tolist(), "think_time": round(float(trace.think_s[i]), 3)}
        entries = sessions.setdefault(int(trace.session[i]), {"entries": [], "sub": {}})
        if agent[i] == 0:
            entries["entries"].append(req)
            entries["sub"] = {}
        else:
            key = (int(agent[i]), len(entries["entries"]))
            if key not in entries["sub"]:
                entries["sub"][key] = {"type": "subagent", "t": req["t"], "agent_id": f"sub{len(entries['entries'])}",
                                       "subagent_type": f"type{int(agent[i]) - 1}", "requests": []}
                entries["entries"].append(entries["sub"][key])
            entries["sub"][key]["requests"].append(req)
    with path.open("w") as f:
        for s, v in sessions.items():
            f.write(json.dumps({"id": f"session-{s}", "models": ["minimax-m3"], "block_size": AGENTX_BLOCK,
                                "hash_id_scope": "global", "requests": v["entries"]}) + "\n")
    return path
