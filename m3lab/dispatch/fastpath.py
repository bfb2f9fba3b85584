"""Fast-path declarations: a name, the conditions under which it may run, and the kernels it launches.

A :class:`Condition` is a predicate over a :class:`CallContext` (op, layer, shapes, dtypes, device,
plan, op attributes) with a readable description; when it fails, the recorded reason is the
description plus what was seen (``got ...``). A :class:`FastPath` without an implementation is still
declared: its last condition ("kernel registered") fails, so traces show why it did not run.
"""
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class CallContext:
    """What a predicate may look at for one dispatched call."""

    op: str
    layer: int
    kind: str
    shapes: dict[str, list[int]]
    dtypes: dict[str, str]
    device: str  # "cpu", "cuda", "meta", ...
    plan: dict[str, Any]  # tp, ep, dp, role, fused_shared_expert
    attrs: dict[str, Any]  # op attributes: m/n/k, heads_kv, experts, topk, block_size, sparse, w_format...


@dataclass(frozen=True)
class Condition:
    """One requirement of a fast path: ``check(ctx)`` must be true; ``seen(ctx)`` says what was found."""

    description: str
    check: Callable[[CallContext], bool]
    seen: Callable[[CallContext], str] | None = None

    def failure(self, ctx: CallContext) -> str | None:
        """None when satisfied, else the description and what was seen."""
        try:
            ok = bool(self.check(ctx))
        except (KeyError, TypeError):
            ok = False
        if ok:
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
