"""One step of vLLM's own M3 sparse-attention layer, run on CPU tensors with every kernel recorded, not run.

The indexer, the page-16 table and the attend are chosen inside ``MiniMaxM3SparseAttention._run_attention``
(``amd/model.py``) from the per-step metadata: whether the MSA indexer emits the table, whether the decode
top-k writes it (``sparse_block_table_out``), whether the AITER attend builds it, which decode score kernel
the launch policy picks for this batch. :func:`run` builds that metadata with vLLM's own metadata builders
(the layer's backend and the indexer cache's backend) from a :class:`Step` (a uniform decode batch or one
prefill chunk), binds empty KV caches of the backend's own cache shape, and calls ``_run_attention`` under
:func:`m3lab.vllm.recorder.record`. Triton launches are logged, AITER calls stop at the stand-in.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from m3lab.arith import ceil_div
from m3lab.vllm import recorder


@dataclass(frozen=True)
class Step:
    """A uniform step: ``requests`` requests of ``query_len`` new tokens each after ``context`` cached ones."""

    requests: int
    query_len: int
    context: int
    capture_seq_len: int | None = None  # a FULL-graph decode step: vLLM captured it at this max_seq_len

    @property
    def tokens(self) -> int:
        return self.requests * self.query_len

    @property
    def seq_len(self) -> int:
        return self.context + self.query_len


def _gpu_resident():
    """A CPU tensor subclass whose ``is_cuda`` is True: vLLM's launch wrappers check that their inputs live
    on the GPU before launching (the launches are recorded, never run, so the data may stay on the CPU)."""
    import torch

    class OnGpu(torch.Tensor):
        @property
        def is_cuda(self) -> bool:
            return True

    return OnGpu


def _on_gpu(*tensors):
    cls = _gpu_resident()
    return tuple(t.as_subclass(cls) for t in tensors)


def _common_metadata(step: Step, block_size: int, blocks_per_req: int, table_width: int) -> Any:
    """The scheduler's batch description: ``step.requests`` requests, each with its own blocks (ids from 1:
    vLLM's block pool keeps block 0 as its null block, which pads the table); the block table is as wide as
    vLLM's (``cdiv(max_model_len, block_size)`` columns)."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata
    r, q = step.requests, step.query_len
    qsl = torch.arange(r + 1, dtype=torch.int32) * q
    seq = torch.full((r,), step.seq_len, dtype=torch.int32)
    table = torch.zeros(r, max(table_width, blocks_per_req), dtype=torch.int32)
    table[:, :blocks_per_req] = 1 + torch.arange(r * blocks_per_req, dtype=torch.int32).reshape(r, blocks_per_req)
    pos = (torch.arange(q) + step.context).repeat(r)
    slots = (table[:, :1].repeat_interleave(q, 0).flatten() * block_size + pos).to(torch.int64)
    qsl, seq, table, pos, slots = _on_gpu(qsl, seq, table, pos, slots)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq, num_reqs=r,
        num_actual_tokens=step.tokens, max_query_len=q, max_seq_len=step.capture_seq_len or step.seq_len,
        block_table_tensor=table,
        slot_mapping=slots, seq_lens_cpu_upper_bound=seq.clone(), positions=pos)


def _builder(backend, spec, name: str, vllm_config) -> Any:
    import torch
    return backend.get_builder_cls()(spec, [name], vllm_config, torch.device("cpu"))


def kv_cache_layout(vllm_config) -> Any:
    """The one KV cache layout vLLM's engine core resolves for the built model, from its workers' backends
    and every layer's cache spec (``resolve_kv_cache_layout``, ``vllm/v1/attention/backends/utils.py``);
    recorded on the config as the engine records it."""
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    layers = vllm_config.compilation_config.static_forward_context.values()
    specs = [x.get_kv_cache_spec(vllm_config) for x in layers if hasattr(x, "get_kv_cache_spec")]
    names = [x.name for x in get_supported_kv_cache_layouts(get_current_attn_backends(vllm_config))]
    return resolve_kv_cache_layout(vllm_config, [names], [x for x in specs if x is not None])


def _cache(spec, name: str, blocks: int, layout) -> Any:
    """An (empty) cache of ``blocks`` blocks for one layer in ``layout``, viewed as vLLM's worker views it
    (``vllm/v1/kv_cache_interface.py::create_kv_cache_views``)."""
    import torch
    from vllm.v1.kv_cache_interface import KVCacheTensor, create_kv_cache_views
    page = spec.page_size_bytes
    (raw,) = _on_gpu(torch.empty(page * blocks, dtype=torch.int8))
    tensor = KVCacheTensor(size=page * blocks, layers=[name], layer_stride=page * blocks, block_stride=page)
    return create_kv_cache_views(raw, spec, blocks, layout, tensor)[0]


@contextlib.contextmanager
def _bound(attn, kv_cache, index_cache, topk_buffer) -> Any:
    """The layer with caches bound (as vLLM's KV-cache manager would) for the duration of the step."""
    saved = (attn.kv_cache, attn.indexer.index_cache.kv_cache, attn.topk_indices_buffer,
             getattr(attn, "_aiter_sparse_pa_cache_data_ptr", 0))
    attn.bind_kv_cache(kv_cache)  # each layer unpacks its view as vLLM's runner binds it
    attn.indexer.index_cache.bind_kv_cache(index_cache)
    attn.topk_indices_buffer = topk_buffer
    if hasattr(attn.indexer, "topk_indices_buffer"):
        attn.indexer.topk_indices_buffer = topk_buffer
    try:
        yield
    finally:
        attn.kv_cache, attn.indexer.index_cache.kv_cache, attn.topk_indices_buffer = saved[:3]
        if hasattr(attn, "_aiter_sparse_pa_cache_data_ptr"):
            attn._aiter_sparse_pa_cache_data_ptr = saved[3]
        if hasattr(attn.indexer, "topk_indices_buffer"):
            attn.indexer.topk_indices_buffer = saved[2]


def run(attn, vllm_config, step: Step) -> recorder.Trace:
    """``attn._run_attention`` for ``step`` (``attn``: a built ``MiniMaxM3SparseAttention``)."""
    import torch
    from vllm.forward_context import ForwardContext, override_forward_context
    spec = attn.get_kv_cache_spec(vllm_config)
    icache = attn.indexer.index_cache
    ispec = icache.get_kv_cache_spec(vllm_config)
    blocks_per_req = ceil_div(step.seq_len, spec.block_size)
    blocks = 1 + step.requests * blocks_per_req  # + the null block
    width = ceil_div(vllm_config.model_config.max_model_len, spec.block_size)
    layout = kv_cache_layout(vllm_config)  # resolved before the builders, as the engine core does
    common = _common_metadata(step, spec.block_size, blocks_per_req, width)
    main_md = _builder(attn.get_attn_backend(), spec, attn.layer_name, vllm_config).build(0, common)
    index_md = _builder(icache.get_attn_backend(), ispec, icache.prefix, vllm_config).build(0, common)
    t = step.tokens
    topk, q = _on_gpu(torch.empty(attn.num_idx_heads, t, getattr(attn.impl, "topk_blocks", 16), dtype=torch.int32),
                      torch.empty(t, attn.num_heads * attn.head_dim, dtype=torch.bfloat16))
    iq = None if getattr(attn, "skip_index_topk", False) else _on_gpu(
        torch.empty(t, attn.index_q_size, dtype=icache.dtype))[0]
    ctx = ForwardContext(no_compile_layers={}, attn_metadata={attn.layer_name: main_md, icache.prefix: index_md},
                         slot_mapping={attn.layer_name: common.slot_mapping, icache.prefix: common.slot_mapping})
    with _bound(attn, _cache(spec, attn.layer_name, blocks, layout), _cache(ispec, icache.prefix, blocks, layout),
                topk), override_forward_context(ctx):
        if getattr(attn, "use_aiter_sparse_pa", False):  # as MiniMaxM3SparseAttention.forward does before _run_attention
            attn.get_aiter_sparse_pa_kv_cache()
        args = _call_args(attn, q, iq)
        trace = recorder.record(attn._run_attention, **args)
        if trace.stopped_at and not getattr(attn, "skip_index_topk", False) and _inside(trace.stop_site, "indexer"):
            # the indexer stopped at a library call of the target image: the attend is the second half
            with _silent_indexer(attn):
                attend = recorder.record(attn._run_attention, **args)
            trace.indexer_stop, trace.attend = trace.stopped_at, attend
        trace.metadata = main_md
        return trace


def _call_args(attn, q, iq) -> dict:
    """``_run_attention``'s arguments by name (the NVIDIA layer also takes an fp8 query, None here)."""
    import inspect

    import torch
    params = inspect.signature(type(attn)._run_attention).parameters
    args = {"query": q, "index_query": iq, "output": torch.empty_like(q)}
    if "query_fp8" in params:
        args["query_fp8"] = None
    return args


def _inside(site, word: str) -> bool:
    return site is not None and word in (site.file + site.function).lower()


@contextlib.contextmanager
def _silent_indexer(attn) -> Any:
    """The layer's indexer answers without computing (its launches were recorded in the first pass)."""
    cls = type(attn.indexer)
    saved = cls.forward
    cls.forward = lambda self, *args, **kwargs: (None, None)
    try:
        yield
    finally:
        cls.forward = saved
