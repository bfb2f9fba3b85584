"""Check :class:`~m3lab.traces.expectations.Expectations` against traces: expected vs ran, and why.

A dispatch trace answers "which path ran for each call, and which condition stopped the others";
a kernel trace (Kineto, rocprofv3, AITER log) answers "which kernels ran, for how much of the time".
:func:`verify` checks every expectation against every trace that can answer it and returns one row
per (expectation, trace kind): status ``pass`` | ``fail`` | ``missing`` (no matching call; a failure
unless the expectation is optional) | ``skipped`` (no given trace can check it), expected, ran, why
(the failed condition recorded by the dispatcher, or what was missing), calls and time share.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.traces.load import load_trace
from m3lab.traces.table import make_events, short_kernel_name, trace_format
from m3lab.traces.expectations import Expectation, Expectations
from m3lab.traces.predicates import Absent

RESULT_COLUMNS = ("id", "description", "source", "status", "expected", "ran", "why", "calls", "share")
FAILING = ("fail", "missing")


def _counts(values: list[str], limit: int = 4) -> str:
    """``["a", "a", "b"]`` -> ``"a (2 calls), b (1 call)"`` (most common first)."""
    common = Counter(values).most_common()
    text = ", ".join(f"{v} ({n} call{'' if n == 1 else 's'})" for v, n in common[:limit])
    return text + (f", … ({len(common) - limit} more)" if len(common) > limit else "")


def _env(rec: Any, header: dict[str, Any]) -> dict[str, Any]:
    env = {"op": rec.op, "layer": rec.layer, "path": rec.path, "kernels": rec.kernels,
           "device": rec.device, "dtypes": rec.dtypes, "plan": header.get("plan") or {},
           "model": header.get("model"), "shapes": rec.shapes}
    env.update(rec.shapes)
    return env


def _holds(e: Expectation, expr, env: dict[str, Any]) -> bool:
    """Whether ``expr`` holds on a record: False when the record lacks a name it reads (it does not match);
    any other failure is an error that names the expectation (a bad expectation, never a silent False)."""
    try:
        return bool(expr(env))
    except Absent:
        return False
    except M3LabError:
        raise
    except Exception as err:
        raise M3LabError(f"expectation {e.id!r}: {expr.text!r} fails on a {env.get('op')} record of layer "
                         f"{env.get('layer')} ({type(err).__name__}: {err}; {_values(expr, env)})", field=e.id,
                         hint="fix the expression in the expectations") from None


def _values(expr, env: dict[str, Any]) -> str:
    return ", ".join(f"{n}={env[n]}" for n in expr.names if n in env) or "fields absent"


def _share(t_us: list[float], dispatch: pd.DataFrame) -> float:
    """Fraction of the trace's recorded call time spent in these calls (NaN without timings)."""
    total = dispatch["t_us"].sum()
    return float(pd.Series(t_us, dtype=float).sum() / total) if total > 0 else float("nan")


def _select(e: Expectation, dispatch: pd.DataFrame) -> tuple[list[Any], list[dict[str, Any]]]:
    """The records (and their expression environments) of the expectation's op, layers and where."""
    header = dispatch.attrs.get("header", {})
    recs = [r for r in dispatch.itertuples(index=False) if e.op.fullmatch(r.op) and e.layer_ok(r.layer)]
    pairs = [(r, _env(r, header)) for r in recs]
    pairs = [(r, env) for r, env in pairs if e.where is None or _holds(e, e.where, env)]
    return [r for r, _ in pairs], [env for _, env in pairs]


def _path_failure(e: Expectation, recs: list[Any]) -> str | None:
    """Why calls did not take an accepted path: the conditions recorded for it, counted."""
    bad = [r for r in recs if not any(p.fullmatch(r.path) for p in e.path)]
    if not bad:
        return None
    reasons = [f"{item['path']}: {item['condition']}" for r in bad for item in r.rejected
               if any(p.fullmatch(item["path"]) for p in e.path)]
    return _counts(reasons) if reasons else (f"{len(bad)} of {len(recs)} calls ran another path and the "
                                             f"dispatcher recorded no condition for the expected one")


def _check_dispatch(e: Expectation, dispatch: pd.DataFrame) -> dict[str, Any]:
    expected = [e.describe_selection()] if e.op is not None else []
    expected += ["path " + " | ".join(p.pattern for p in e.path)] if e.path else []
    expected += [f"require {e.require.text}"] if e.require else []
    failures: list[str] = []
    ran, calls, share = "", 0, float("nan")
    if e.op is not None:
        recs, envs = _select(e, dispatch)
        calls = len(recs)
        if not recs:
            return {"status": "skipped" if e.optional else "missing", "expected": "; ".join(expected),
                    "ran": "nothing", "why": f"no call of {e.describe_selection()} in the dispatch trace",
                    "calls": 0, "share": share}
        ran, share = _counts([r.path for r in recs]), _share([r.t_us for r in recs], dispatch)
        if e.path and (why := _path_failure(e, recs)):
            failures.append(why)
        bad_env = [env for env in envs if e.require and not _holds(e, e.require, env)]
        if bad_env:
            failures.append(f"require {e.require.text} false on {len(bad_env)} of {calls} calls "
                            f"(first: {_values(e.require, bad_env[0])})")
        took = [r for r in recs if not e.path or any(p.fullmatch(r.path) for p in e.path)]
        for rx in e.kernels if took else ():  # kernels launched by the calls that took the expected path
            if not any(rx.search(k) for r in took for k in r.kernels):
                failures.append(f"no launched kernel matches /{rx.pattern}/ "
                                f"(saw {_counts([k for r in took for k in r.kernels]) or 'none'})")
    if e.absent_ops:
        expected.append("no " + " | ".join(p.pattern for p in e.absent_ops))
        present = [r.op for r in dispatch.itertuples(index=False) if any(p.fullmatch(r.op) for p in e.absent_ops)]
        if present:
            failures.append(f"expected absent but ran: {_counts(present)}")
            ran = "; ".join(x for x in (ran, _counts(present)) if x)
    return {"status": "fail" if failures else "pass", "expected": "; ".join(expected),
            "ran": ran or "none of the absent ops", "why": "; ".join(failures), "calls": calls, "share": share}


_M3_ANNOTATION = re.compile(r"m3lab::(?P<op>[\w.]+)\[L(?P<layer>-?\d+)\]")


def _op_scope(e: Expectation, events: pd.DataFrame) -> pd.Series | None:
    """Rows launched inside the dispatcher's ``m3lab::<op>[L<layer>]`` annotations of the expectation's
    op and layers (a Kineto trace of the reference model), or None when the trace has no such marks."""
    if e.op is None or "annotation" not in events.columns:
        return None
    parts = events["annotation"].astype(str).str.extract(_M3_ANNOTATION)
    if parts["op"].isna().all():
        return None
    layer = pd.to_numeric(parts["layer"], errors="coerce")
    return parts["op"].map(lambda o: isinstance(o, str) and bool(e.op.fullmatch(o))) & \
        layer.map(lambda v: v == v and e.layer_ok(int(v)))


def _searched(names: pd.Series, rx) -> pd.Series:
    """Which names ``rx`` finds (``re.search``, as ``str.contains`` would, without pandas' warning that a
    pattern with groups extracts nothing: an expectation's alternatives are groups, never extracted)."""
    return names.map(lambda n: rx.search(n) is not None).astype(bool)


def _check_kernels(e: Expectation, events: pd.DataFrame) -> dict[str, Any]:
    total = events["dur_us"].sum()
    expected, failures, ran = [], [], []
    scope = _op_scope(e, events)
    if scope is not None:
        expected.append(f"within m3lab::{e.op.pattern}{e.describe_layers()} (from profiler annotations)")
        events = events[scope]
    names = events["name"].astype(str)
    matched = pd.Series(False, index=events.index)
    for rx in e.kernels:
        hit = _searched(names, rx)
        expected.append(f"kernel /{rx.pattern}/")
        if not hit.any():
            failures.append(f"no kernel matches /{rx.pattern}/ among {names.nunique()} distinct kernels")
        else:
            ran.append(_counts([short_kernel_name(n) for n in names[hit]], limit=3))
        matched |= hit
    share = float(events.loc[matched, "dur_us"].sum() / total) if total > 0 and e.kernels else float("nan")
    if e.min_share is not None:
        expected.append(f"share >= {e.min_share:g}")
        if not share >= e.min_share:
            failures.append(f"kernel time share {share:.3g} < {e.min_share:g}")
    for rx in e.absent_kernels:
        expected.append(f"no kernel /{rx.pattern}/")
        hit = _searched(names, rx)
        if hit.any():
            failures.append(f"expected absent but ran: {_counts([short_kernel_name(n) for n in names[hit]], 3)}")
    return {"status": "fail" if failures else "pass", "expected": "; ".join(expected),
            "ran": "; ".join(ran) or "no matching kernel", "why": "; ".join(failures),
            "calls": int(matched.sum()), "share": share}


def aiter_log_events(log: pd.DataFrame) -> pd.DataFrame:
    """AITER-log rows as kernel events (one per chosen kernel, no timing) so kernel regexes apply."""
    rows = [{"name": k, "kind": "kernel", "start_us": float(r.line), "dur_us": float("nan"),
             "cpu_op": r.op, "attribution": "unattributed"}
            for r in log.itertuples(index=False) for k in r.kernels]
    return make_events(rows, fmt="aiter-log-events", source=log.attrs.get("source", ""))


@dataclass
class Verification:
    """The outcome: ``results`` (one row per expectation and trace kind) and ``ok``."""
    results: pd.DataFrame
    ok: bool
    expectations: str = ""
    traces: list[str] = field(default_factory=list)

    @property
    def failed(self) -> pd.DataFrame:
        """The rows whose status is fail or missing."""
        return self.results[self.results["status"].isin(FAILING)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ok, expectations, traces, results (records; NaN share -> None)."""
        records = self.results.astype(object).where(self.results.notna(), None).to_dict("records")
        return {"ok": self.ok, "expectations": self.expectations, "traces": self.traces,
                "results": records}


def _as_table(trace: pd.DataFrame | str | Path) -> pd.DataFrame:
    return trace if isinstance(trace, pd.DataFrame) else load_trace(trace)


def verify(expectations: Expectations | str | Path, *traces: pd.DataFrame | str | Path) -> Verification:
    """Check expectations against one or more traces (tables from :func:`load_trace`, or paths).

    Dispatch traces check op/path/require/absent_ops; kernel traces (Kineto, rocprofv3, AITER log)
    check kernels/absent_kernels/min_share. ``ok`` is False when any row fails or is missing, or when
    nothing could be checked.

    >>> v = verify(Expectations.load("minimax_m3_h200_tp4"),
    ...            "traces/dispatch/m3_tp4_L0-4_h200_14782d0.dispatch.jsonl.gz")
    >>> v.ok, v.results[["id", "status", "ran", "why", "share"]]
    """
    if not isinstance(expectations, Expectations):
        expectations = Expectations.load(expectations)
    if not traces:
        raise M3LabError("verify needs at least one trace", field="TRACE")
    tables = [_as_table(t) for t in traces]
    dispatch = [t for t in tables if trace_format(t) == "m3lab.dispatch"]
    kernels = [aiter_log_events(t) if trace_format(t) == "aiter-log" else t
               for t in tables if trace_format(t) != "m3lab.dispatch"]
    rows = []
    for e in expectations.items:
        checked = False
        if e.checks_dispatch:
            for d in dispatch:
                rows.append({"id": e.id, "description": e.description, "source": "dispatch",
                             **_check_dispatch(e, d)})
                checked = True
        if e.checks_kernels:
            for k in kernels:
                rows.append({"id": e.id, "description": e.description, "source": trace_format(k),
                             **_check_kernels(e, k)})
                checked = True
        if not checked:
            need = "a dispatch trace" if e.checks_dispatch else "a kernel trace"
            rows.append({"id": e.id, "description": e.description, "source": "-", "status": "skipped",
                         "expected": "", "ran": "", "why": f"needs {need}", "calls": 0,
                         "share": float("nan")})
    results = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    n_checked = int((results["status"] != "skipped").sum())
    ok = n_checked > 0 and not results["status"].isin(FAILING).any()
    return Verification(results=results, ok=bool(ok), expectations=expectations.name,
                        traces=[str(t.attrs.get("source", "<table>")) for t in tables])
