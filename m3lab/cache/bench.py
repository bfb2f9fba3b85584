"""Speed of m3lab's prefix cache next to vLLM's own classes, on the same trace (``m3lab bench cache``).

Three measurements, each printed side by side and appended to ``traces/bench/cache_sim.csv`` with the
device (CPU model, cores), commit and date:

1. **block lookups/s** — ``get_computed_blocks`` on full hits: the trace's prompts are admitted once into a
   pool large enough to keep them, then every prompt is looked up again and the matched blocks are
   counted (vLLM: ``KVCacheManager.get_computed_blocks(request)`` on the same requests);
2. **replay** — the whole trace through each engine (:func:`m3lab.cache.replay.replay`, finite pool,
   LRU): requests/s and prompt blocks/s, vLLM's time including its sha256 block hashing, which a
   simulator of vLLM also needs;
3. **AgentX-like sessions** — generating 1,000 sessions with the default distributions and replaying
   them through m3lab's cache (unlimited and finite): seconds.

Each figure is the best of ``repeats`` runs (the 2-core box is shared). ``m3lab bench cache`` options:
``--requests N`` (trace prefix used, default 1,000 Mooncake requests), ``--repeats``, ``--no-vllm``,
``--no-append``.
"""
from __future__ import annotations

import time
from pathlib import Path

from m3lab.arith import ceil_div
from m3lab.cache.agentic import generate
from m3lab.cache.replay import M3LabKVCache, blocks_for_tokens, replay
from m3lab.cache.trace import MOONCAKE_SYNTHETIC, Trace, read_mooncake
from m3lab.cache.vllm_ref import VllmKVCache
from m3lab.provenance import TRACES_BENCH, append_csv, commit, cpu_name, today

MOONCAKE = MOONCAKE_SYNTHETIC
CSV = TRACES_BENCH / "cache_sim.csv"
FIELDS = ("measurement", "engine", "trace", "requests", "blocks", "seconds", "rate", "unit", "speedup_vs_vllm",
          "device", "commit", "date")


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def lookup_rate(trace: Trace, engine: str, repeats: int = 3) -> tuple[int, float]:
    """(blocks matched, best seconds) for looking up every prompt of ``trace`` again after admitting it once."""
    bs = trace.block_size
    need = sum(ceil_div(int(p), bs) for p in trace.prompt) + 2
    if engine == "m3lab":
        kv = M3LabKVCache(need, bs)
    else:
        kv = VllmKVCache(need, bs)
    for i in range(len(trace)):
        p = int(trace.prompt[i])
        kv.add(i, trace.keys(i), p, p)
        hit = kv.lookup(i, p)
        kv.allocate(i, p, 0, p - len(hit) * bs, hit)
        kv.free(i)
    if engine == "m3lab":
        keys = [trace.keys(i) for i in range(len(trace))]
        prompts = [int(p) for p in trace.prompt]
        get = kv.get_computed_blocks
        found = sum(len(get(k, p)) for k, p in zip(keys, prompts))
        return found, _best(lambda: [get(k, p) for k, p in zip(keys, prompts)], repeats)
    reqs = [kv.requests[i] for i in range(len(trace))]
    get = kv.manager.get_computed_blocks
    found = sum(n for _, n, _ in (get(r) for r in reqs)) // bs
    return found, _best(lambda: [get(r) for r in reqs], repeats)


def run(requests: int = 1000, repeats: int = 3, with_vllm: bool = True) -> list[dict]:
    """All measurements as rows (see module docstring)."""
    trace = read_mooncake(MOONCAKE, limit=requests)
    name = f"mooncake-synthetic[:{len(trace)}]"
    rows = []
    engines = ("m3lab", "vllm") if with_vllm else ("m3lab",)
    look = {e: lookup_rate(trace, e, repeats) for e in engines}
    for e, (blocks, sec) in look.items():
        rows.append({"measurement": "get_computed_blocks (full hits)", "engine": e, "trace": name,
                     "requests": len(trace), "blocks": blocks, "seconds": sec, "rate": blocks / sec,
                     "unit": "block lookups/s"})
    num_blocks = blocks_for_tokens(2_000_000, trace.block_size)
    rep = {}
    for e in engines:
        best = None
        for _ in range(repeats if e == "m3lab" else 1):
            r = replay(trace, e, num_blocks=num_blocks)
            best = r if best is None or r.seconds < best.seconds else best
        rep[e] = best
        blocks = int(best.stats["query_blocks"])
        rows.append({"measurement": "replay, 2M-token LRU pool", "engine": e, "trace": name, "requests": len(trace),
                     "blocks": blocks, "seconds": best.seconds, "rate": blocks / best.seconds,
                     "unit": "prompt blocks/s"})
    if with_vllm:
        assert rep["m3lab"].summary()["hit_tokens"] == rep["vllm"].summary()["hit_tokens"], "engines disagree"
        for row in rows:
            ref = next(r for r in rows if r["measurement"] == row["measurement"] and r["engine"] == "vllm")
            row["speedup_vs_vllm"] = row["rate"] / ref["rate"]
    t0 = time.perf_counter()
    sessions = generate()
    t_gen = time.perf_counter() - t0
    for cap, label in ((None, "unlimited"), (blocks_for_tokens(8_000_000, sessions.block_size), "8M-token")):
        r = replay(sessions, num_blocks=cap)
        rows.append({"measurement": f"1,000 AgentX-like sessions: generate + replay ({label} LRU)",
                     "engine": "m3lab", "trace": sessions.source, "requests": len(sessions),
                     "blocks": int(r.stats["query_blocks"]), "seconds": t_gen + r.seconds,
                     "rate": r.stats["query_blocks"] / (t_gen + r.seconds), "unit": "prompt blocks/s"})
    stamp = {"device": cpu_name(), "commit": commit(), "date": today()}
    return [{**{k: "" for k in FIELDS}, **row, **stamp} for row in rows]


def append(rows: list[dict], path: Path = CSV) -> Path:
    return append_csv(path, rows, FIELDS)
