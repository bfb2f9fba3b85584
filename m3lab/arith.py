"""Arithmetic that several floors need: :func:`ceil_div`, :func:`finite`."""
from __future__ import annotations

import numpy as np


def ceil_div(a, b):
    """``ceil(a / b)`` exactly, for ints and integer numpy arrays alike (no float rounding): blocks for tokens,
    tiles for columns. ``b`` must be positive."""
    return -(-a // b)


def finite(x):
    """``numpy.nan_to_num(x)`` (NaN -> 0, infinities -> the largest finite float), without its cost when every value
    is already finite (then ``x`` itself, as a float array)."""
    x = np.asarray(x, dtype=float)
    return x if np.isfinite(x).all() else np.nan_to_num(x)
