"""Traces: the m3lab dispatch trace, readers of kernel traces (Kineto, rocprofv3, AITER logs) into
one kernel-events table, summaries, and the fast-path verifier.

Typical use (a notebook or the ``m3lab trace`` CLI)::

    from m3lab.traces import load_trace, summarize, Expectations, verify
    events = load_trace("trace.json.gz")           # format sniffed; DataFrame
    summarize(events)                              # per-kernel time shares
    v = verify(Expectations.load("minimax_m3_tp4"), "dispatch.jsonl.gz")
    v.ok, v.results

Only pandas and PyYAML are imported here (no plotting); figures live in :mod:`m3lab.plots.traces`.
"""
from m3lab.traces.aiter_log import read_aiter_log, summarize_aiter_log
from m3lab.traces.dispatch import (DispatchTraceWriter, read_dispatch_header, read_dispatch_trace,
                                   rejections)
from m3lab.traces.events import summarize, summary_totals
from m3lab.traces.expectations import Expectation, Expectations, list_shipped
from m3lab.traces.kineto import read_kineto
from m3lab.traces.load import load_trace, sniff_format
from m3lab.traces.recorded import recorded_traces
from m3lab.traces.rocprof import read_rocprof_csv, read_rocprof_json
from m3lab.traces.table import COLUMNS, short_kernel_name
from m3lab.traces.verify import Verification, verify

__all__ = ["recorded_traces", "COLUMNS", "DispatchTraceWriter", "Expectation", "Expectations", "Verification", "list_shipped",
           "load_trace", "read_aiter_log", "read_dispatch_header", "read_dispatch_trace", "read_kineto",
           "read_rocprof_csv", "read_rocprof_json", "rejections", "short_kernel_name", "sniff_format",
           "summarize", "summarize_aiter_log", "summary_totals", "verify"]
