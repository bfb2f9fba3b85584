"""Everything that talks to an installed vLLM (m3lab's source of truth for MiniMax M3).

- :mod:`m3lab.vllm.install`: which vLLM m3lab needs, whether it is installed, and the one-line install command
  a feature prints (once) when it is missing or too old.
- :mod:`m3lab.vllm.imports`: importing vLLM's M3 code and kernels on a CPU box or a GPU box without its
  compiled extensions (the environment settings and the two import shims, applied before the first import).

Nothing here imports vLLM at import time.
"""
