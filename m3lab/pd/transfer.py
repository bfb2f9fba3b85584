"""The hand-off executed: prefill and decode ranks as processes joined by ``torch.distributed``, then checked.

:func:`verify_handoff` (the check of :mod:`m3lab.pd.geometry`):

1. the reference decoder (one process, all heads) prefills a prompt on a model (the mini M3 by default) and then
   decodes a few greedy tokens: the reference logits;
2. the prompt's KV is partitioned into each prefill rank's cache as the prefill plan places it (its heads, its
   layout, its block table; the index keys replicated), through ``PagedKVCache.write``;
3. ``P + D`` processes are spawned (gloo on CPU, NCCL on GPUs): prefill rank r packs, for each decode rank it
   serves, the bytes of its descriptors layer by layer and sends them; the decode rank receives and scatters them
   to its descriptors' offsets in its own layout;
4. each decode rank's received cache must equal, byte for byte, the cache written directly from the reference
   KV in the decode layout; and decoding on from the received KV (heads gathered from the decode ranks into one
   cache) must give the reference logits exactly.

A wrong descriptor (``corrupt`` moves one destination offset by one element; the same bytes are sent a second
time by the corrupted descriptors into a second copy of the decode caches) shows up as a byte mismatch that
names the layer, region, decode rank and block.
"""
from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass, field

import numpy as np
import torch

from m3lab.arith import ceil_div
from m3lab.model import build_model
from m3lab.model.kv_cache import PagedKVCache
from m3lab.pd.ranks import heads_of_rank
from m3lab.spec.model import ModelSpec

SEQ = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def byte_index(offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated byte positions ``offset .. offset + length - 1`` of every descriptor, int64."""
    if len(lengths) == 0:
        return np.zeros(0, np.int64)
    starts = np.repeat(offsets - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return starts + np.arange(int(lengths.sum()))


@dataclass
class RankJob:
    """What one process does. Prefill: ``buffers`` its caches as bytes; ``sends`` {dst global rank: [(layer key,
    byte index)]}. Decode: ``buffers`` zero bytes of its caches; ``recvs`` {src global rank: [(layer key, byte
    index)]}. Layer key: (layer, region)."""

    buffers: dict
    sends: dict = field(default_factory=dict)
    recvs: dict = field(default_factory=dict)


def _worker(rank: int, world: int, port: int, backend: str, jobs: list, outdir: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)   # P + D processes share the host's cores
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    job: RankJob = jobs[rank]
    bufs = {k: v.to(device) for k, v in job.buffers.items()}
    ops = []
    for peer, items in sorted(job.sends.items()):
        packed = torch.cat([bufs[key][torch.as_tensor(idx, device=device)] for key, idx in items])
        ops.append(dist.P2POp(dist.isend, packed, peer))
    landing = {}
    for peer, items in sorted(job.recvs.items()):
        landing[peer] = torch.empty(sum(len(idx) for _, idx in items), dtype=torch.uint8, device=device)
        ops.append(dist.P2POp(dist.irecv, landing[peer], peer))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    for peer, items in job.recvs.items():
        pos = 0
        for key, idx in items:
            bufs[key][torch.as_tensor(idx, device=device)] = landing[peer][pos:pos + len(idx)]
            pos += len(idx)
    if job.recvs:
        torch.save({k: v.cpu() for k, v in bufs.items()}, os.path.join(outdir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def run_jobs(jobs: list[RankJob], backend: str = "gloo") -> dict[int, dict]:
    """Spawn one process per job on a free localhost port; returns the receiving ranks' buffers."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as outdir:
        mp.spawn(_worker, args=(len(jobs), free_port(), backend, jobs, outdir), nprocs=len(jobs), join=True)
        return {r: torch.load(os.path.join(outdir, f"rank{r}.pt")) for r in range(len(jobs)) if jobs[r].recvs}


# ---- the check -------------------------------------------------------------------------------------------


def _side_cache(model, side, rank: int, num_blocks: int):
    sp = model.sparse
    heads = heads_of_rank(rank, side.tp, model.heads_kv)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
    cache = PagedKVCache(num_blocks=num_blocks, block_size=sp.block_size, kv_heads=len(heads),
                         head_dim=model.head_dim, index_dim=sp.index_dim,
                         sparse=[i in model.topk_layers for i in range(model.layers)], layout=side.layout,
                         dtype=dt[side.kv_dtype], index_dtype=dt[side.index_dtype])
    return cache, heads


def _fill(cache, ref_cache, heads, table: list[int], n: int, layers) -> None:
    """Write the reference KV of sequence SEQ (first n tokens, the given heads) into ``cache`` at ``table``."""
    cache.tables[SEQ], cache.lengths[SEQ] = list(table), n
    cache.free = [b for b in cache.free if b not in table]
    slots = cache.slots(SEQ, 0, n)
    for i in layers:
        k, v = ref_cache.gather(i, SEQ, n)
        ik = ref_cache.gather_index(i, SEQ, n) if cache.index[i] is not None else None
        cache.write(i, slots, k[:, list(heads)], v[:, list(heads)], ik)


def _bytes(cache) -> dict:
    out = {}
    for i, t in enumerate(cache.kv):
        out[(i, "main")] = t.contiguous().view(torch.uint8).reshape(-1).clone()
        if cache.index[i] is not None:
            out[(i, "index")] = cache.index[i].contiguous().view(torch.uint8).reshape(-1).clone()
    return out


def _tables(n_blocks: int, num_blocks: int, seed: int) -> tuple[list[int], list[int]]:
    """Random physical blocks for the two sides (so block ids and offsets differ between them)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randperm(num_blocks, generator=g)[:n_blocks].tolist()
    dst = torch.randperm(num_blocks, generator=g)[:n_blocks].tolist()
    return src, dst


@dataclass
class HandoffCheck:
    """Result of :func:`verify_handoff`."""

    descriptors: int
    bytes: int
    mismatches: list            # [(layer, region, decode rank, [blocks], bytes differing)]
    logits_equal: bool
    max_abs_logit_diff: float
    corrupted_mismatches: list | None = None   # the same for the copy sent by the corrupted descriptors
    corrupted: tuple | None = None             # (layer, region, decode rank, block) of the corrupted descriptor

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.logits_equal


def verify_handoff(prefill, decode, *, model=None, prompt_len: int = 37, decode_steps: int = 3,
                   num_blocks: int = 16, backend: str = "gloo", corrupt: int | None = None, seed: int = 0
                   ) -> HandoffCheck:
    """Run the hand-off of one prompt between real processes and check it (module docstring). ``prefill``,
    ``decode``: :class:`~m3lab.pd.geometry.CacheSide`; ``corrupt``: index of a descriptor whose destination
    offset is moved by one element (the check must then fail)."""
    from m3lab.pd.geometry import _model, request_descriptors  # local: pulls in pandas

    m = _model(model if model is not None else ModelSpec.mini())
    ref, ref_cache, logits, tokens = _reference_run(m, prompt_len, decode_steps, num_blocks, seed)
    n_blocks = ceil_div(prompt_len + decode_steps, m.sparse.block_size)
    src_table, dst_table = _tables(n_blocks, num_blocks, seed)
    layers = range(m.layers)
    desc = request_descriptors(m, prefill, decode, prompt_len, src_table, dst_table)
    variants = {"sent": desc}
    if corrupt is not None:   # the same bytes sent a second time, by one wrong descriptor, into a second copy
        bad = desc.copy()
        bad.loc[corrupt, "dst_offset"] += 1 if bad.loc[corrupt, "region"] == "main" else 2
        variants["corrupted"] = bad

    pre = [_side_cache(m, prefill, r, num_blocks) for r in range(prefill.tp)]
    for cache, heads in pre:
        _fill(cache, ref_cache, heads, src_table, prompt_len, layers)
    dec = [_side_cache(m, decode, r, num_blocks) for r in range(decode.tp)]
    received = run_jobs(_transfer_jobs(pre, dec, variants, prefill.tp), backend)
    found = {v: [] for v in variants}
    for r, (cache, heads) in enumerate(dec):
        _fill(cache, ref_cache, heads, dst_table, prompt_len, layers)
        _compare_received(cache, received[prefill.tp + r], r, variants, found)

    # decode on from the received KV: heads gathered from the decode ranks into one cache
    assembled = ref.new_cache(num_blocks, dtype=torch.bfloat16)
    _assemble(assembled, [c for c, _ in dec], [h for _, h in dec], prompt_len, layers)
    got_l = torch.stack([ref.step(assembled, [(SEQ, t)]) for t in tokens])
    want = torch.stack(logits[1:])
    return HandoffCheck(descriptors=len(desc), bytes=int(desc["length"].sum()), mismatches=found["sent"],
                        logits_equal=bool(torch.equal(want, got_l)),
                        max_abs_logit_diff=float((want - got_l).abs().max()),
                        corrupted_mismatches=found.get("corrupted"),
                        corrupted=None if corrupt is None else tuple(desc.loc[corrupt, ["layer", "region", "dst_rank",
                                                                                        "dst_block"]]))


def _reference_run(m, prompt_len: int, decode_steps: int, num_blocks: int, seed: int):
    """(reference model, its KV cache, logits of the prefill and each decode step, greedy decode tokens) of one
    random prompt of ``prompt_len`` tokens on the whole (unsharded) model."""
    ref = build_model(m, None, seed=seed)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, m.vocab, (prompt_len,), generator=g)
    ref_cache = ref.new_cache(num_blocks, dtype=torch.bfloat16)
    logits = [ref.step(ref_cache, [(SEQ, prompt)])]
    tokens = []
    for _ in range(decode_steps):
        tokens.append(logits[-1].argmax(-1))
        logits.append(ref.step(ref_cache, [(SEQ, tokens[-1])]))
    return ref, ref_cache, logits, tokens


def _transfer_jobs(pre, dec, variants: dict, prefill_tp: int) -> list[RankJob]:
    """One job per process (prefill ranks, then decode ranks): every descriptor group of every variant becomes a
    send from its prefill rank and a receive into a zeroed copy of the decode rank's region."""
    jobs = [RankJob(_bytes(c)) for c, _ in pre] + [
        RankJob({(*k, v): torch.zeros_like(b) for k, b in _bytes(c).items() for v in variants}) for c, _ in dec]
    for variant, ds in variants.items():
        for (layer, region, s, d), grp in ds.groupby(["layer", "region", "src_rank", "dst_rank"], sort=True):
            src_idx = byte_index(grp["src_offset"].to_numpy(), grp["length"].to_numpy())
            dst_idx = byte_index(grp["dst_offset"].to_numpy(), grp["length"].to_numpy())
            jobs[s].sends.setdefault(prefill_tp + d, []).append(((layer, region), src_idx))
            jobs[prefill_tp + d].recvs.setdefault(s, []).append(((layer, region, variant), dst_idx))
    return jobs


def _compare_received(cache, got: dict, rank: int, variants: dict, found: dict) -> None:
    """Append to ``found[variant]`` every (layer, region, rank, blocks, bytes) where what decode rank ``rank``
    received differs from what its ``cache`` should hold; then overwrite the cache with what arrived under
    "sent" (decoding goes on from the received KV)."""
    for key, want in _bytes(cache).items():
        region_cache = cache.kv[key[0]] if key[1] == "main" else cache.index[key[0]]
        block_bytes = region_cache[0].numel() * region_cache.element_size()
        for v in variants:
            diff = (got[(*key, v)] != want).nonzero().flatten()
            if len(diff):
                blocks = sorted({int(b) for b in (diff // block_bytes).tolist()})
                found[v].append((key[0], key[1], rank, blocks, int(len(diff))))
        region_cache.reshape(-1).view(torch.uint8).copy_(got[(*key, "sent")])


def _assemble(target, caches, heads_per_rank, n: int, layers) -> None:
    """One all-heads cache from decode-rank caches (their received contents), at the first rank's block table."""
    table = caches[0].tables[SEQ]
    target.tables[SEQ], target.lengths[SEQ] = list(table), n
    target.free = [b for b in target.free if b not in table]
    slots = target.slots(SEQ, 0, n)
    heads_kv = max(max(h) for h in heads_per_rank) + 1
    for i in layers:
        k = v = None
        for cache, heads in zip(caches, heads_per_rank):
            kr, vr = cache.gather(i, SEQ, n)
            if k is None:
                k = torch.empty(n, heads_kv, kr.shape[-1], dtype=kr.dtype)
                v = torch.empty_like(k)
            k[:, list(heads)], v[:, list(heads)] = kr, vr
        ik = caches[0].gather_index(i, SEQ, n) if caches[0].index[i] is not None else None
        target.write(i, slots, k, v, ik)
