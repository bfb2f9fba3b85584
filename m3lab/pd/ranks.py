"""Which rank holds which KV head, and which prefill rank each decode rank reads a head from.

Heads per rank follow vLLM (``vllm/model_executor/layers/linear.py``, ``QKVParallelLinear``): with ``tp <= heads_kv`` rank r holds heads
``[r * heads_kv / tp, (r + 1) * heads_kv / tp)``; with ``tp > heads_kv`` each head is replicated on
``tp / heads_kv`` ranks and rank r holds head ``r * heads_kv // tp``.

The source of a head is chosen as vLLM's NIXL connector chooses it
(``vllm/distributed/kv_transfer/kv_connector/v1/nixl/tp_mapping.py:96-127``): when the decode TP is at least
the prefill TP, decode rank r reads from prefill rank ``r * tp_p // tp_d``; otherwise it reads each of its
heads from the first prefill rank holding it (replicas are not read twice).
"""
from __future__ import annotations

from m3lab.errors import M3LabError


def heads_of_rank(rank: int, tp: int, heads_kv: int) -> tuple[int, ...]:
    """Global KV head ids held by ``rank`` of a TP group."""
    if tp <= heads_kv:
        per = heads_kv // tp
        return tuple(range(rank * per, (rank + 1) * per))
    return (rank * heads_kv // tp,)


def ranks_holding(head: int, tp: int, heads_kv: int) -> tuple[int, ...]:
    return tuple(r for r in range(tp) if head in heads_of_rank(r, tp, heads_kv))


def check_tp(tp: int, heads_kv: int, field: str) -> int:
    if not isinstance(tp, int) or tp < 1 or (tp <= heads_kv and heads_kv % tp) or (tp > heads_kv and tp % heads_kv):
        raise M3LabError(f"{field}={tp!r} and the {heads_kv} KV heads must divide one another", field=field,
                         hint="use a power of two such as 1, 2, 4, 8")
    return tp


def source_rank(dst_rank: int, head: int, tp_p: int, tp_d: int, heads_kv: int) -> int:
    """The prefill rank that decode rank ``dst_rank`` reads ``head`` from."""
    if tp_d >= tp_p:
        src = dst_rank * tp_p // tp_d
        if head in heads_of_rank(src, tp_p, heads_kv):
            return src
    return ranks_holding(head, tp_p, heads_kv)[0]


def rank_pairs(tp_p: int, tp_d: int, heads_kv: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """``[(src_rank, dst_rank, heads)]``: every (prefill rank, decode rank) pair that exchanges KV heads."""
    out: dict[tuple[int, int], list[int]] = {}
    for d in range(tp_d):
        for h in heads_of_rank(d, tp_d, heads_kv):
            out.setdefault((source_rank(d, h, tp_p, tp_d, heads_kv), d), []).append(h)
    return [(s, d, tuple(hs)) for (s, d), hs in sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
