"""vLLM 0.33.0's own V1 ``Scheduler`` / ``AsyncScheduler``, driven on a CPU with fake model outputs: the judge.

:func:`build_scheduler` builds vLLM's scheduler class for a :class:`~m3lab.workload.scheduler.SchedulerConfig`
(max_num_seqs, max_num_batched_tokens, block size, KV blocks, chunked prefill, prefix caching, spec method and
k, async scheduling) the way ``EngineCore`` builds it (``vllm/v1/engine/core.py``, ``EngineCore.__init__`` /
``_initialize_kv_caches``), without a GPU or a model:

- the MiniMax M3 ``config.json`` shipped in ``m3lab/spec/configs`` (its ``quantization_config`` dropped: the
  scheduler never reads it) in a folder under ``VLLM_CACHE_ROOT``, whose architecture inspection vLLM caches
  there (set ``VLLM_CACHE_ROOT`` to a folder CI keeps; default ``<venv>/.vllm-cache``);
- the M3 architectures registered to a stand-in (``LlamaForCausalLM``), so inspection does not import the model;
  ``hf_config`` stays vLLM's ``MiniMaxM3Config``, so ``SpeculativeConfig(method="mtp")`` rewrites it as for M3;
- ``DeviceConfig("cpu")`` on vLLM's unspecified platform (``VLLM_TARGET_DEVICE=cpu`` would select
  ``CpuPlatform``, which forces ``async_scheduling=False``);
- a hand-made ``KVCacheConfig`` of one full-attention group of ``num_kv_blocks`` blocks (vLLM's
  ``num_gpu_blocks``; M3's per-layer specs collapse to one such group);
- requests hashed by the block hasher ``EngineCore`` builds (``get_request_block_hasher`` with
  ``vllm_config.num_hash_lookahead_tokens``).

:class:`Judge` drives it as ``EngineCore.step`` + ``post_step`` (sync) or ``EngineCore.step_with_batch_queue``
with a 2-deep batch queue (async), with the fake outputs of :mod:`m3lab.workload.requests`, and returns the
same :class:`~m3lab.workload.requests.StepRecord` s as m3lab's generator (:mod:`m3lab.workload.scheduler`).
vLLM is a heavy, optional import (about 5 s): it is imported inside the functions here, never at module import.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from m3lab.atomic import write_text
from m3lab.errors import M3LabError
from m3lab.spec.model import CONFIG_DIR
from m3lab.vllm_src.imports import vllm_module
from m3lab.workload.requests import ClosedLoop, FakeOutputs, RequestContents, StepRecord
from m3lab.workload.scheduler import SchedulerConfig

FEATURE = "running a schedule through vLLM's own Scheduler (--engine vllm)"
#: The shipped M3 config the scheduler is built on (its MTP module count sets ``n_predict``).
M3_CONFIG = "minimax-m3-mxfp8"
#: M3's architectures, and the stand-in vLLM inspects instead (the scheduler reads no model code).
M3_ARCHITECTURES = ("MiniMaxM3SparseForConditionalGeneration", "MiniMaxM3MTP")
STAND_IN = "vllm.model_executor.models.llama:LlamaForCausalLM"


def cache_root() -> Path:
    """``VLLM_CACHE_ROOT``; when unset, ``<venv>/.vllm-cache`` (CI keeps its venv, so it reuses vLLM's cached
    model inspection: 7-10 s cold, 0.1 s warm), or vLLM's own default where the venv is read-only."""
    root = os.environ.get("VLLM_CACHE_ROOT")
    if not root:
        venv = Path(sys.prefix)
        root = str(venv / ".vllm-cache") if os.access(venv, os.W_OK) else str(Path.home() / ".cache" / "vllm")
        os.environ["VLLM_CACHE_ROOT"] = root
    return Path(root)


def _model_folder(config_name: str) -> Path:
    """A folder holding the shipped config (without ``quantization_config``), stable so vLLM's cache applies."""
    shipped = CONFIG_DIR / f"{config_name}.json"
    if not shipped.is_file():
        raise M3LabError(f"no shipped model config {config_name!r} in {CONFIG_DIR}", field="config",
                         hint=f"use {M3_CONFIG}")
    cfg = json.loads(shipped.read_text())
    cfg.pop("quantization_config", None)
    folder = cache_root() / "m3lab-scheduler-judge" / config_name
    text = json.dumps(cfg, indent=1, sort_keys=True)
    path = folder / "config.json"
    if not path.is_file() or path.read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        write_text(path, text)                       # atomic: parallel test workers share the folder
    return folder


class _Vllm:
    """vLLM's modules, imported once (heavy; optional dependency)."""

    _mods = None

    @classmethod
    def get(cls) -> dict:
        if cls._mods is None:
            cache_root()
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")   # its warnings about tiny test budgets are noise

            m = {name: vllm_module(mod, FEATURE) for name, mod in (
                ("config", "vllm.config"), ("registry", "vllm.model_executor.models.registry"),
                ("iface", "vllm.v1.kv_cache_interface"), ("kcu", "vllm.v1.core.kv_cache_utils"),
                ("hashing", "vllm.utils.hashing"), ("sched", "vllm.v1.core.sched.scheduler"),
                ("async_sched", "vllm.v1.core.sched.async_scheduler"), ("request", "vllm.v1.request"),
                ("sp", "vllm.sampling_params"), ("so", "vllm.v1.structured_output"),
                ("outputs", "vllm.v1.outputs"))}
            for arch in M3_ARCHITECTURES:
                m["registry"].ModelRegistry.register_model(arch, STAND_IN)
            import torch
            m["torch"] = torch
            cls._mods = m
        return cls._mods


def build_scheduler(cfg: SchedulerConfig, max_model_len: int, *, config_name: str = M3_CONFIG):
    """vLLM's ``Scheduler`` (or ``AsyncScheduler``) for ``cfg``; returns (scheduler, vllm_config, block hasher)."""
    if cfg.num_kv_blocks is None:
        raise M3LabError("vLLM's scheduler needs a finite KV pool", field="num_kv_blocks",
                         hint="set num_kv_blocks (vLLM's num_gpu_blocks, the server log's 'GPU KV cache size')")
    m = _Vllm.get()
    c = m["config"]
    model = c.ModelConfig(model=str(_model_folder(config_name)), dtype="bfloat16", skip_tokenizer_init=True,
                          max_model_len=max_model_len)
    parallel = c.ParallelConfig()
    sched_cfg = c.SchedulerConfig(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                                  max_model_len=max_model_len, enable_chunked_prefill=cfg.chunked_prefill,
                                  is_encoder_decoder=False, async_scheduling=cfg.async_scheduling)
    cache = c.CacheConfig(block_size=cfg.block_size, enable_prefix_caching=cfg.prefix_caching)
    spec = None
    if cfg.spec_method:
        spec = c.SpeculativeConfig(method=cfg.spec_method, num_speculative_tokens=cfg.spec_tokens,
                                   target_model_config=model, target_parallel_config=parallel)
    vcfg = c.VllmConfig(model_config=model, scheduler_config=sched_cfg, cache_config=cache, parallel_config=parallel,
                        speculative_config=spec, device_config=c.DeviceConfig(device="cpu"))
    if bool(vcfg.scheduler_config.async_scheduling) != cfg.async_scheduling:
        raise M3LabError(f"vLLM resolved async_scheduling={vcfg.scheduler_config.async_scheduling} for this "
                         f"configuration, not {cfg.async_scheduling}", field="async_scheduling")
    iface = m["iface"]
    group = iface.KVCacheGroupSpec(["layer"], iface.FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=1,
                                                                      head_size=1, dtype=m["torch"].float32))
    kv = iface.KVCacheConfig(num_blocks=cfg.num_kv_blocks, kv_cache_tensors=[], kv_cache_groups=[group])
    vcfg.cache_config.num_gpu_blocks = cfg.num_kv_blocks
    cls = m["async_sched"].AsyncScheduler if vcfg.scheduler_config.async_scheduling else m["sched"].Scheduler
    sched = cls(vllm_config=vcfg, kv_cache_config=kv, structured_output_manager=m["so"].StructuredOutputManager(vcfg),
                block_size=cfg.block_size, log_stats=True)
    kcu = m["kcu"]
    hash_fn = m["hashing"].get_hash_fn_by_name(vcfg.cache_config.prefix_caching_hash_algo)
    kcu.init_none_hash(hash_fn)
    hasher = kcu.get_request_block_hasher(sched.hash_block_size, hash_fn, vcfg.num_hash_lookahead_tokens)
    return sched, vcfg, hasher


def warm_up() -> None:
    """Import vLLM and build one scheduler (model-info inspection cached under ``VLLM_CACHE_ROOT``)."""
    build_scheduler(SchedulerConfig(block_size=16, num_kv_blocks=16), 1024)


def lookahead_facts(cfg: SchedulerConfig, max_model_len: int = 1 << 15) -> dict:
    """What vLLM derives from ``cfg``'s spec method: lookahead slots, hash lookahead, prefill lookahead."""
    _, vcfg, _ = build_scheduler(cfg if cfg.num_kv_blocks else cfg.replace(num_kv_blocks=2), max_model_len)
    return {"num_lookahead_tokens": vcfg.num_lookahead_tokens,
            "num_hash_lookahead_tokens": vcfg.num_hash_lookahead_tokens,
            "num_prefill_lookahead_tokens": vcfg.num_prefill_lookahead_tokens}


class Judge:
    """Drives vLLM's scheduler over ``contents`` (see module docstring); :meth:`run` returns the step records.

    ``arrivals``: a callable ``(call, finished_so_far) -> request ids`` added before ``schedule()`` number
    ``call`` (default: :class:`~m3lab.workload.requests.ClosedLoop` at ``concurrency``)."""

    def __init__(self, cfg: SchedulerConfig, contents: RequestContents, outputs: FakeOutputs, *,
                 concurrency: int | None = None, arrivals=None, max_model_len: int | None = None,
                 config_name: str = M3_CONFIG):
        self.cfg, self.contents, self.outputs = cfg, contents, outputs
        self.max_model_len = max_model_len or cfg.max_model_len or contents.max_model_len(cfg.spec_tokens)
        self.sched, self.vcfg, self._hasher = build_scheduler(cfg, self.max_model_len, config_name=config_name)
        self.arrivals = arrivals or ClosedLoop(len(contents), concurrency or len(contents))
        m = _Vllm.get()
        self._Request, self._SP, self._out = m["request"].Request, m["sp"].SamplingParams, m["outputs"]
        self._verifies: dict[int, int] = {}
        self._preempted: set[int] = set()
        self.records: list[StepRecord] = []
        self.calls = 0
        self.stuck = False

    # ---- requests and fake outputs -----------------------------------------------------------------
    def _add(self, rid: int) -> None:
        c = self.contents
        sp = self._SP(max_tokens=int(c.max_tokens[rid]), ignore_eos=True)
        req = self._Request(str(rid), c.prompt_tokens(rid), sp, None, block_hasher=self._hasher)
        self.sched.add_request(req)

    def _fake_counts(self, out) -> dict[int, int]:
        """Tokens each scheduled request returns (0: a partial prefill chunk), decided right after schedule()."""
        counts = {}
        spec = out.scheduled_spec_decode_tokens
        for sid in out.num_scheduled_tokens:
            req = self.sched.requests[sid]
            if req.is_prefill_chunk:
                counts[sid] = 0
                continue
            k = len(spec.get(sid, ()))
            a = 0
            if k:
                rid = int(sid)
                n = self._verifies.get(rid, 0)
                self._verifies[rid] = n + 1
                a = self.outputs.accepted(rid, n, k)
            counts[sid] = 1 + a
        return counts

    def _model_output(self, counts: dict[int, int]):
        """``ModelRunnerOutput`` with each request's next content tokens (positions as of now, at update)."""
        ids = list(counts)
        sampled = []
        for sid in ids:
            req = self.sched.requests.get(sid)
            n = counts[sid]
            if not n or req is None:
                sampled.append([])
                continue
            start = req.num_tokens
            sampled.append(self.contents.tokens(int(sid), start, start + n))
        return self._out.ModelRunnerOutput(req_ids=ids, req_id_to_index={s: i for i, s in enumerate(ids)},
                                           sampled_token_ids=sampled)

    # ---- one schedule() and one update_from_output() --------------------------------------------------
    def _schedule(self, queue=()):
        """One ``schedule()``: (output, record or None, fake token counts)."""
        sched = self.sched
        in_flight = any(out.total_num_scheduled_tokens for out, _, _ in queue)
        out = sched.schedule()
        self.calls += 1
        running, waiting = sched.get_request_counts()
        executed = out.total_num_scheduled_tokens > 0
        self.stuck = not executed and waiting and not running and not in_flight
        preempted = sorted(int(s) for s in out.preempted_req_ids)
        admitted = [(int(nr.req_id), int(nr.num_computed_tokens), int(nr.req_id) in self._preempted)
                    for nr in out.scheduled_new_reqs]
        admitted += [(int(sid), int(sched.requests[sid].num_computed_tokens - out.num_scheduled_tokens[sid]), True)
                     for sid in out.scheduled_cached_reqs.resumed_req_ids]
        self._preempted.update(preempted)
        if not executed and not preempted:
            return out, None, {}
        computed = {int(s): int(sched.requests[s].num_computed_tokens) - n for s, n in out.num_scheduled_tokens.items()}
        rec = StepRecord(call=self.calls - 1, scheduled={int(s): int(n) for s, n in out.num_scheduled_tokens.items()},
                         computed=computed,
                         spec={int(s): len(v) for s, v in out.scheduled_spec_decode_tokens.items() if v},
                         admitted=tuple(sorted(admitted)), preempted=tuple(preempted), running=running, waiting=waiting,
                         kv_usage=float(sched.get_kv_cache_usage()),
                         free_blocks=int(sched.kv_cache_manager.block_pool.get_num_free_blocks()))
        self.records.append(rec)
        return out, rec, self._fake_counts(out)

    def _update(self, out, rec, counts) -> list[int]:
        """Apply a batch's outputs; return the requests that finished."""
        eco = self.sched.update_from_output(out, self._model_output(counts))
        outs = [o for e in eco.values() for o in e.outputs]
        finished = sorted(int(o.request_id) for o in outs if o.finish_reason is not None)
        if rec is not None:
            rec.finished, rec.applied = tuple(finished), self.calls
            rec.emitted = {int(o.request_id): len(o.new_token_ids) for o in outs if o.new_token_ids}
        stats = next((e.scheduler_stats for e in eco.values() if e.scheduler_stats is not None), None)
        if stats is not None and stats.prefix_cache_stats is not None:
            self.hit_tokens += stats.prefix_cache_stats.hits
            self.query_tokens += stats.prefix_cache_stats.queries
        return finished

    def _drafts(self, out, counts) -> None:
        """Sync scheduling: ``post_step`` hands ``k`` drafts for each request that sampled (the fake proposer)."""
        k = self.cfg.spec_tokens
        ids = [s for s, n in counts.items() if n and s in self.sched.requests]
        if k and ids:
            self.sched.update_draft_token_ids(self._out.DraftTokenIds(ids, [[0] * k for _ in ids]))

    # ---- drivers ---------------------------------------------------------------------------------------
    def _call(self, queue: list):
        """One ``EngineCore.step`` / ``step_with_batch_queue`` call: (record or None, finished) or None if idle."""
        sched = self.sched
        if not self.cfg.async_scheduling:
            if not sched.has_requests():
                return None
            out, rec, counts = self._schedule()
            finished = self._update(out, rec, counts)
            if out.total_num_scheduled_tokens:
                self._drafts(out, counts)
            return rec, finished
        rec = None
        if sched.has_requests():                # EngineCore.step_with_batch_queue with a batch queue of 2
            out, rec, counts = self._schedule(queue)
            queue.insert(0, (out, rec, counts))
            if len(queue) < 2 and (out.total_num_scheduled_tokens > 0 or sched.has_requests()):
                return rec, []
        elif not queue:
            return None
        return rec, self._update(*queue.pop())

    def run(self, max_calls: int = 10**8, progress: bool = False) -> list[StepRecord]:
        """Drive until every request finished; the records of the steps that scheduled or preempted anything.
        ``progress``: a progress bar over finished requests (for long runs)."""
        self.hit_tokens = self.query_tokens = 0
        bar = task = None
        if progress:
            from rich.progress import Progress     # only for interactive runs
            bar = Progress(transient=True)
            bar.start()
            task = bar.add_task("vLLM's scheduler", total=len(self.contents))
        try:
            self._drive(max_calls, [], bar, task)
        finally:
            if bar is not None:
                bar.stop()
        return self.records

    def _drive(self, max_calls: int, queue: list, bar, task) -> None:
        done, n_total = 0, len(self.contents)
        while done < n_total:
            for rid in self.arrivals(self.calls, done):
                self._add(rid)
            if self.calls >= max_calls:
                raise M3LabError(f"vLLM's scheduler did not finish in {max_calls} calls", field="max_calls")
            out = self._call(queue)
            if out is None:
                skip = getattr(self.arrivals, "next_call", None)
                if skip is None or skip() is None:
                    raise M3LabError("nothing to schedule and the workload is not done", field="arrivals")
                self.calls = max(self.calls, skip())
                continue
            if self.stuck:
                raise M3LabError("vLLM's scheduler cannot make progress: a request does not fit the KV cache",
                                 field="num_kv_blocks")
            done += len(out[1])
            if bar is not None and out[1]:
                bar.update(task, completed=done)


def judge_records(cfg: SchedulerConfig, contents: RequestContents, outputs: FakeOutputs, **kwargs) -> list[StepRecord]:
    """The step records of vLLM's scheduler for ``contents`` (see :class:`Judge`)."""
    return Judge(cfg, contents, outputs, **kwargs).run()


__all__ = ["Judge", "build_scheduler", "judge_records", "lookahead_facts", "warm_up"]
