"""Prefill/decode disaggregation and speculative verification.

- :mod:`m3lab.pd.regions`: where each KV element lives on a rank, read off the model's own cache layouts;
- :mod:`m3lab.pd.ranks`: KV heads per rank and which prefill rank each decode rank reads;
- :mod:`m3lab.pd.geometry`: transfer descriptors per layer, coalescing, bytes per request, link time;
- :mod:`m3lab.pd.transfer`: the descriptors executed between processes with ``torch.distributed`` and checked;
- :mod:`m3lab.pd.speculation`: one target step over 1 + k draft positions, greedy acceptance, acceptance lengths.

Submodules import torch/pandas; import them directly (this package imports nothing at import time).
"""
