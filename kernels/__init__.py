"""Triton kernels, one folder per op (installed as ``m3lab.kernels``).

Each folder holds ``reference.py`` (plain torch, the ground truth), the Triton kernel(s),
``configs/`` (tuned launch tables) and a README. Kernels are leaves: they import torch and
triton, never the rest of m3lab. Launchers launch through :func:`kernels.launches.launch`, so a caller
(the dispatcher) can record which kernel ran.
"""
