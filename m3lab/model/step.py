"""Engine-step metadata: which sequences advance by how many tokens, at which positions."""
from dataclasses import dataclass

import torch

from m3lab.model.kv_cache import PagedKVCache


@dataclass
class StepMeta:
    """One engine step over R requests (prefill chunks and decodes, tokens concatenated).

    seqs, starts, counts: per request id, first new position, new tokens; positions [T] int64;
    cu_q [R+1] (query offsets); ctx[r] = starts[r] + counts[r] (keys visible to the last token).
    """

    seqs: list[int]
    starts: list[int]
    counts: list[int]
    positions: torch.Tensor
    slots: torch.Tensor

    @property
    def tokens(self) -> int:
        """T, the new tokens of the step."""
        return sum(self.counts)

    @property
    def ctx(self) -> list[int]:
        """Context length per request after this step's tokens are written."""
        return [s + n for s, n in zip(self.starts, self.counts)]

    @property
    def cu_q(self) -> list[int]:
        """Query offsets [R+1]."""
        out = [0]
        for n in self.counts:
            out.append(out[-1] + n)
        return out

    def tensors(self, cache: PagedKVCache, device) -> dict[str, torch.Tensor]:
        """Varlen metadata as tensors (for kernels and trace shapes): block_tables [R, max_blocks], seq_lens [R], cu_seqlens_q [R+1]."""
        tables = [cache.tables[s] for s in self.seqs]
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        return {"block_tables": torch.tensor(padded, dtype=torch.int32, device=device),
                "seq_lens": torch.tensor(self.ctx, dtype=torch.int32, device=device),
                "cu_seqlens_q": torch.tensor(self.cu_q, dtype=torch.int32, device=device)}


def plan_step(cache: PagedKVCache, requests: list[tuple[int, int]], device) -> StepMeta:
    """Reserve cache space for ``requests`` = [(seq id, new tokens)] and build the step metadata."""
    seqs, starts, counts, pos, slots = [], [], [], [], []
    for seq, n in requests:
        start = cache.append(seq, n)
        seqs.append(seq)
        starts.append(start)
        counts.append(n)
        pos.append(torch.arange(start, start + n))
        slots.append(cache.slots(seq, start, n))
    return StepMeta(seqs, starts, counts, torch.cat(pos).to(device), torch.cat(slots).to(device))
