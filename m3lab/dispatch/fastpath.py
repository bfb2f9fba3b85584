"""Fast-path declarations: a name, the conditions under which it may run, and the kernels it launches.

A :class:`Condition` is a predicate over a :class:`CallContext` (op, layer, shapes, dtypes, device,
plan, op attributes) with a readable description; when it fails, the recorded reason is the
description plus what was seen (``got ...``). A :class:`FastPath` without an implementation is still
declared: its last condition ("kernel registered") fails, so traces show why it did not run.

The plan and the op attributes are :class:`Fields`: reading a name outside their declared names, or one
the call did not set, raises :class:`MissingField` (a bug in a condition or in the caller, never a
"condition false"); so does building them with an undeclared name.
"""
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Iterator

from m3lab.spec.plan import ParallelPlan

# The op attributes a call may pass (m3lab.model.decoder passes them; conditions read them).
OP_ATTRS = (
    "m", "n", "k", "w_format",                                        # GEMMs (m = rows, routed rows for MoE)
    "experts", "routed_experts", "topk", "hidden", "inter", "routed_tokens",   # MoE grouped GEMMs
    "sparse", "q_tokens", "ctx_tokens", "requests", "heads_q", "heads_kv", "head_dim", "block_size",
    "topk_blocks",                                                    # attention, indexer, top-k
)


class MissingField(KeyError):
    """A condition read a plan field or op attribute that is not declared, or not set for this call."""

    def __str__(self) -> str:
        return str(self.args[0])


class Fields(Mapping):
    """A read-only record of named values whose names are declared up front (see the module docstring)."""

    def __init__(self, what: str, names, values: Mapping[str, Any] | None = None):
        self._what, self._names = what, tuple(names)
        values = dict(values or {})
        unknown = sorted(set(values) - set(self._names))
        if unknown:
            raise MissingField(f"{what}: undeclared name(s) {unknown}; declared: {list(self._names)}")
        self._values = values

    def _check(self, key: str) -> None:
        if key not in self._names:
            raise MissingField(f"{self._what} has no field {key!r}; declared: {list(self._names)}")

    def __getitem__(self, key: str) -> Any:
        self._check(key)
        if key not in self._values:
            raise MissingField(f"{self._what}[{key!r}] is not set for this call (set: {sorted(self._values)})")
        return self._values[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The value, or ``default`` when this call did not set it; an undeclared name raises."""
        self._check(key)
        return self._values.get(key, default)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        return self[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Fields({self._what}, {self._values})"


def op_attrs(values: Mapping[str, Any] | None = None) -> Fields:
    """Op attributes of one call, checked against :data:`OP_ATTRS`."""
    return values if isinstance(values, Fields) else Fields("op attrs", OP_ATTRS, values)


def plan_fields(plan: Any) -> Fields:
    """A plan (a dataclass such as ParallelPlan, or a dict of its fields) as Fields named after the plan's
    fields (a dict: its own keys plus ParallelPlan's)."""
    if isinstance(plan, Fields):
        return plan
    if is_dataclass(plan):
        names = [f.name for f in fields(plan)]
        return Fields("plan", names, {n: getattr(plan, n) for n in names})
    names = list(dict.fromkeys([f.name for f in fields(ParallelPlan)] + list(plan or {})))
    return Fields("plan", names, plan)


@dataclass(frozen=True)
class CallContext:
    """What a predicate may look at for one dispatched call (``plan`` and ``attrs`` become :class:`Fields`)."""

    op: str
    layer: int
    kind: str
    shapes: dict[str, list[int]]
    dtypes: dict[str, str]
    device: str  # "cpu", "cuda", "meta", ...
    plan: Any    # Fields of the ParallelPlan: tp, ep, dp, role, fused_shared_expert, ...
    attrs: Any   # Fields of OP_ATTRS: m/n/k, heads_kv, experts, topk, block_size, sparse, w_format...

    def __post_init__(self):
        object.__setattr__(self, "plan", plan_fields(self.plan))
        object.__setattr__(self, "attrs", op_attrs(self.attrs))


@dataclass(frozen=True)
class Condition:
    """One requirement of a fast path: ``check(ctx)`` must be true; ``seen(ctx)`` says what was found."""

    description: str
    check: Callable[[CallContext], bool]
    seen: Callable[[CallContext], str] | None = None

    def failure(self, ctx: CallContext) -> str | None:
        """None when satisfied, else the description and what was seen. A condition that reads a field the
        call does not have raises :class:`MissingField`: that is a bug, not a failed condition."""
        if self.check(ctx):
            return None
        got = self.seen(ctx) if self.seen else None
        return f"{self.description} (got {got})" if got else self.description


@dataclass
class FastPath:
    """A declared fast path for some ops: conditions are checked in order; the first failure is reported."""

    name: str
    ops: tuple[str, ...]
    conditions: tuple[Condition, ...]
    kernels: tuple[str, ...]
    description: str = ""
    impl: Callable[..., Any] | None = field(default=None, repr=False)

    def applies_to(self, op: str, kind: str) -> bool:
        """Whether this path is a candidate for the op (by op name or op kind)."""
        return op in self.ops or kind in self.ops

    def first_failure(self, ctx: CallContext) -> str | None:
        """The first failing condition's text, or None when the path may run."""
        for cond in self.conditions:
            why = cond.failure(ctx)
            if why:
                return why
        if self.impl is None:
            return f"kernel registered for {self.name} ({', '.join(self.kernels)}): not implemented yet"
        return None
