"""One engine step: the batch of requests a forward pass serves.

``new_tokens[i]`` tokens of request i are computed in this step (1 for a decode, a chunk for a prefill) and
``context_lens[i]`` is its KV length after the step (past + new). Query positions of request i are
``context_lens[i] - new_tokens[i] ... context_lens[i] - 1``.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

import numpy as np

from m3lab.errors import M3LabError


@dataclass(frozen=True, eq=False)
class EngineStep:
    """A batch: ``new_tokens`` [R] and ``context_lens`` [R] (int64), plus scheduler bookkeeping."""

    new_tokens: np.ndarray
    context_lens: np.ndarray
    req_ids: np.ndarray | None = None
    index: int = 0
    time_s: float = 0.0                   # scheduler clock at step start (0 when no step-time model)
    finished: tuple = field(default=())   # request ids that produced their last token in this step
    first_token: tuple = field(default=())  # request ids that produced their first token in this step
    decode_mask: np.ndarray | None = None  # [R] bool from the scheduler (None: inferred, see is_decode)

    def __post_init__(self):
        n = np.asarray(self.new_tokens, dtype=np.int64).reshape(-1)
        c = np.asarray(self.context_lens, dtype=np.int64).reshape(-1)
        if n.shape != c.shape:
            raise M3LabError("new_tokens and context_lens must have the same length", field="context_lens")
        if (n < 1).any() or (c < n).any():
            raise M3LabError("each request needs new_tokens >= 1 and context_lens >= new_tokens",
                             field="context_lens")
        object.__setattr__(self, "new_tokens", n)
        object.__setattr__(self, "context_lens", c)
        if self.decode_mask is not None:
            d = np.asarray(self.decode_mask, dtype=bool).reshape(-1)
            if d.shape != n.shape:
                raise M3LabError("decode_mask must have one flag per request", field="decode_mask")
            object.__setattr__(self, "decode_mask", d)

    # ---- constructors ----------------------------------------------------------------------------
    @classmethod
    def unchecked(cls, new_tokens: np.ndarray, context_lens: np.ndarray, **kw) -> EngineStep:
        """A step from arrays a scheduler made: int64 [R] with ``new_tokens >= 1`` and ``context_lens >=
        new_tokens``, ``decode_mask`` bool [R] or None (taken as they are, not checked or copied)."""
        step = object.__new__(cls)
        step.__dict__.update(_DEFAULTS, new_tokens=new_tokens, context_lens=context_lens, **kw)
        return step

    @classmethod
    def decode(cls, batch: int, context: int) -> EngineStep:
        """``batch`` decodes, each at KV length ``context`` (after the step)."""
        return cls(np.ones(batch, np.int64), np.full(batch, context, np.int64))

    @classmethod
    def prefill(cls, tokens: int, batch: int = 1, past: int = 0) -> EngineStep:
        """``batch`` prefill chunks of ``tokens`` each, after ``past`` cached tokens."""
        return cls(np.full(batch, tokens, np.int64), np.full(batch, past + tokens, np.int64))

    @classmethod
    def mixed(cls, decodes: int, decode_context: int, prefill_tokens: int, prefill_past: int = 0) -> EngineStep:
        """``decodes`` decodes plus one prefill chunk (the shape of a chunked-prefill step)."""
        n = np.concatenate([np.ones(decodes, np.int64), [prefill_tokens]])
        c = np.concatenate([np.full(decodes, decode_context, np.int64), [prefill_past + prefill_tokens]])
        return cls(n, c)

    # ---- summary ---------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return int(self.new_tokens.sum())

    @property
    def num_reqs(self) -> int:
        return int(self.new_tokens.size)

    @property
    def is_decode(self) -> np.ndarray:
        """[R] bool: a decode. The scheduler's flags when given, else inferred as one new token after a
        non-empty past (a 1-token prefill tail then counts as a decode)."""
        if self.decode_mask is not None:
            return self.decode_mask
        return (self.new_tokens == 1) & (self.context_lens > 1)

    @property
    def num_decodes(self) -> int:
        return int(self.is_decode.sum())

    @property
    def num_prefill_tokens(self) -> int:
        return int(self.new_tokens[~self.is_decode].sum())

    def signature(self) -> tuple:
        """Hashable summary that fixes the step's shapes: (tokens, requests, sorted (new, context) pairs)."""
        order = np.lexsort((self.context_lens, self.new_tokens))
        return (self.num_tokens, self.num_reqs, self.new_tokens[order].tobytes(), self.context_lens[order].tobytes())

    def __repr__(self) -> str:
        return (f"EngineStep(index={self.index}, tokens={self.num_tokens}, reqs={self.num_reqs}, "
                f"decodes={self.num_decodes}, max_ctx={int(self.context_lens.max()) if self.num_reqs else 0})")


_DEFAULTS = {f.name: f.default for f in fields(EngineStep) if f.default is not MISSING}
