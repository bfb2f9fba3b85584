"""Teaching views of the fast-path resolver (checklist step 4): where deployments take different paths, and why
a path did not run.

- :func:`path_cells`: the resolver's comparison table (``m3lab.vllm.fastpath_views.compare``: one row per
  configuration, op and layer kind) as the cells of an op x deployment grid, each in one discrete category
  (:data:`CATEGORIES`) relative to a reference deployment, keeping only the rows where the deployments differ;
- :func:`condition_diff` and :func:`why_not`: for one op, the conditions of two resolutions side by side (each
  with its value, whether it holds, and the vLLM line that tests it) and the sentence that names the one that
  changed the path. Both read only the decisions' path, kernels, status and checks.
"""
from __future__ import annotations

import pandas as pd

#: The grid's categories, in legend order.
CATEGORIES = ("runs: the reference's path", "runs: another path", "turned off (asked for)", "refused at start-up",
              "not run on this layer kind")
_STATUS = {"off": CATEGORIES[2], "refused": CATEGORIES[3], "skipped": CATEGORIES[4]}


def path_cells(table: pd.DataFrame, reference: str | None = None, only_differing: bool = True) -> pd.DataFrame:
    """``[row, config, path, status, kernels, decided_by, category]`` per grid cell, ``row`` = "op · layer
    kind". A row's reference path is the one ``reference`` (default: the first configuration; where that one
    lacks the row, the first that has it) takes. ``only_differing``: keep only the rows whose cells fall in more
    than one category, or where a path is turned off or refused."""
    t = table.assign(row=table["op"] + " · " + table["layer_kind"]).drop_duplicates(["row", "config"])
    configs = list(dict.fromkeys(t["config"]))
    order = [reference] + [c for c in configs if c != reference] if reference in configs else configs
    rank = t["config"].map({c: i for i, c in enumerate(order)})
    ref_path = t.assign(_r=rank).sort_values("_r").drop_duplicates("row").set_index("row")["path"]
    t = t.assign(category=[_STATUS.get(s) or (CATEGORIES[0] if p == ref_path[r] else CATEGORIES[1])
                           for r, p, s in zip(t["row"], t["path"], t["status"])])
    if only_differing:   # a row stays when its cells differ, or when one is turned off or refused
        keep = t.groupby("row")["category"].agg(lambda c: c.nunique() > 1 or c.isin(CATEGORIES[2:4]).any())
        t = t[t["row"].map(keep)]
    return t[["row", "config", "path", "status", "kernels", "decided_by", "category"]].reset_index(drop=True)


def _decision(resolution, op: str, layer_kind: str):
    for d in resolution.decisions:
        if d.op == op and d.layer_kind in (layer_kind, "model"):
            return d
    raise KeyError(f"no decision for {op!r} on {layer_kind!r} layers")


def condition_diff(expected, actual, op: str, layer_kind: str = "sparse") -> pd.DataFrame:
    """The conditions of ``op``'s decision in two resolutions (``expected``: the path you wanted; ``actual``:
    the one you got): ``[condition, expected_value, expected_holds, actual_value, actual_holds, changed,
    tested_at]``, the conditions that changed first."""
    a, b = _decision(expected, op, layer_kind), _decision(actual, op, layer_kind)
    rows = {c.name: {"condition": c.name, "expected_value": c.value, "expected_holds": c.holds,
                     "tested_at": str(c.cite or "")} for c in a.checks}
    for c in b.checks:
        rows.setdefault(c.name, {"condition": c.name, "tested_at": str(c.cite or "")})
        rows[c.name].update(actual_value=c.value, actual_holds=c.holds)
    out = pd.DataFrame(list(rows.values()), columns=["condition", "expected_value", "expected_holds", "actual_value",
                                                     "actual_holds", "tested_at"])
    out["changed"] = [str(x) != str(y) or h != k for x, y, h, k in zip(
        out["expected_value"], out["actual_value"], out["expected_holds"], out["actual_holds"])]
    return out.sort_values("changed", ascending=False, kind="stable")[
        ["condition", "expected_value", "expected_holds", "actual_value", "actual_holds", "changed", "tested_at"]
    ].reset_index(drop=True)


def why_not(expected, actual, op: str, layer_kind: str = "sparse") -> str:
    """One sentence: which path ran instead of the expected one, the condition(s) that made the difference
    (value now, value expected, where vLLM tests it) and the line that decides."""
    a, b = _decision(expected, op, layer_kind), _decision(actual, op, layer_kind)
    where = f"{op} on {layer_kind} layers" if b.layer_kind != "model" else op
    if (a.path, a.status) == (b.path, b.status):
        return f"{where}: both run {b.path} ({', '.join(b.kernels)})"
    diff = condition_diff(expected, actual, op, layer_kind)
    flipped = diff[diff["changed"] & (diff["expected_holds"] != diff["actual_holds"])]
    changed = flipped if len(flipped) else diff[diff["changed"]]
    reasons = "; ".join(f"{r.condition} is {r.actual_value!r} (the expected path had {r.expected_value!r}), tested at "
                        f"{r.tested_at or 'the resolver'}" for r in changed.itertuples()) or "no condition changed"
    return (f"{where}: {b.path} ({', '.join(b.kernels)}) {b.status} instead of {a.path}, because {reasons}. "
            f"vLLM decides at {b.decided_by}.")
