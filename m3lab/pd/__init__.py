"""Prefill/decode disaggregation: where the KV lives on each rank and how it moves between instances.

- :mod:`m3lab.pd.regions`: where each KV element lives on a rank, read off the model's own cache layouts;
- :mod:`m3lab.pd.ranks`: KV heads per rank and which prefill rank each decode rank reads;
- :mod:`m3lab.pd.geometry`: transfer descriptors per layer, coalescing, bytes per request, link time;
- :mod:`m3lab.pd.transfer`: the descriptors executed between processes with ``torch.distributed`` and checked;

The serving simulation of a P:D deployment is :func:`m3lab.serving.disagg.pd_estimate`; speculative
verification is :mod:`m3lab.serving.speculation`, the figures of notebook 11 :mod:`m3lab.plots.disaggregation`; the
collectives measurement is ``m3lab bench collectives``.

Submodules import torch/pandas; import them directly (this package imports nothing at import time).
"""
