"""vLLM's own ``KVCacheManager`` / ``BlockPool`` behind the replay interface of :mod:`m3lab.cache.replay`.

The reference answer for the simulator: the installed vLLM's classes, on a CPU, without a model (the
driving recipe of vLLM's own tests/v1/core): one full-attention KV cache group,
``KVCacheManager(kv_cache_config, max_model_len, scheduler_block_size=B, hash_block_size=B,
enable_caching=True, log_stats=True)``, requests made with ``get_request_block_hasher(B, sha256)``.

Block keys become token ids: every token of full block ``i`` is ``keys[i]``, so two blocks hash alike in
vLLM (sha256 over parent hash + tokens) exactly when their chained keys are equal; the tokens of a
sequence's last, partial block are ``-1`` (never hashed). Evictions are counted by wrapping the pool's
``_maybe_evict_cached_block`` on this instance (observing it, not changing it).
"""
from __future__ import annotations

import numpy as np

from m3lab.vllm_src.imports import vllm_module

FEATURE = "running a trace through vLLM's own KV cache manager (--engine vllm)"


class _Modules:
    _loaded = None

    @classmethod
    def get(cls):
        if cls._loaded is None:
            import torch

            kcu = vllm_module("vllm.v1.core.kv_cache_utils", FEATURE)
            hashing = vllm_module("vllm.utils.hashing", FEATURE)
            kcu.init_none_hash(hashing.sha256)
            cls._loaded = {
                "kcu": kcu, "hashing": hashing, "torch": torch,
                "kcm": vllm_module("vllm.v1.core.kv_cache_manager", FEATURE),
                "req": vllm_module("vllm.v1.request", FEATURE),
                "spec": vllm_module("vllm.v1.kv_cache_interface", FEATURE),
                "sp": vllm_module("vllm.sampling_params", FEATURE),
            }
        return cls._loaded


def tokens_of(keys, length: int, block_size: int) -> list[int]:
    """Token ids standing for a sequence of ``length`` tokens whose full blocks have ``keys``."""
    full = np.repeat(np.asarray(keys, np.int64), block_size)
    return full.tolist() + [-1] * (length - len(full))


class VllmKVCache:
    """vLLM 0.33.0's ``KVCacheManager`` with the request-level methods of :class:`~m3lab.cache.replay.Engine`."""

    def __init__(self, num_blocks: int, block_size: int, *, use_eagle: bool = False, max_model_len: int = 1 << 40):
        m = _Modules.get()
        spec = m["spec"]
        group = spec.KVCacheGroupSpec(["layer"], spec.FullAttentionSpec(block_size=block_size, num_kv_heads=1,
                                                                         head_size=1, dtype=m["torch"].float32))
        cfg = spec.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[group])
        self.manager = m["kcm"].KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=block_size,
                                               hash_block_size=block_size, enable_caching=True, use_eagle=use_eagle,
                                               log_stats=True)
        self.pool = self.manager.block_pool
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._hasher = m["kcu"].get_request_block_hasher(block_size, m["hashing"].sha256)
        self._m = m
        self.requests: dict = {}
        self._tokens: dict = {}
        self._hits: dict = {}
        self.evicted_blocks = 0
        evict = self.pool._maybe_evict_cached_block

        def counting(block):
            out = evict(block)
            self.evicted_blocks += bool(out)
            return out

        self.pool._maybe_evict_cached_block = counting

    # ---- requests ---------------------------------------------------------------------------------
    def add(self, rid, keys: list, prompt: int, total: int) -> None:
        toks = tokens_of(keys, total, self.block_size)
        sp = self._m["sp"].SamplingParams(max_tokens=max(total - prompt, 1), ignore_eos=True)
        self.requests[rid] = self._m["req"].Request(str(rid), toks[:prompt], sp, None, block_hasher=self._hasher)
        self._tokens[rid] = toks

    def _grow(self, rid, num_tokens: int):
        req = self.requests[rid]
        if num_tokens > req.num_tokens:
            req.append_output_token_ids(self._tokens[rid][req.num_tokens:num_tokens])
        return req

    def lookup(self, rid, num_tokens: int) -> list[int]:
        req = self._grow(rid, num_tokens)
        blocks, n, _ = self.manager.get_computed_blocks(req)
        self._hits[rid] = blocks
        return list(blocks.get_block_ids()[0]) if n else []

    def allocate(self, rid, num_tokens: int, num_computed: int, num_new_tokens: int, hit: list,
                 full_sequence_must_fit: bool = False, lookahead: int = 0) -> bool:
        req = self._grow(rid, num_tokens)
        req.num_computed_tokens = num_computed
        blocks = self._hits.pop(rid, None) if hit else None
        out = self.manager.allocate_slots(req, num_new_tokens, len(hit) * self.block_size, blocks,
                                          num_lookahead_tokens=lookahead,
                                          full_sequence_must_fit=full_sequence_must_fit)
        return out is not None

    def record(self, rid, num_tokens: int, hit_blocks: int, preempted: bool = False) -> None:
        req = self._grow(rid, num_tokens)
        req.num_preemptions = int(preempted)
        self.manager.record_prefix_cache_stats(req, hit_blocks * self.block_size)

    def free(self, rid) -> None:
        self.manager.free(self.requests[rid])

    def remove(self, rid) -> None:
        self.requests.pop(rid, None)
        self._tokens.pop(rid, None)
        self._hits.pop(rid, None)

    # ---- state ------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.pool.get_num_free_blocks()

    @property
    def usage(self) -> float:
        return self.manager.usage

    @property
    def num_cached(self) -> int:
        return sum(1 if not isinstance(v, dict) else len(v) for v in self.pool.cached_block_hash_to_block._cache.values())

    def free_order(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]

    def block_ids(self, rid) -> list[int]:
        return list(self.manager.get_block_ids(str(rid))[0])

    def take_stats(self) -> dict:
        """vLLM's ``PrefixCacheStats`` since the last call, as a dict."""
        s = self.manager.make_prefix_cache_stats()
        return {"requests": s.requests, "queries": s.queries, "hits": s.hits,
                "preempted_requests": s.preempted_requests, "preempted_queries": s.preempted_queries,
                "preempted_hits": s.preempted_hits}
