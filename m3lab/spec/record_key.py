"""A stable key for specs: the SHA-256 of their fields as canonical JSON (same fields, same key, in any process).

Caches of anything computed from a deployment key on it (:func:`stable_key`), so every field that can change the
result (a KV dtype, index sharing, a scheduler limit) changes the key, and a name that stays the same cannot
hand back another deployment's result.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any, Mapping


def plain(obj: Any) -> Any:
    """``obj`` as JSON-able data: dataclasses field by field, mappings with sorted string keys, sequences as
    lists, non-finite floats as strings, numpy scalars as Python numbers."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__type__": type(obj).__name__,
                **{f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [plain(x) for x in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(plain(x) for x in obj)
    if hasattr(obj, "item") and callable(obj.item):   # numpy scalar
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return repr(obj)


def stable_key(*objs: Any) -> str:
    """Hex SHA-256 (first 24 digits) of ``objs``' fields; equal for equal fields across processes."""
    text = json.dumps([plain(o) for o in objs], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]
