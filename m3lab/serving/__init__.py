"""Serving estimates on the project's scheduler (``estimate``, ``step_cost``, ``capacity``, ``disagg``) and
readers of ``vllm bench serve`` results (``vllm_bench``)."""
