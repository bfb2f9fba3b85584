"""Dispatcher with declared fast paths (checklist step 4).

Submodules: ``fastpath`` (declarations), ``registry`` (the M3 fast paths, kernel attachment),
``repo_kernels`` (the indexer and top-k fast paths on this repo's kernels),
``dispatcher`` (choosing and recording). Traces of the model running through it are captured by
:mod:`m3lab.capture`.

Public API: :class:`Dispatcher` (``call(op, layer, kind, ref, tensors, attrs, params)``),
:class:`FastPath`, :class:`Condition`, :class:`CallContext`, :class:`FastPathRegistry`,
:func:`m3_registry` (the M3 declarations), :func:`attach_repo_kernels`, :class:`TraceWriter` (the
writer protocol; records are also kept in ``Dispatcher.records``), :func:`dtype_name`, :func:`plan_dict`.
"""
from m3lab.dispatch.dispatcher import FALLBACK, Dispatcher, TraceWriter, dtype_name, plan_dict
from m3lab.dispatch.fastpath import CallContext, Condition, FastPath
from m3lab.dispatch.registry import FastPathRegistry, attach_repo_kernels, m3_registry

__all__ = ["Dispatcher", "TraceWriter", "FALLBACK", "dtype_name", "plan_dict", "CallContext", "Condition",
           "FastPath", "FastPathRegistry", "attach_repo_kernels", "m3_registry"]
