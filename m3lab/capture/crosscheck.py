"""Cross-check a dispatch trace of the reference model against the OpTable (the analytic model).

:func:`traced_shapes` turns dispatch records into OpTable-like rows, reading the dims from the
tensors that actually ran (``shapes``) and only the context length from the op attributes (on the
meta device the varlen tensors have no values); the MoE experts, one dispatched op (``moe_experts``: w13
[E, 2I, H], w2 [E, H, I], ids [T, k]), are the OpTable's two grouped GEMMs ``moe_gate_up`` and ``moe_down``.
:func:`compare_with_optable` lists every
difference: rows present on one side only, and columns that disagree. Per-expert token counts and
selected blocks depend on values and are not compared.
"""
import math

import pandas as pd

GEMM_KINDS = ("gemm", "router", "lm_head")
COMPARED = {  # kind -> OpTable columns compared
    "gemm": ("m", "n", "k"), "router": ("m", "n", "k"), "lm_head": ("m", "n", "k"),
    "grouped_gemm": ("m", "n", "k", "experts", "topk", "hidden", "inter", "routed_tokens"),
    "attention": ("q_tokens", "ctx_tokens", "heads_q", "heads_kv", "head_dim"),
    "indexer": ("q_tokens", "ctx_tokens", "heads_q", "heads_kv", "head_dim"),
}


def _rows(rec: dict) -> list[dict]:
    kind, s, a = rec["kind"], rec["shapes"], rec.get("attrs", {})
    out = {"layer": rec["layer"], "op": rec["op"], "kind": kind}
    if kind in GEMM_KINDS:
        out.update(m=s["x"][0], k=s["x"][-1], n=s["w"][0])
    elif kind == "moe":
        e, two_i, h = s["w13"]
        t, topk = s["ids"]
        common = dict(layer=rec["layer"], kind="grouped_gemm", m=t * topk, experts=e, topk=topk, routed_tokens=t * topk,
                      hidden=h, inter=two_i // 2)
        return [{**common, "op": "moe_gate_up", "n": two_i, "k": h},
                {**common, "op": "moe_down", "n": h, "k": s["w2"][2]}]
    elif kind == "attention":
        t, hq, d = s["q"]
        out.update(q_tokens=t, heads_q=hq, head_dim=d, heads_kv=s["k_cache"][2], ctx_tokens=a["ctx_tokens"])
    elif kind == "indexer":
        t, hi, d = s["iq"]
        out.update(q_tokens=t, heads_q=hi, head_dim=d, heads_kv=1, ctx_tokens=a["ctx_tokens"])
    else:
        return []
    return [out]


def traced_shapes(records: list[dict]) -> pd.DataFrame:
    """Dispatcher records (``Dispatcher.records``) -> one row per GEMM / grouped GEMM / attention / indexer call."""
    rows = [r for rec in records for r in _rows(rec)]
    return pd.DataFrame(rows)


def compare_with_optable(traced: pd.DataFrame, optable: pd.DataFrame) -> pd.DataFrame:
    """Differences between traced shapes and OpTable rows of the compared kinds.

    Returns columns layer, op, column, traced, optable (empty when they agree); ``column`` is
    "(row)" when an op appears on one side only.
    """
    ot = optable[optable["kind"].isin(list(COMPARED))]
    left = {(int(r["layer"]), r["op"]): r for _, r in traced.iterrows()}
    right = {(int(r["layer"]), r["op"]): r for _, r in ot.iterrows()}
    diffs = []
    for key in sorted(set(left) | set(right)):
        if key not in left or key not in right:
            diffs.append({"layer": key[0], "op": key[1], "column": "(row)",
                          "traced": key in left, "optable": key in right})
            continue
        lt, rt = left[key], right[key]
        for col in COMPARED[rt["kind"]]:
            a, b = lt.get(col), rt.get(col)
            if a is None or b is None or (isinstance(b, float) and math.isnan(b)) or float(a) != float(b):
                diffs.append({"layer": key[0], "op": key[1], "column": col, "traced": a, "optable": b})
    return pd.DataFrame(diffs, columns=["layer", "op", "column", "traced", "optable"])
