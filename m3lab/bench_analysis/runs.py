"""The kernel notebooks' measurements: live on a GPU through the benchmark runners, else the recorded tables.

Each function returns ``(table, source)``: the long benchmark table (``m3lab.bench.table``) and a
:class:`Source` that says where its numbers come from — ``live`` (measured now on this device, at this
checkout's commit) or ``recorded`` (the committed rows, with their own device, commit and date) — for every
figure's title. ``device``: ``"auto"`` (cuda when torch sees a GPU), ``"cpu"`` (the recorded tables) or
``"cuda"``. The runners are :mod:`m3lab.bench.gemm`, :mod:`m3lab.bench.moe` and :mod:`m3lab.bench.sparse_attn`
(called, never copied); the recorded tables are read by m3lab/bench_analysis/{gemm,moe,sparse}.py. The runners,
torch and the kernels are imported only when a measurement runs or a table is read (heavy, and the CPU gates of
notebook 05 need the Triton interpreter switched on before the kernels' first import).
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from m3lab.bench.table import append_rows, rows_frame
from m3lab.errors import M3LabError
from m3lab.optable.kernel_shapes import moe_problem
from m3lab.provenance import commit
from m3lab.vllm_src.imports import m3_module

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda`` without a GPU is an error."""
    if device not in DEVICES:
        raise M3LabError(f"device {device!r} is not one of {', '.join(DEVICES)}", field="device",
                         hint="auto measures live when a GPU is visible and shows the recorded tables otherwise")
    if device == "cpu":
        return "cpu"
    import torch  # heavy: only when a GPU may be asked for
    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise M3LabError("device cuda: torch sees no GPU", field="device", hint="use device=auto or device=cpu")
    return "cpu"


@dataclass(frozen=True)
class Source:
    """Where a table's numbers come from: ``live`` (device, commit) or recorded (device, (commit, date) runs)."""

    live: bool
    device: str
    runs: tuple[tuple[str, str], ...]   # (commit, date) of the rows, in the table's order

    @property
    def label(self) -> str:
        """``measured live on NVIDIA H200, commit abc1234`` / ``recorded: measured on NVIDIA_H200, commit 14782d0,
        2026-11-28`` (every run the rows come from)."""
        if self.live:
            return f"measured live on {self.device}, commit {self.runs[0][0]}"
        return f"recorded: measured on {self.device}, " + "; ".join(f"commit {c}, {d}" for c, d in self.runs)

    @classmethod
    def here(cls, device: str) -> Source:
        """Measured live now, on ``device``, at this checkout's commit."""
        import datetime
        return cls(True, device, ((checkout_commit(), datetime.date.today().isoformat()),))

    @classmethod
    def of(cls, table: pd.DataFrame, live: bool) -> Source:
        if not len(table):
            return cls(live, "no device", (("none", "no rows"),))
        device = ", ".join(dict.fromkeys(table["device"].astype(str)))
        runs = tuple(dict.fromkeys(zip(table["commit"].astype(str), table["date"].astype(str))))
        if live and runs[0][0] == "unknown":
            runs = ((checkout_commit(), runs[0][1]),)
        return cls(live, device, runs)


def checkout_commit() -> str:
    """The commit of the m3lab checkout that is running (``unknown`` outside a git checkout; benchmark rows
    take ``$GIT_COMMIT`` first)."""
    return commit()


def _progress(line: str) -> None:
    print(line, flush=True)


def gemm(device: str = "auto", ms=(1, 8, 32, 64, 128, 2048), formats=("bf16", "mxfp8", "mxfp4"), shapes=None,
         path=None) -> tuple[pd.DataFrame, Source]:
    """The GEMM benchmark (:func:`m3lab.bench.gemm.bench_gemm`) at ``ms`` x ``formats`` x ``shapes`` ((N, K);
    None: the M3 TP4 set) on a GPU, else the committed table's last run
    (:func:`m3lab.bench_analysis.gemm.gemm_table`)."""
    if resolve_device(device) == "cpu":
        from m3lab.bench_analysis.gemm import gemm_table  # local: pulls in torch
        table = gemm_table(path)
        return table, Source.of(table, live=False)
    import torch

    from m3lab.bench.ceilings import measure_ceilings  # local: pulls in torch
    from m3lab.bench.gemm import bench_gemm  # local: pulls in torch, triton
    rows = bench_gemm(shapes=None if shapes is None else tuple(tuple(s) for s in shapes), ms=tuple(ms),
                      w_formats=tuple(formats), ceilings=measure_ceilings(torch.device("cuda")), log=_progress)
    table = rows_frame(rows)
    return table, Source.of(table, live=True)


def moe(device: str = "auto", ts=(1, 8, 32, 128, 512, 2048, 8192), routings=("balanced", "zipf"), providers=None,
        path=None) -> tuple[pd.DataFrame, Source]:
    """The grouped-MoE benchmark (:func:`m3lab.bench.moe.bench`, every provider unless ``providers``) at ``ts``
    x ``routings`` on a GPU, else the recorded table (:func:`m3lab.bench_analysis.moe.moe_table`)."""
    from m3lab.bench_analysis.moe import moe_table  # local: pulls in torch, triton
    if resolve_device(device) == "cpu":
        table = moe_table(path)
        return table, Source.of(table, live=False)
    import torch

    from m3lab.bench import moe as bench_moe  # local: pulls in torch, triton
    from m3lab.bench.ceilings import measure_ceilings  # local: pulls in torch
    rows = bench_moe.bench(list(providers or bench_moe.PROVIDERS), tuple(ts), tuple(routings),
                           ceilings=measure_ceilings(torch.device("cuda")), log=_progress)
    with tempfile.TemporaryDirectory() as tmp:   # read back as the recorded table is: T and routing parsed
        table = moe_table(append_rows(Path(tmp) / "moe.csv", rows))
    return table, Source.of(table, live=True)


def sparse(device: str = "auto", batches=(1, 32, 128), contexts=(8192, 65536), q_rows=(1, 4), prefill: bool = True,
           deadline_s: float = 600.0, path=None) -> tuple[pd.DataFrame, Source]:
    """The sparse-attention and indexer benchmark (:func:`m3lab.bench.sparse_attn.run`) at ``batches`` x
    ``contexts`` x ``q_rows`` (+ the prefill chunks) on a GPU, else the recorded table
    (:func:`m3lab.bench_analysis.sparse.recorded_table`). Live runs need vLLM's kernels (its peer)."""
    from m3lab.bench_analysis.sparse import recorded_table  # local: pulls in torch, triton
    if resolve_device(device) == "cpu":
        table = recorded_table(path)
        return table, Source.of(table, live=False)
    from m3lab.bench import sparse_attn as sa  # local: pulls in torch, triton
    m3_module("common.ops.sparse_attn", "live sparse-attention measurements (vLLM's kernels are the peer)")
    with tempfile.TemporaryDirectory() as tmp:   # the runner prints its progress and writes its table here
        csv = sa.run(out=tmp, batches=tuple(batches), contexts=tuple(contexts), q_rows=tuple(q_rows),
                     deadline_s=deadline_s, prefill=prefill)
        if not csv.is_file():
            raise M3LabError(f"no sparse-attention point finished within deadline_s={deadline_s}", field="deadline_s")
        table = recorded_table(csv)
    return table, Source.of(table, live=True)


def tuned_moe_table(device_name: str = "NVIDIA_H200", experts: int | None = None, n: int | None = None) -> pd.DataFrame:
    """The tuned grouped-MoE launch table in vLLM's format (``kernels/moe/configs``) as rows: T and its config.
    ``experts`` (incl. the fused shared one), ``n`` (intermediate width per rank): default one TP4 rank of M3."""
    from m3lab.kernels.moe import tables  # local: pulls in torch
    m3 = moe_problem("minimax-m3", tp=4)
    experts, n = experts or m3.routed + m3.shared, n or m3.inter
    table = tables.load_table(tables.CONFIG_DIR / tables.file_name(experts, n, device_name))
    return pd.DataFrame([{"T": t, **cfg.to_dict()} for t, cfg in sorted(table.items())])
