"""Citations of vLLM's source: the function that decides something and the line that states it.

A :class:`Cite` names a file below the installed ``vllm`` package, a function (qualified name) in it and a
``needle``, a piece of text on the deciding line inside that function. :meth:`Cite.locate` finds the line by
reading the installed source (nothing is imported), so ``str(cite)`` is always the current ``file:line``;
when vLLM moves or rewrites the code, :meth:`Cite.locate` raises and the tests that check every citation
fail loudly. :class:`Flag` names an environment variable of ``vllm/envs.py`` and its default.
"""
from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from m3lab.errors import M3LabError
from m3lab.vllm_src import install


@lru_cache(maxsize=1)
def vllm_root() -> Path:
    """The installed vllm package directory (found without importing vllm)."""
    install.require("citing vLLM's source")
    spec = importlib.util.find_spec("vllm")
    return Path(list(spec.submodule_search_locations)[0])


@lru_cache(maxsize=128)
def _source(file: str) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """(lines, {qualname: (first line, last line)}) of a vLLM source file."""
    path = vllm_root() / file
    if not path.is_file():
        raise M3LabError(f"vLLM source {file} is missing from the installed vllm", field="vllm",
                         hint="the cited code moved; update m3lab's citation")
    text = path.read_text(encoding="utf-8")
    spans: dict[str, tuple[int, int]] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                spans.setdefault(name, (child.lineno, child.end_lineno or child.lineno))
                walk(child, name + ".")

    walk(ast.parse(text), "")
    return text.splitlines(), spans


@dataclass(frozen=True)
class Cite:
    """``vllm/<file>:<line> <function>``: where vLLM decides; ``needle`` is text on the deciding line."""

    file: str
    function: str
    needle: str = ""

    @property
    def module(self) -> str:
        """The dotted module name (``vllm.models.minimax_m3.common.sparse_attention``)."""
        return "vllm." + self.file.removesuffix(".py").replace("/", ".")

    def locate(self) -> int:
        """The line number of the needle inside the function (the def line without a needle)."""
        lines, spans = _source(self.file)
        if self.function not in spans:
            raise M3LabError(f"vLLM {self.file} has no {self.function}", field="vllm",
                             hint="the cited code moved; update m3lab's citation")
        first, last = spans[self.function]
        if not self.needle:
            return first
        for n in range(first, last + 1):
            if self.needle in lines[n - 1]:
                return n
        raise M3LabError(f"vLLM {self.file}:{self.function} no longer contains {self.needle!r}", field="vllm",
                         hint="the cited decision changed; update m3lab's resolver")

    def __str__(self) -> str:
        return f"vllm/{self.file}:{self.locate()} {self.function}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": f"vllm/{self.file}", "line": self.locate(), "function": self.function,
                "module": self.module}


@dataclass(frozen=True)
class Flag:
    """An environment variable of ``vllm/envs.py`` with the default m3lab assumes."""

    name: str
    default: Any

    def line(self) -> int:
        lines, _ = _source("envs.py")
        hits = [n for n, text in enumerate(lines, 1) if f'"{self.name}": ' in text or f'"{self.name}":' in text]
        if not hits:
            raise M3LabError(f"vllm/envs.py no longer defines {self.name}", field="vllm")
        return hits[0]

    def __str__(self) -> str:
        return f"vllm/envs.py:{self.line()} {self.name}"


def _relative(filename: str) -> str | None:
    """``models/minimax_m3/amd/model.py`` for a file of the installed vllm package (None otherwise)."""
    root = str(vllm_root())
    return filename[len(root) + 1:] if filename.startswith(root + "/") else None


def cite_line(filename: str, qualname: str, lineno: int) -> Cite | None:
    """The citation of one executed line of vLLM (a frame of a call that decided), or None outside vLLM."""
    rel = _relative(filename)
    if rel is None:
        return None
    lines, spans = _source(rel)
    function = qualname.replace(".<locals>", "")
    while function and function not in spans:
        function = function.rpartition(".")[2] if "." in function else ""
    text = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
    return Cite(rel, function, text) if function else None


def cite_of(obj: Any, needle: str = "") -> Cite:
    """The citation of a vLLM function, method or class (its definition, or ``needle``'s line in it)."""
    import inspect
    fn = getattr(obj, "__func__", obj)
    fn = inspect.unwrap(fn) if callable(fn) else fn
    rel = _relative(inspect.getsourcefile(fn) or "")
    if rel is None:
        raise M3LabError(f"{obj!r} is not vLLM code", field="vllm")
    return Cite(rel, fn.__qualname__.replace(".<locals>", ""), needle)
