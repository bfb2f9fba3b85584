"""Everything that talks to an installed vLLM (m3lab's source of truth for MiniMax M3).

- :mod:`m3lab.vllm.fastpaths`: the fast-path resolver (``m3lab fastpaths``): for a deployment
  (``m3lab.spec.serving``) and a step, the path vLLM takes for every op, its kernels, every condition and the
  vLLM line that decided, taken by vLLM's own code on an emulated GPU platform (``emulate``, ``emulate_stubs``,
  ``target_image``; vLLM's model built by ``vllm_build``; the decisions read by ``decide*`` and
  ``attention_step`` with ``recorder``; one worker process per GPU in ``workers``; EMULATION.md beside this
  file); ``fastpath_expectations`` turns the answer into step-4 expectations and the reference model's
  registry answers, ``fastpath_views`` into tables and figures.
- :mod:`m3lab.vllm.reference_kernels`: vLLM's own M3 Triton kernels as the reference model's fast paths.

vLLM itself is reached through :mod:`m3lab.vllm_src`. Nothing here imports vLLM at import time; the resolver
imports it only in its worker processes.
"""
