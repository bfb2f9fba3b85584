"""The installed vLLM, reached from the ground floor: which version m3lab reads and how it imports it.

- :mod:`m3lab.vllm_src.install`: which vLLM m3lab needs, whether it is installed, and the one-line install
  command a feature prints (once) when it is missing or too old (``cpu_requirements.txt`` beside it pins what
  vLLM's Python files need on a CPU box).
- :mod:`m3lab.vllm_src.imports`: importing vLLM's M3 code and kernels on a CPU box or a GPU box without its
  compiled extensions (the environment settings and the two import shims, applied before the first import).

Both import only ``m3lab.errors``, so every floor (``m3lab.spec`` included) may use them; what decides or
runs through vLLM lives in :mod:`m3lab.vllm`.
"""
