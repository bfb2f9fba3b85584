"""Fast-path expectations: a small YAML of what should run, checked by :mod:`m3lab.traces.verify`.

YAML (shipped examples in m3lab/traces/expectations/; keys besides ``id`` are optional)::

    name: minimax_m3_tp4
    description: MiniMax M3, TP4, MXFP8 on MI355X
    expectations:
      - id: sparse_attention_paged
        description: sparse attention at TP4 (one KV head per rank) runs the paged sparse kernel
        op: attention                 # regex, full match on the dispatch record's op
        layers: "3-"                  # "3-", "0-2", "5", or a list of ints
        where: "q[0] <= 64"           # expression selecting records (see below)
        path: "sparse_paged.*"        # accepted path(s): regex or list of regexes, full match
        require: "w[0] == 129"        # expression every selected record must satisfy
        kernels: ["sparse.*paged"]    # regexes (search) that must match a launched kernel name
        absent_ops: [shared_gate_up]  # ops that must not appear at all in a dispatch trace
        absent_kernels: ["shared_mlp"]  # kernel names that must not appear in a kernel trace
        min_share: 0.05               # minimum kernel-time share of the matched kernels
        optional: false               # true: no matching call -> "skipped" instead of a failure

Expressions are Python syntax evaluated by ``simpleeval`` (:class:`m3lab.traces.predicates.Expression`):
literals, names, ``[]``, arithmetic, comparisons, ``and/or/not``, ``in`` and ``len/min/max/sum/prod``.
Names: every shape of the record (its dims list: ``x[0]``), ``shapes`` (dict: ``'blocks' in shapes``), ``op``,
``layer``, ``path``, ``kernels``, ``device``, ``dtypes`` (dict), and from the trace header ``plan`` (dict) and
``model``. A name the record lacks makes the record not match; any other failure is an error naming the
expectation. Expectations built in code give ``where``/``require`` as typed predicates
(:mod:`m3lab.traces.predicates`) instead of text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from m3lab.errors import M3LabError
from m3lab.traces.predicates import Expression, Predicate

_FIELDS = ("id", "description", "op", "layers", "where", "path", "require", "kernels", "absent_ops",
           "absent_kernels", "min_share", "optional")

def parse_layers(spec: Any, where: str) -> tuple[int | None, int | None, frozenset[int] | None]:
    """``"3-"`` -> (3, None, None); ``"0-2"`` -> (0, 2, None); ``[1, 5]`` -> (None, None, {1, 5})."""
    if spec is None:
        return None, None, None
    if isinstance(spec, int):
        return spec, spec, None
    if isinstance(spec, list) and all(isinstance(v, int) for v in spec):
        return None, None, frozenset(spec)
    m = re.fullmatch(r"\s*(\d*)\s*(-?)\s*(\d*)\s*", str(spec))
    if not m or not (m.group(1) or m.group(3)):
        raise M3LabError(f"{where}: layers {spec!r} is not a range", field="layers",
                         hint='write "3-", "0-2", "5" or a list of ints')
    lo = int(m.group(1)) if m.group(1) else None
    hi = int(m.group(3)) if m.group(3) else (lo if not m.group(2) else None)
    return lo, hi, None


def _regexes(value: Any, where: str) -> tuple[re.Pattern, ...]:
    items = [] if value is None else [value] if isinstance(value, str) else list(value)
    try:
        return tuple(re.compile(str(v)) for v in items)
    except re.error as err:
        raise M3LabError(f"{where}: bad regex ({err})", field=where) from None


def _condition(value: Any, where: str) -> Predicate | None:
    """A typed predicate as given (built in code), text as an :class:`Expression` (YAML), None when empty."""
    if value is None or value == "":
        return None
    return value if callable(value) and hasattr(value, "text") else Expression(value, where)


@dataclass(frozen=True)
class Expectation:
    """One expectation; see the module docstring for the meaning of each field."""
    id: str
    description: str = ""
    op: re.Pattern | None = None
    layers: tuple[int | None, int | None, frozenset[int] | None] = (None, None, None)
    where: Predicate | None = None
    path: tuple[re.Pattern, ...] = ()
    require: Predicate | None = None
    kernels: tuple[re.Pattern, ...] = ()
    absent_ops: tuple[re.Pattern, ...] = ()
    absent_kernels: tuple[re.Pattern, ...] = ()
    min_share: float | None = None
    optional: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "expectation") -> "Expectation":
        if not isinstance(d, dict) or not d.get("id"):
            raise M3LabError(f"{where}: each expectation needs an id", field="id")
        where = f"{where} {d['id']!r}"
        unknown = sorted(set(d) - set(_FIELDS))
        if unknown:
            raise M3LabError(f"{where}: unknown key(s) {', '.join(unknown)}", field=unknown[0],
                             hint="allowed: " + ", ".join(_FIELDS))
        ops = _regexes(d.get("op"), f"{where} op")
        exp = cls(id=str(d["id"]), description=str(d.get("description", "")),
                  op=ops[0] if ops else None, layers=parse_layers(d.get("layers"), where),
                  where=_condition(d.get("where"), f"{where} where"),
                  path=_regexes(d.get("path"), f"{where} path"),
                  require=_condition(d.get("require"), f"{where} require"),
                  kernels=_regexes(d.get("kernels"), f"{where} kernels"),
                  absent_ops=_regexes(d.get("absent_ops"), f"{where} absent_ops"),
                  absent_kernels=_regexes(d.get("absent_kernels"), f"{where} absent_kernels"),
                  min_share=float(d["min_share"]) if d.get("min_share") is not None else None,
                  optional=bool(d.get("optional", False)))
        if not (exp.op or exp.absent_ops or exp.kernels or exp.absent_kernels):
            raise M3LabError(f"{where}: says nothing to check", field="op",
                             hint="give op (+ path/require), absent_ops, kernels or absent_kernels")
        return exp

    @property
    def checks_dispatch(self) -> bool:
        """True when a dispatch trace can check it (it names ops)."""
        return self.op is not None or bool(self.absent_ops)

    @property
    def checks_kernels(self) -> bool:
        """True when a kernel trace can check it (it names kernels)."""
        return bool(self.kernels or self.absent_kernels)

    def layer_ok(self, layer: int) -> bool:
        lo, hi, exact = self.layers
        if exact is not None:
            return layer in exact
        return (lo is None or layer >= lo) and (hi is None or layer <= hi)

    def describe_layers(self) -> str:
        """`` (layers 3-)``, `` (layers [1, 5])`` or ``""`` when all layers are selected."""
        lo, hi, exact = self.layers
        if exact is not None:
            return f" (layers {sorted(exact)})"
        if lo is None and hi is None:
            return ""
        return f" (layers {'' if lo is None else lo}-{'' if hi is None else hi})"

    def describe_selection(self) -> str:
        """``attention (layers 3-) where q[0] <= 64``, for messages."""
        text = (self.op.pattern if self.op else "any op") + self.describe_layers()
        if self.where:
            text += f" where {self.where.text}"
        return text


@dataclass(frozen=True)
class Expectations:
    """A named list of expectations loaded from YAML."""
    name: str
    items: tuple[Expectation, ...]
    description: str = ""
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Any, source: str = "<dict>") -> "Expectations":
        if not isinstance(d, dict) or not isinstance(d.get("expectations"), list) or not d["expectations"]:
            raise M3LabError(f"{source}: needs a non-empty 'expectations' list", field="expectations",
                             hint="see m3lab/traces/expectations/minimax_m3_tp4.yaml")
        items = tuple(Expectation.from_dict(e, f"{source}: expectation {i}")
                      for i, e in enumerate(d["expectations"]))
        ids = [e.id for e in items]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise M3LabError(f"{source}: duplicate expectation id(s) {', '.join(dup)}", field="id")
        meta = {k: v for k, v in d.items() if k not in ("name", "description", "expectations")}
        return cls(name=str(d.get("name", Path(source).stem)), items=items,
                   description=str(d.get("description", "")), source=source, meta=meta)

    @classmethod
    def load(cls, path_or_name: str | Path) -> "Expectations":
        """Load a YAML file or a shipped set by name (``"minimax_m3_tp4"``; see :func:`list_shipped`). The sets the
        fast-path resolver generates for a serving preset: ``m3lab.vllm.fastpath_expectations.load_expectations``.

        >>> exp = Expectations.load("minimax_m3_tp4")
        >>> [e.id for e in exp.items]
        """
        path = Path(path_or_name)
        if not path.is_file():
            shipped = _shipped_dir() / f"{path_or_name}.yaml"
            if not shipped.is_file():
                raise M3LabError(f"expectations {path_or_name!r} not found", field="--expect",
                                 hint="give a YAML path, preset:<serving preset> (m3lab trace verify) or one of: " + ", ".join(list_shipped()))
            path = shipped
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            raise M3LabError(f"{path}: invalid YAML ({str(err).splitlines()[0]})", field="--expect") from None
        return cls.from_dict(doc, str(path))


def _shipped_dir() -> Path:
    return Path(str(resources.files("m3lab.traces") / "expectations"))


def list_shipped() -> list[str]:
    """Names of the expectation sets shipped in m3lab/traces/expectations/."""
    return sorted(p.stem for p in _shipped_dir().glob("*.yaml"))
