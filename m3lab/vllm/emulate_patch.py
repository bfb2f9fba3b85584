"""Patches that restore on exit, for :mod:`m3lab.vllm.emulate`: attributes, environment variables (with
``vllm.envs``' cache off inside), ``sys.modules`` entries, and a ``vllm.*`` name rebound in every module
that imported it."""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import types
from typing import Any, Iterator, Mapping

_MISSING = object()


def vllm_modules() -> list[types.ModuleType]:
    """The imported ``vllm*`` modules."""
    return [m for n, m in list(sys.modules.items()) if n.startswith("vllm") and isinstance(m, types.ModuleType)]


@contextlib.contextmanager
def patched(obj: Any, **attrs: Any) -> Iterator[None]:
    old = {k: obj.__dict__.get(k, _MISSING) for k in attrs}
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is _MISSING:
                delattr(obj, k)
            else:
                setattr(obj, k, v)


@contextlib.contextmanager
def environment(env: Mapping[str, str | None]) -> Iterator[None]:
    import vllm.envs as envs
    old = {k: os.environ.get(k) for k in env}
    was_cached = envs._is_envs_cache_enabled()
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(v)
    envs.disable_envs_cache()
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if was_cached:
            envs.enable_envs_cache()


@contextlib.contextmanager
def modules(entries: Mapping[str, types.ModuleType]) -> Iterator[None]:
    old = {k: sys.modules.get(k) for k in entries}
    sys.modules.update(entries)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


@contextlib.contextmanager
def rebound(original: Any, replacement: Any) -> Iterator[None]:
    """Bind ``replacement`` wherever a ``vllm.*`` module holds ``original`` under its name."""
    import vllm.engine.arg_utils  # noqa: F401  (binds the name at import)
    name = original.__name__
    replacement = functools.wraps(original)(replacement)
    holders = [m for m in vllm_modules() if m.__dict__.get(name) is original]
    for m in holders:
        m.__dict__[name] = replacement
    try:
        yield
    finally:
        for m in holders:
            m.__dict__[name] = original
