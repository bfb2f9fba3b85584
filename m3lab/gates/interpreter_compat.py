"""Triton CPU-interpreter fix needed to run vLLM's page-table builders.

Triton 3.9's interpreter turns ``block_bool & scalar_bool`` into an int32 numpy mask, which its own masked
load/store then reject ("mask has unsupported dtype"). :func:`apply` wraps both to cast the mask to bool. It
does nothing unless ``TRITON_INTERPRET=1`` (compiled kernels never see it) and is idempotent.
"""
import os

import numpy as np


def apply() -> bool:
    """Patch the interpreter's masked load/store; True when the patch is (already) in place."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_m3lab_bool_masks", False):
        return True
    load, store = builder.create_masked_load, builder.create_masked_store

    def as_bool(mask):
        if mask.data.dtype == np.bool_:
            return mask
        return interpreter.TensorHandle(mask.data.astype(np.bool_), mask.dtype)

    def masked_load(self, ptrs, mask, other, *args, **kwargs):
        return load(self, ptrs, as_bool(mask), other, *args, **kwargs)

    def masked_store(self, ptrs, value, mask, *args, **kwargs):
        return store(self, ptrs, value, as_bool(mask), *args, **kwargs)

    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    builder._m3lab_bool_masks = True
    return True
