"""Which kernels a call launched, as the launchers report them.

A launcher calls :func:`record` with each kernel it launches (``launch`` does both); a caller that wants
to know what ran, such as the dispatcher, wraps the call in :func:`recording`::

    with recording() as launched:
        y = linear(x, w, w_format="mxfp8", w_scale=s)
    launched  # ['gemm_splitk_kernel']

Outside :func:`recording` nothing is kept. Every op folder's launcher (gemm, mx, moe, sparse attention)
reports through this module, so a dispatch record names the kernel the launcher chose.
"""
import contextvars
from contextlib import contextmanager

_LAUNCHED: contextvars.ContextVar = contextvars.ContextVar("launched_kernels", default=None)


def kernel_name(kernel) -> str:
    """The Python name of a Triton kernel (``@triton.jit`` function, interpreted or compiled) or a callable."""
    fn = getattr(kernel, "fn", kernel)
    return getattr(fn, "__name__", None) or type(kernel).__name__


def record(kernel) -> None:
    """Note that ``kernel`` (a Triton kernel, a callable or a name) was launched."""
    log = _LAUNCHED.get()
    if log is not None:
        log.append(kernel if isinstance(kernel, str) else kernel_name(kernel))


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``, recorded."""
    record(kernel)
    return kernel[grid](*args, **kwargs)


@contextmanager
def recording():
    """Collect the names of the kernels launched inside the block (in launch order) into the yielded list."""
    log: list[str] = []
    token = _LAUNCHED.set(log)
    try:
        yield log
    finally:
        _LAUNCHED.reset(token)
