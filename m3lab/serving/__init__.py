"""Serving estimates on the project's scheduler (``estimate``, ``step_cost``, ``capacity``, ``disagg``), with a
prefix cache and agentic sessions (``cached``, ``cache_capacity``), speculative verification (``speculation``),
readers of ``vllm bench serve`` results (``vllm_bench``) and a real deployment's measurements brought into a run
folder beside the estimate (``collect``)."""
