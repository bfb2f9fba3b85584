"""Integer arithmetic that several floors need: :func:`ceil_div`."""
from __future__ import annotations


def ceil_div(a, b):
    """``ceil(a / b)`` exactly, for ints and integer numpy arrays alike (no float rounding): blocks for tokens,
    tiles for columns. ``b`` must be positive."""
    return -(-a // b)
