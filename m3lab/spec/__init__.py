"""Model, hardware, parallel plan and quantisation as data (the inputs of every analysis).

- :mod:`m3lab.spec.model`: :class:`ModelSpec`, ``load_model``, ``list_models``
- :mod:`m3lab.spec.hardware`: :class:`Hardware`, ``load_hardware``
- :mod:`m3lab.spec.plan`: :class:`ParallelPlan` (TP/EP/DP/role) and local sizes
- :mod:`m3lab.spec.quant`: :class:`QuantScheme`, ``load_quant``
- :mod:`m3lab.spec.memory`: parameter counts, weight bytes per GPU, KV bytes per token
- :mod:`m3lab.spec.vllm_config`: MiniMax M3 configs parsed through vLLM's own config class (needs vLLM)
"""
from m3lab.spec.hardware import Hardware, list_hardware, load_hardware
from m3lab.spec.model import ModelSpec, list_models, load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.quant import QuantScheme, load_quant

__all__ = ["Hardware", "ModelSpec", "ParallelPlan", "QuantScheme", "list_hardware", "list_models",
           "load_hardware", "load_model", "load_quant"]
