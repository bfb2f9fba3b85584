"""What the step generator computes ahead or once (the fake model's draws, chained block keys, a record's rows)
equals the one-at-a-time definitions."""
import random
from dataclasses import replace

import numpy as np
import pytest

from m3lab.workload import chains
from m3lab.workload.requests import FakeOutputs, KeyContents, UniqueContents
from m3lab.workload.scheduler import Scheduler, SchedulerConfig


@pytest.mark.parametrize("p", [0.0, 0.35, 0.8, 0.999, 1.0])
def test_accepted_run_equals_accepted(p):
    rng = random.Random(7)
    for seed in (0, 3, 2**63 + 5):
        out = FakeOutputs(p=p, seed=seed)
        for _ in range(10):
            rid, start, k = rng.randrange(10**7), rng.randrange(10**6), rng.randrange(6)
            run = out.accepted_run(rid, start, 40, k)
            assert run == [out.accepted(rid, start + i, k) for i in range(40)]
            for fewer in range(k):
                assert [min(a, fewer) for a in run] == [out.accepted(rid, start + i, fewer) for i in range(40)]


def _direct(raw: list, n: int, lookahead: int, rid: int) -> list:
    """The chained keys one block at a time (no prefix shared with another request)."""
    return chains.chain(raw, n, lookahead, -1 - rid, [])


@pytest.mark.parametrize("lookahead", [0, 1, 2])
def test_block_keys_share_prefixes_exactly(lookahead):
    rng = random.Random(lookahead)
    system = [rng.randrange(50) for _ in range(6)]
    streams = [system + [rng.randrange(50) for _ in range(60)] for _ in range(4)]
    keys, prompt, out = [], [], []
    for _ in range(60):                       # turns over growing contexts, forks, and unrelated requests
        s = rng.choice(streams)
        n = rng.randrange(0, len(s))
        raw = s[:n] if rng.random() < 0.8 else s[:n // 2] + [rng.randrange(50) for _ in range(n - n // 2)]
        keys.append(raw)
        out.append(rng.randrange(1, 3))
        prompt.append(max(len(raw) * 4 - out[-1] - rng.randrange(6), 1))
    contents = KeyContents(keys, prompt, out, 4)
    for rid in rng.sample(range(60), 60):
        n = (prompt[rid] + out[rid] - lookahead) // 4
        assert contents.block_keys(rid, 4, lookahead) == _direct(keys[rid][:n + 1], n, lookahead, rid)


def test_a_planted_reuse_of_a_longer_prefix_is_caught(monkeypatch):
    """The prefix shared with a neighbour is what is reused: claiming one block more breaks the equality."""
    monkeypatch.setattr(chains, "common_prefix", lambda a, b: min(len(a), len(b)))
    contents = KeyContents([[1, 2, 3, 4], [1, 2, 9, 9]], [16, 16], [1, 1], 4)
    contents.block_keys(0, 4)
    assert contents.block_keys(1, 4) != _direct([1, 2, 9, 9], 4, 0, 1)


@pytest.mark.parametrize("method,asy", [(None, False), ("mtp", False), ("mtp", True), ("ngram", True)])
def test_record_rows_equal_the_dicts(method, asy):
    """The generator's rows give the arrays the record's dicts give (prefill chunks, decodes with drafts,
    recomputes after preemption)."""
    rng = np.random.default_rng(5)
    contents = UniqueContents(rng.integers(20, 300, 40), rng.integers(1, 60, 40))
    cfg = SchedulerConfig(max_num_seqs=12, max_num_batched_tokens=128, block_size=16, num_kv_blocks=90,
                          spec_method=method, spec_tokens=3 if method else 0, async_scheduling=asy)
    recs = Scheduler(cfg, outputs=FakeOutputs(p=0.6, seed=2), collapse=False).records(contents, concurrency=12)
    assert any(r.preempted for r in recs) and all(r.rows is not None for r in recs)
    kinds = set()
    for r in recs:
        ours, dicts = r.arrays(contents.prompt), replace(r, rows=None).arrays(contents.prompt)
        assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(ours, dicts))
        kinds.update(zip(ours[3].tolist(), (ours[1] > 1).tolist()))
    assert kinds >= {(False, True), (True, bool(method))}             # prefill chunks; decodes of 1 + drafts
