"""Prefill/decode disaggregation and speculative verification.

- :mod:`m3lab.pd.regions`: where each KV element lives on a rank, read off the model's own cache layouts;
- :mod:`m3lab.pd.ranks`: KV heads per rank and which prefill rank each decode rank reads;
- :mod:`m3lab.pd.geometry`: transfer descriptors per layer, coalescing, bytes per request, link time;
- :mod:`m3lab.pd.transfer`: the descriptors executed between processes with ``torch.distributed`` and checked;
- :mod:`m3lab.pd.speculation`: one target step over 1 + k draft positions, greedy acceptance, acceptance lengths;
- :mod:`m3lab.pd.collective_time`: all-reduce time from the measured collectives table (the cost model's hook);
- :mod:`m3lab.pd.plots`: the figures of notebook 11.

The serving simulation of a P:D deployment is :func:`m3lab.serving.disagg.pd_estimate`; the collectives
measurement is ``m3lab bench collectives``.

Submodules import torch/pandas; import them directly (this package imports nothing at import time).
"""
