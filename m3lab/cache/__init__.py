"""KV / prefix-cache simulation with vLLM v1's semantics (checklist step 6: iterative profiling).

- :mod:`m3lab.cache.pool` — :class:`PrefixCache`, vLLM's block pool + KV cache manager on integer ids;
- :mod:`m3lab.cache.policies` — eviction orders: ``lru`` (vLLM's), ``lfu``, ``radix`` (leaf-first);
- :mod:`m3lab.cache.trace` — Mooncake / AgentX readers and the fixed-length workload, one :class:`Trace`;
- :mod:`m3lab.cache.agentic` — seeded AgentX-like session generator;
- :mod:`m3lab.cache.replay` — a trace through a cache (m3lab's or vLLM's own classes);
- :mod:`m3lab.cache.vllm_ref` — the same operations on vLLM's ``KVCacheManager`` (the reference);
- :mod:`m3lab.cache.sessions` — agentic sessions (turns, think times) over a trace;
- :mod:`m3lab.cache.analysis` / :mod:`m3lab.cache.plots` — tables and figures of notebook 06;
- :mod:`m3lab.cache.bench` — speed against vLLM's classes (``m3lab bench cache``).

This room stands below :mod:`m3lab.workload` (its scheduler keeps a :class:`PrefixCache`). Serving on a clock
with the cache (blocks per rank from memory, preemption, step times from the cost model: TTFT / TPOT
distributions) is :mod:`m3lab.serving.cached`, the pool size :mod:`m3lab.serving.cache_capacity`.
"""
from m3lab.cache.pool import PrefixCache, PrefixCacheStats

__all__ = ["PrefixCache", "PrefixCacheStats"]
