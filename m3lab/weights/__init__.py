"""Weights of the reference M3 decoder: HF safetensors loading (BF16, MXFP8, Quark MXFP4), TP/EP sharding,
random init, and small test checkpoints with the real tensor names.

Public API: :func:`load_weights` (checkpoint -> internal weights + formats for one rank),
:func:`random_weights`, :func:`write_checkpoint` / :func:`random_hf_tensors` (test checkpoints),
:class:`CheckpointReader`, :func:`m3lab.weights.names.hf_shapes`.
"""
from m3lab.weights.checkpoint import CheckpointReader
from m3lab.weights.loader import load_weights
from m3lab.weights.random_init import random_weights
from m3lab.weights.writer import random_hf_tensors, write_checkpoint

__all__ = ["CheckpointReader", "load_weights", "random_weights", "random_hf_tensors", "write_checkpoint"]
