"""Dispatch and profiler traces of the reference model running engine steps (checklist step 4).

This room stands above :mod:`m3lab.model` (it builds and runs the model) and :mod:`m3lab.vllm` (on a GPU it
attaches vLLM's own kernels as fast paths); the dispatcher it records through is :mod:`m3lab.dispatch`.

- :mod:`m3lab.capture.reference`: :func:`capture_dispatch_trace`, a traced model's steps written as a dispatch trace;
- :mod:`m3lab.capture.gpu`: :func:`capture`, timed dispatch + PyTorch profiler traces on a GPU;
- :mod:`m3lab.capture.crosscheck`: traced shapes against the OpTable.
"""
