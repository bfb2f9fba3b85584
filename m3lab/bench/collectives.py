"""Collectives on one host: NCCL all-reduce of [T, hidden] bf16 and point-to-point KV block transfers.

    m3lab bench collectives [--out traces/bench/collectives.csv] [--world 2] [--tokens 1,2,4,...,8192]
        [--blocks 1,4,16,64,256,1024]          (:func:`run`)

Spawns ``--world`` processes (one per GPU, NCCL over NVLink on an H200 pair) and appends rows in the long
benchmark format (:mod:`m3lab.bench.table`) under ``traces/bench/collectives.csv``:

- ``allreduce`` / ``nccl``: ``T=..,H=..,world=..`` bf16. 24 all-reduces, each on its own input copy (together over
  twice the L2), captured in one CUDA graph and replayed (``nccl``; ``nccl-eager`` where the build cannot capture
  and the same calls run eagerly); per-call µs = replay time / 24. Every rank times the
  same fixed number of replays (collectives must stay in lockstep, so no adaptive repetition) and the slowest
  rank's quantiles are kept. ``tbps`` is the bus bandwidth 2 (n - 1) / n x bytes / t, the figure NCCL reports;
  ``frac_ceiling`` is that over the hardware profile's one-way link bandwidth.
- ``p2p_kv`` / ``nccl``: ``blocks=..,block_bytes=..,world=..`` uint8: rank 0 sends ``blocks`` KV blocks of
  ``block_bytes`` (default :func:`kv_block_bytes`: MiniMax M3 at TP4, bf16, one layer's K+V block of one head,
  128 x 256 x 2 = 65,536 B) to
  rank 1 as one contiguous message, 24 back to back per timed run, eagerly (``nccl-eager``: a capture that
  failed on one rank only would hang the other); ``tbps`` = bytes / t.

:func:`m3lab.cost.collective_time.comm_time_us` reads the table back for the cost model.
"""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from m3lab.bench.table import BenchRow, append_rows, commit_id, today
from m3lab.bench.timing import copies_needed
from m3lab.errors import M3LabError
from m3lab.optable.kernel_shapes import sparse_problem
from m3lab.pd.transfer import free_port
from m3lab.spec.hardware import load_hardware
from m3lab.spec.model import load_model

CALLS = 24                  # collectives per captured graph (as for every decode-kernel benchmark)
REPLAYS = 50                # timed replays, the same on every rank
WARMUP = 5
TOKENS = tuple(2 ** i for i in range(14))          # 1 .. 8192
BLOCKS = (1, 4, 16, 64, 256, 1024)
OUT = "traces/bench/collectives.csv"


def kv_block_bytes(model: str = "minimax-m3", tp: int = 4, elt_bytes: int = 2) -> int:
    """Bytes of one layer's KV block of one KV head (block tokens x K|V x head dim, bf16) on one rank."""
    p = sparse_problem(model, tp)
    return p.block * 2 * p.head_dim * elt_bytes


def _quantiles(times_ms: list[float]) -> torch.Tensor:
    t = torch.tensor(sorted(times_ms), dtype=torch.float64)
    return torch.quantile(t, torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64))


def _time_replays(run, group, capture: bool) -> tuple[torch.Tensor, str]:
    """Per-call µs quantiles (slowest rank) of ``run`` (one call = CALLS collectives), in a CUDA graph when
    ``capture`` (all-reduce), else eagerly (point-to-point: one failed capture on one rank would hang the other)."""
    run()
    torch.cuda.synchronize()
    provider, step = "nccl-eager", run
    if capture:
        graph, ok = torch.cuda.CUDAGraph(), 1
        try:
            with torch.cuda.graph(graph):
                run()
        except RuntimeError as err:   # a torch/NCCL build that cannot capture: every rank falls back together
            print(f"rank {dist.get_rank()}: CUDA-graph capture failed ({err}); timing eagerly", flush=True)
            ok = 0
        torch.cuda.synchronize()
        flag = torch.tensor([ok], device="cuda")
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        if flag.item():
            provider, step = "nccl", graph.replay
    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    dist.barrier(group)
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    q = (_quantiles(times) * 1e3 / CALLS).cuda()
    dist.all_reduce(q, op=dist.ReduceOp.MAX, group=group)
    return q.cpu(), provider


def _copies(nbytes: int) -> int:
    return max(CALLS, copies_needed(nbytes, torch.device("cuda")))


def _device_name() -> str:
    return torch.cuda.get_device_name().replace(" ", "_")


def _worker(rank: int, world: int, port: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    group = dist.group.WORLD
    link = args.link_tbps
    rows = []
    for t in args.tokens:
        nbytes = t * args.hidden * 2
        bufs = [torch.randn(t, args.hidden, device="cuda", dtype=torch.bfloat16) for _ in range(min(_copies(nbytes),
                                                                                                   4 * CALLS))]

        def run(bufs=bufs):
            for i in range(CALLS):
                dist.all_reduce(bufs[i % len(bufs)], group=group)

        q, provider = _time_replays(run, group, capture=True)
        bus = 2 * (world - 1) / world * nbytes / (q[1].item() * 1e-6) / 1e12
        rows.append(BenchRow("allreduce", provider, f"T={t},H={args.hidden},world={world}", "bf16",
                             *q.tolist(), 0.0, bus, bus / link if link else float("nan"),
                             f"link_tbps={link:g}" if link else "", _device_name(), commit_id(), today()))
    for n in args.blocks:
        nbytes = n * args.block_bytes
        buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        if rank == 0:
            buf.random_(0, 255)

        def run(buf=buf):
            for _ in range(CALLS):
                if rank == 0:
                    dist.send(buf, 1, group=group)
                elif rank == 1:
                    dist.recv(buf, 0, group=group)

        q, provider = _time_replays(run, group, capture=False)
        bw = nbytes / (q[1].item() * 1e-6) / 1e12
        rows.append(BenchRow("p2p_kv", provider, f"blocks={n},block_bytes={args.block_bytes},world={world}", "uint8",
                             *q.tolist(), 0.0, bw, bw / link if link else float("nan"),
                             f"link_tbps={link:g}" if link else "", _device_name(), commit_id(), today()))
    if rank == 0:
        append_rows(args.out, rows)
        for r in rows:
            print(f"{r.op:10s} {r.provider:11s} {r.shape:40s} p50 {r.us_p50:9.2f} us  {r.tbps * 1e3:8.1f} GB/s")
    dist.barrier(group)
    dist.destroy_process_group()


def run(out: str | Path = OUT, world: int = 2, tokens=TOKENS, blocks=BLOCKS, hidden: int | None = None,
        block_bytes: int | None = None, hardware: str = "h200", model: str = "minimax-m3") -> Path:
    """Spawn ``world`` ranks (one per GPU) and append every all-reduce and KV-transfer row to ``out`` -> its path.
    ``hidden`` (default: ``model``'s) and ``block_bytes`` (default :func:`kv_block_bytes`) size the messages;
    ``hardware``: the profile whose one-way link bandwidth is the ceiling."""
    if torch.cuda.device_count() < world:
        raise M3LabError(f"world: {world} ranks need {world} GPUs; {torch.cuda.device_count()} visible", field="world")
    args = SimpleNamespace(out=str(out), tokens=list(tokens), blocks=list(blocks),
                           hidden=hidden or load_model(model).hidden, block_bytes=block_bytes or kv_block_bytes(model),
                           link_tbps=load_hardware(hardware).link_bw / 1e12)
    mp.spawn(_worker, args=(world, free_port(), args), nprocs=world, join=True)
    return Path(out)
